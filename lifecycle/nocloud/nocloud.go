// Package nocloud renders the cloud-init NoCloud seed of an operating
// system deploy (docs/architecture.md, "Deploying an operating system"):
// meta-data (instance id, host name, SSH keys), user-data (the caller's,
// as given), vendor-data (phone_home to the appliance, nothing else) and
// network-config (version 2: the boot NIC matched by MAC, static).
//
// Every file is rendered by a YAML marshaller from validated values, never
// by pasting user text into YAML; Files is a pure function of Seed, so
// seeds are golden-tested. The agent writes the files into a FAT
// filesystem labelled CIDATA; this package does no I/O. It imports the
// generated API and internal/apierr only, nothing of the lifecycle.
package nocloud

import (
	"bytes"
	"net"
	"net/netip"
	"net/url"
	"regexp"
	"strings"

	"github.com/corralhq/corral/internal/apierr"
	"golang.org/x/crypto/ssh"
	"sigs.k8s.io/yaml"
)

// Limits on what a Seed may carry.
const (
	MaxUserData    = 64 << 10
	MaxSSHKeys     = 64
	maxKeyLen      = 16 << 10
	maxIDLen       = 256
	maxURLLen      = 2048
	maxDNS         = 8
	cloudConfig    = "#cloud-config"
	emptyConfig    = cloudConfig + "\n{}\n"
	phoneHomeTries = 10
)

// Interface is the network-config id of the boot NIC. The OS keeps the
// NIC's own name (cloud-init matches it by MAC and renames nothing), so
// no name such as eth0 is assumed.
const Interface = "boot0"

// Seed is what a deployed operating system's first boot is told.
type Seed struct {
	// InstanceID is unique per deploy: cloud-init reruns its
	// per-instance modules when it changes.
	InstanceID string
	// Hostname is an RFC 1123 host name (a short name or an FQDN).
	Hostname string
	// SSHKeys are authorized_keys lines for the image's default user.
	SSHKeys []string
	// UserData is the caller's user data, written as given (at most
	// MaxUserData; when it starts with "#cloud-config" it must be YAML).
	UserData []byte
	// MAC is the boot NIC's; empty leaves network-config out (cloud-init's
	// fallback, DHCP on the first NIC).
	MAC string
	// Address is the boot NIC's static address and prefix length;
	// invalid: DHCP on that NIC.
	Address netip.Prefix
	// Gateway is the default route's next hop (none when invalid).
	Gateway netip.Addr
	DNS     []netip.Addr
	// PhoneHomeURL is where cloud-init's phone_home posts when the OS has
	// booted; empty leaves phone_home out.
	PhoneHomeURL string
}

var hostnameRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$`)

func hasControl(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return r < ' ' || r == 0x7f })
}

// Validate reports the first problem with s (apierr.ErrInvalid).
func (s Seed) Validate() error {
	if s.InstanceID == "" || len(s.InstanceID) > maxIDLen || hasControl(s.InstanceID) {
		return apierr.Invalidf("cloud-init seed: instance id %.40q: want 1 to %d characters, no newlines", s.InstanceID, maxIDLen)
	}
	if len(s.Hostname) > 253 || !hostnameRE.MatchString(s.Hostname) {
		return apierr.Invalidf("cloud-init seed: hostname %.70q is not an RFC 1123 host name", s.Hostname)
	}
	if len(s.SSHKeys) > MaxSSHKeys {
		return apierr.Invalidf("cloud-init seed: %d SSH keys, at most %d", len(s.SSHKeys), MaxSSHKeys)
	}
	for i, k := range s.SSHKeys {
		if len(k) > maxKeyLen || strings.ContainsAny(k, "\r\n") {
			return apierr.Invalidf("cloud-init seed: SSH key %d is not one authorized_keys line", i+1)
		}
		if _, _, _, rest, err := ssh.ParseAuthorizedKey([]byte(k)); err != nil || len(rest) != 0 {
			return apierr.Invalidf("cloud-init seed: SSH key %d (%.30q...) is not an authorized_keys line", i+1, k)
		}
	}
	if len(s.UserData) > MaxUserData {
		return apierr.Invalidf("cloud-init seed: user data is %d bytes, at most %d", len(s.UserData), MaxUserData)
	}
	if bytes.HasPrefix(s.UserData, []byte(cloudConfig)) {
		var v any
		if err := yaml.Unmarshal(s.UserData, &v); err != nil {
			return apierr.Invalidf("cloud-init seed: user data starts with #cloud-config and is not YAML: %v", err)
		}
		if _, ok := v.(map[string]any); v != nil && !ok {
			return apierr.Invalidf("cloud-init seed: user data starts with #cloud-config and is not a YAML mapping")
		}
	}
	if s.MAC != "" {
		if hw, err := net.ParseMAC(s.MAC); err != nil || len(hw) != 6 {
			return apierr.Invalidf("cloud-init seed: MAC %.40q", s.MAC)
		}
	} else if s.Address.IsValid() || s.Gateway.IsValid() || len(s.DNS) > 0 {
		return apierr.Invalidf("cloud-init seed: an address, gateway or DNS without the NIC's MAC")
	}
	if s.Address.IsValid() && s.Address.Addr().Zone() != "" {
		return apierr.Invalidf("cloud-init seed: address %s has a zone", s.Address)
	}
	if s.Gateway.IsValid() {
		if !s.Address.IsValid() {
			return apierr.Invalidf("cloud-init seed: gateway %s without an address", s.Gateway)
		}
		if s.Gateway.Is4() != s.Address.Addr().Is4() || s.Gateway.Zone() != "" {
			return apierr.Invalidf("cloud-init seed: gateway %s is not of address %s's family", s.Gateway, s.Address)
		}
	}
	if len(s.DNS) > maxDNS {
		return apierr.Invalidf("cloud-init seed: %d DNS servers, at most %d", len(s.DNS), maxDNS)
	}
	for _, d := range s.DNS {
		if !d.IsValid() || d.Zone() != "" {
			return apierr.Invalidf("cloud-init seed: DNS server %q", d)
		}
	}
	if s.PhoneHomeURL != "" {
		u, err := url.Parse(s.PhoneHomeURL)
		if len(s.PhoneHomeURL) > maxURLLen || hasControl(s.PhoneHomeURL) || err != nil ||
			(u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return apierr.Invalidf("cloud-init seed: phone-home URL %.80q: want an http(s) URL without newlines", s.PhoneHomeURL)
		}
	}
	return nil
}

type metaDoc struct {
	InstanceID    string   `json:"instance-id"`
	LocalHostname string   `json:"local-hostname"`
	PublicKeys    []string `json:"public-keys,omitempty"`
}

type vendorDoc struct {
	PhoneHome *phoneHome `json:"phone_home,omitempty"`
}

type phoneHome struct {
	URL   string `json:"url"`
	Post  string `json:"post"`
	Tries int    `json:"tries"`
}

type netConfig struct {
	Version   int                 `json:"version"`
	Ethernets map[string]ethernet `json:"ethernets"`
}

type ethernet struct {
	Match       map[string]string `json:"match"`
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
	Addresses []string `json:"addresses"`
}

// Files renders the seed's four files after Validate. A file a deploy
// does not need is nil (network-config without a MAC); the agent does not
// write nil files. It is a pure function of s.
//
// The default route is written "to: 0.0.0.0/0" (or "::/0"), not "to:
// default": cloud-init's own network-state parser (the ENI, networkd and
// sysconfig renderers Debian and Red Hat images use) accepts "default"
// only since 2025, and refuses the whole network config before that.
func (s Seed) Files() (metaData, userData, vendorData, networkConfig []byte, err error) {
	if err := s.Validate(); err != nil {
		return nil, nil, nil, nil, err
	}
	md, err := yaml.Marshal(metaDoc{InstanceID: s.InstanceID, LocalHostname: s.Hostname, PublicKeys: s.SSHKeys})
	if err != nil {
		return nil, nil, nil, nil, err
	}
	ud := s.UserData
	if len(ud) == 0 {
		ud = []byte(emptyConfig)
	} else {
		ud = bytes.Clone(ud)
	}
	vd := []byte(emptyConfig)
	if s.PhoneHomeURL != "" {
		b, err := yaml.Marshal(vendorDoc{PhoneHome: &phoneHome{URL: s.PhoneHomeURL, Post: "all", Tries: phoneHomeTries}})
		if err != nil {
			return nil, nil, nil, nil, err
		}
		vd = append([]byte(cloudConfig+"\n"), b...)
	}
	var nc []byte
	if s.MAC != "" {
		hw, _ := net.ParseMAC(s.MAC)
		e := ethernet{Match: map[string]string{"macaddress": hw.String()}}
		if s.Address.IsValid() {
			e.Addresses = []string{s.Address.String()}
		} else {
			e.DHCP4 = true
		}
		if s.Gateway.IsValid() {
			to := "0.0.0.0/0"
			if s.Gateway.Is6() {
				to = "::/0"
			}
			e.Routes = []route{{To: to, Via: s.Gateway.String()}}
		}
		if len(s.DNS) > 0 {
			ns := &nameservers{}
			for _, d := range s.DNS {
				ns.Addresses = append(ns.Addresses, d.String())
			}
			e.Nameservers = ns
		}
		nc, err = yaml.Marshal(netConfig{Version: 2, Ethernets: map[string]ethernet{Interface: e}})
		if err != nil {
			return nil, nil, nil, nil, err
		}
	}
	return md, ud, vd, nc, nil
}
