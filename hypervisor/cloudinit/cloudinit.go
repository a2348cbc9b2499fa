// Package cloudinit builds cloud-init NoCloud seeds: the meta-data,
// user-data (#cloud-config with one login user and its SSH keys) and
// network-config (version 2, one ethernet per NIC matched by MAC, static
// addresses, default routes and DNS) files, written into an ISO9660 image
// labelled "cidata" with github.com/kdomanski/iso9660 (no genisoimage), and
// read back by ReadISO.
//
// Rendering is a pure function of Seed, so seeds are golden-tested. It
// imports only the standard library, sigs.k8s.io/yaml, the ISO library and
// internal/apierr.
package cloudinit

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/netip"
	"regexp"
	"sort"
	"strings"

	"github.com/corralhq/corral/internal/apierr"
	"github.com/kdomanski/iso9660"
	"sigs.k8s.io/yaml"
)

// Label is the ISO volume label NoCloud looks for.
const Label = "cidata"

// File names inside the seed.
const (
	MetaData      = "meta-data"
	UserData      = "user-data"
	NetworkConfig = "network-config"
)

// Seed is what one VM's first boot is told.
type Seed struct {
	// InstanceID changes when the VM is re-created (cloud-init reruns its
	// per-instance modules when it changes).
	InstanceID string
	Hostname   string
	// User is the login user (sudo without password, locked password);
	// empty keeps the image's default user.
	User    string
	SSHKeys []string
	NICs    []NIC
}

// NIC is one network interface, matched in the guest by MAC.
type NIC struct {
	MAC         string
	Addresses   []netip.Prefix // IPv4 and/or IPv6, host address + prefix length
	Gateway4    netip.Addr
	Gateway6    netip.Addr
	Nameservers []netip.Addr
	Search      []string
}

var hostnameRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$`)
var userRE = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)

// Validate reports the first problem with s (apierr.ErrInvalid).
func (s Seed) Validate() error {
	if s.InstanceID == "" || strings.ContainsAny(s.InstanceID, "\n\r") {
		return apierr.Invalidf("cloud-init: instance id %q", s.InstanceID)
	}
	if len(s.Hostname) > 253 || !hostnameRE.MatchString(s.Hostname) {
		return apierr.Invalidf("cloud-init: hostname %q is not a valid host name", s.Hostname)
	}
	if s.User != "" && !userRE.MatchString(s.User) {
		return apierr.Invalidf("cloud-init: login user %q: want [a-z_][a-z0-9_-]{0,31}", s.User)
	}
	for _, k := range s.SSHKeys {
		if strings.ContainsAny(k, "\n\r") || len(strings.Fields(k)) < 2 {
			return apierr.Invalidf("cloud-init: ssh key %.30q... is not one authorized_keys line", k)
		}
	}
	seen := map[string]bool{}
	for i, n := range s.NICs {
		hw, err := net.ParseMAC(n.MAC)
		if err != nil || len(hw) != 6 {
			return apierr.Invalidf("cloud-init: nic %d: MAC %q", i, n.MAC)
		}
		if seen[hw.String()] {
			return apierr.Invalidf("cloud-init: nic %d: duplicate MAC %s", i, hw)
		}
		seen[hw.String()] = true
		for _, a := range n.Addresses {
			if !a.IsValid() {
				return apierr.Invalidf("cloud-init: nic %d: invalid address", i)
			}
		}
		if n.Gateway4.IsValid() && !n.Gateway4.Is4() {
			return apierr.Invalidf("cloud-init: nic %d: gateway4 %s is not IPv4", i, n.Gateway4)
		}
		if n.Gateway6.IsValid() && !n.Gateway6.Is6() {
			return apierr.Invalidf("cloud-init: nic %d: gateway6 %s is not IPv6", i, n.Gateway6)
		}
		for _, d := range n.Search {
			if !hostnameRE.MatchString(d) {
				return apierr.Invalidf("cloud-init: nic %d: search domain %q", i, d)
			}
		}
	}
	return nil
}

type metaData struct {
	InstanceID    string `json:"instance-id"`
	LocalHostname string `json:"local-hostname"`
}

type user struct {
	Name              string   `json:"name"`
	Groups            []string `json:"groups"`
	Shell             string   `json:"shell"`
	Sudo              string   `json:"sudo"`
	LockPasswd        bool     `json:"lock_passwd"`
	SSHAuthorizedKeys []string `json:"ssh_authorized_keys,omitempty"`
}

type cloudConfig struct {
	Hostname          string   `json:"hostname"`
	FQDN              string   `json:"fqdn,omitempty"`
	PreserveHostname  bool     `json:"preserve_hostname"`
	Users             []any    `json:"users,omitempty"`
	SSHPwauth         bool     `json:"ssh_pwauth"`
	SSHAuthorizedKeys []string `json:"ssh_authorized_keys,omitempty"`
}

type netConfig struct {
	Version   int                 `json:"version"`
	Ethernets map[string]ethernet `json:"ethernets"`
}

type ethernet struct {
	Match       map[string]string `json:"match"`
	SetName     string            `json:"set-name"`
	DHCP4       bool              `json:"dhcp4"`
	DHCP6       bool              `json:"dhcp6"`
	Addresses   []string          `json:"addresses,omitempty"`
	Routes      []route           `json:"routes,omitempty"`
	Nameservers *nameservers      `json:"nameservers,omitempty"`
}

type route struct {
	To  string `json:"to"`
	Via string `json:"via"`
}

type nameservers struct {
	Addresses []string `json:"addresses,omitempty"`
	Search    []string `json:"search,omitempty"`
}

// Files renders the three seed files. It is a pure function of s.
func (s Seed) Files() (map[string][]byte, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	md, err := yaml.Marshal(metaData{InstanceID: s.InstanceID, LocalHostname: shortName(s.Hostname)})
	if err != nil {
		return nil, err
	}
	cc := cloudConfig{Hostname: shortName(s.Hostname)}
	if strings.Contains(s.Hostname, ".") {
		cc.FQDN = s.Hostname
	}
	if s.User != "" {
		cc.Users = []any{user{
			Name: s.User, Groups: []string{"sudo"}, Shell: "/bin/bash",
			Sudo: "ALL=(ALL) NOPASSWD:ALL", LockPasswd: true, SSHAuthorizedKeys: s.SSHKeys,
		}}
	} else {
		cc.SSHAuthorizedKeys = s.SSHKeys
	}
	ud, err := yaml.Marshal(cc)
	if err != nil {
		return nil, err
	}
	nc := netConfig{Version: 2, Ethernets: map[string]ethernet{}}
	for i, n := range s.NICs {
		hw, _ := net.ParseMAC(n.MAC)
		name := fmt.Sprintf("eth%d", i)
		e := ethernet{Match: map[string]string{"macaddress": hw.String()}, SetName: name}
		for _, a := range n.Addresses {
			e.Addresses = append(e.Addresses, a.String())
		}
		if n.Gateway4.IsValid() {
			e.Routes = append(e.Routes, route{To: "0.0.0.0/0", Via: n.Gateway4.String()})
		}
		if n.Gateway6.IsValid() {
			e.Routes = append(e.Routes, route{To: "::/0", Via: n.Gateway6.String()})
		}
		if len(n.Nameservers) > 0 || len(n.Search) > 0 {
			ns := &nameservers{Search: n.Search}
			for _, a := range n.Nameservers {
				ns.Addresses = append(ns.Addresses, a.String())
			}
			e.Nameservers = ns
		}
		if len(n.Addresses) == 0 {
			e.DHCP4 = true
		}
		nc.Ethernets[name] = e
	}
	ncb, err := yaml.Marshal(nc)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{
		MetaData:      md,
		UserData:      append([]byte("#cloud-config\n"), ud...),
		NetworkConfig: ncb,
	}, nil
}

func shortName(h string) string {
	short, _, _ := strings.Cut(h, ".")
	return short
}

// WriteISO renders s and writes the seed ISO (label "cidata") to w.
func (s Seed) WriteISO(w io.Writer) error {
	files, err := s.Files()
	if err != nil {
		return err
	}
	iw, err := iso9660.NewWriter()
	if err != nil {
		return fmt.Errorf("cloud-init: %w", err)
	}
	// Cleanup removes the writer's staging files; the ISO is written
	// (or its error returned) by then, so a leftover temp file is all a
	// failure could leave.
	defer func() { _ = iw.Cleanup() }()
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if err := iw.AddFile(bytes.NewReader(files[n]), n); err != nil {
			return fmt.Errorf("cloud-init: add %s: %w", n, err)
		}
	}
	if err := iw.WriteTo(w, Label); err != nil {
		return fmt.Errorf("cloud-init: write iso: %w", err)
	}
	return nil
}

// ReadISO returns the volume label and the top-level files of an ISO9660
// image (names as Linux isofs shows them: lower case, no ";1" version).
func ReadISO(r io.ReaderAt) (string, map[string][]byte, error) {
	img, err := iso9660.OpenImage(r)
	if err != nil {
		return "", nil, fmt.Errorf("cloud-init: open iso: %w", err)
	}
	label, err := img.Label()
	if err != nil {
		return "", nil, fmt.Errorf("cloud-init: iso label: %w", err)
	}
	root, err := img.RootDir()
	if err != nil {
		return "", nil, fmt.Errorf("cloud-init: iso root: %w", err)
	}
	children, err := root.GetChildren()
	if err != nil {
		return "", nil, fmt.Errorf("cloud-init: iso root: %w", err)
	}
	files := map[string][]byte{}
	for _, c := range children {
		if c.IsDir() {
			continue
		}
		b, err := io.ReadAll(io.LimitReader(c.Reader(), 1<<20))
		if err != nil {
			return "", nil, fmt.Errorf("cloud-init: read %s: %w", c.Name(), err)
		}
		files[strings.ToLower(c.Name())] = b
	}
	return label, files, nil
}
