package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/corralhq/corral/api/clientconfig"
	fleetv1 "github.com/corralhq/corral/api/fleet/v1"
)

// A fleet lab (Config.Appliances ≥ 2) runs, in the lab's namespace, a
// three-member etcd cluster (local processes on the namespace's loopback,
// also reachable from the host on the veth address) and N corrald on
// --store etcd. Each appliance has its own boot interface: a veth whose
// peer is a port of the lab bridge, with its own address on the segment
// (.11, .12, ...), so its DHCP server identifier, TFTP and HTTP boot
// addresses and API endpoint differ from the others', as on separate
// hosts. The API ports differ too (20180, 20181, ...), so the host reaches
// every appliance through the one veth pair. Only the first appliance
// serves DHCP and TFTP unless ApplianceDHCP is DHCPAll; every appliance
// serves HTTP boot and the API.

// MaxAppliances bounds --appliances: each takes an address on the segment
// and an API port.
const MaxAppliances = 8

// EtcdPrefix is the fleet's key prefix in the lab's etcd.
const EtcdPrefix = "/corral-lab"

// etcdMembers is the size of the lab's etcd cluster.
const etcdMembers = 3

// Where a fleet serves DHCP (Config.ApplianceDHCP).
const (
	// DHCPFirst: the first appliance serves full DHCP and TFTP, the others
	// --dhcp-mode off (HTTP boot and the API only).
	DHCPFirst = "first"
	// DHCPAll: every appliance serves full DHCP from the same range on the
	// one segment (leases are CAS'd records in etcd) and TFTP on its own
	// address, so the segment keeps DHCP when any one appliance dies.
	DHCPAll = "all"
)

// EtcdMember is one member process of the lab's etcd cluster.
type EtcdMember struct {
	Name string `json:"name"`
	// ClientURL is what the appliances use (the namespace's loopback);
	// HostURL is the same listener through the veth, from the host.
	ClientURL string  `json:"client_url"`
	HostURL   string  `json:"host_url"`
	PeerURL   string  `json:"peer_url"`
	Dir       string  `json:"dir"`
	Log       string  `json:"log"`
	Process   Process `json:"process"`
}

// Appliance is one corrald of a fleet lab.
type Appliance struct {
	Name    string `json:"name"`
	DataDir string `json:"data_dir"`
	Log     string `json:"log"`
	// Link is its boot interface in the namespace, Port the bridge port
	// at the other end of the veth; Addr its address on the segment.
	Link string `json:"link"`
	Port string `json:"bridge_port"`
	Addr string `json:"addr"`
	// APIPort is its API port on every address; HostEndpoint is how the
	// host reaches it (the namespace's veth address).
	APIPort      int    `json:"api_port"`
	HostEndpoint string `json:"host_endpoint"`
	// ClientConfig is a corral client file for it (the first appliance's
	// admin.conf with HostEndpoint).
	ClientConfig string   `json:"client_config"`
	DHCP         bool     `json:"dhcp"`
	Args         []string `json:"args"`
	Process      Process  `json:"process"`
}

// Endpoint is the appliance's API endpoint on the boot segment (what
// machines dial).
func (a Appliance) Endpoint() string { return net.JoinHostPort(a.Addr, strconv.Itoa(a.APIPort)) }

// Fleet reports whether the lab runs several appliances on etcd.
func (s *State) Fleet() bool { return len(s.Appliances) > 0 }

// Appliance returns the fleet's appliance of that name.
func (s *State) Appliance(name string) (Appliance, bool) {
	for _, a := range s.Appliances {
		if a.Name == name {
			return a, true
		}
	}
	return Appliance{}, false
}

// planFleet names the etcd members and the appliances of a fleet lab of n
// appliances (s's namespace, subnet and veth addresses are set).
func (s *State) planFleet(n int, dhcp string) {
	s.EtcdPrefix = EtcdPrefix
	s.ApplianceDHCP = dhcp
	for i := range etcdMembers {
		// The namespace is the lab's own: fixed ports cannot collide.
		port := 2379 + 10000*i
		name := fmt.Sprintf("m%d", i+1)
		m := EtcdMember{Name: name,
			ClientURL: fmt.Sprintf("http://127.0.0.1:%d", port),
			HostURL:   fmt.Sprintf("http://%s:%d", s.NSAddr, port),
			PeerURL:   fmt.Sprintf("http://127.0.0.1:%d", port+1),
			Dir:       filepath.Join(s.RunDir, "etcd", name)}
		m.Log = m.Dir + ".log"
		s.Etcd = append(s.Etcd, m)
	}
	for i := range n {
		k := i + 1
		name := fmt.Sprintf("lab-a%d", k)
		dir := filepath.Join(s.RunDir, name)
		a := Appliance{Name: name, DataDir: filepath.Join(dir, "data"), Log: filepath.Join(dir, "corrald.log"),
			Link: fmt.Sprintf("cla%s%d", s.ID, k), Port: fmt.Sprintf("clp%s%d", s.ID, k),
			Addr: fmt.Sprintf("%s.%d", s.Subnet, 10+k), APIPort: APIPort + i,
			DHCP:         i == 0 || dhcp == DHCPAll,
			ClientConfig: filepath.Join(s.Dir, name+".conf")}
		if i == 0 {
			a.ClientConfig = s.ClientConfig
		}
		a.HostEndpoint = net.JoinHostPort(s.NSAddr, strconv.Itoa(a.APIPort))
		s.Appliances = append(s.Appliances, a)
	}
	s.DataDir = s.Appliances[0].DataDir
}

// etcdEndpoints is --etcd-endpoints for the appliances.
func (s *State) etcdEndpoints() string {
	var eps []string
	for _, m := range s.Etcd {
		eps = append(eps, m.ClientURL)
	}
	return strings.Join(eps, ",")
}

// createFleetNetwork gives each appliance its boot interface: a veth pair,
// one end a bridge port, the other the appliance's address on the segment.
// Several interfaces of one namespace share the subnet, so ARP is answered
// only on the interface that holds the address (arp_ignore=1) and no
// reverse-path filter drops a reply that took another of them; the bridge
// and the appliances' links send no IPv6 router solicitations
// (accept_ra=0), which every appliance's RA responder would answer and put
// on a timeline.
func (s *State) createFleetNetwork(ctx context.Context) error {
	// The bridge exists already: its own setting, not the default, counts.
	sysctls := `for c in all default ` + s.Bridge + `; do
  echo 0 > /proc/sys/net/ipv4/conf/$c/rp_filter && echo 1 > /proc/sys/net/ipv4/conf/$c/arp_ignore || exit 1
  f=/proc/sys/net/ipv6/conf/$c/accept_ra; if [ -e $f ]; then echo 0 > $f || exit 1; fi
done`
	if out, err := exec.CommandContext(ctx, "ip", "netns", "exec", s.Namespace, "sh", "-c", sysctls).CombinedOutput(); err != nil {
		return fmt.Errorf("sysctls in %s: %v: %s", s.Namespace, err, out)
	}
	for _, a := range s.Appliances {
		for _, st := range [][]string{
			{"link", "add", a.Port, "type", "veth", "peer", "name", a.Link},
			{"link", "set", a.Port, "master", s.Bridge},
			{"link", "set", a.Port, "up"},
			{"addr", "add", a.Addr + "/24", "dev", a.Link},
			{"link", "set", a.Link, "up"},
		} {
			if err := s.ipn(ctx, st...); err != nil {
				return err
			}
		}
	}
	return nil
}

// etcdArgs is member m's command line (after the binary).
func (s *State) etcdArgs(m EtcdMember) []string {
	var initial []string
	for _, o := range s.Etcd {
		initial = append(initial, o.Name+"="+o.PeerURL)
	}
	hostPort := m.HostURL[strings.LastIndex(m.HostURL, ":")+1:]
	return []string{
		"--name", m.Name, "--data-dir", m.Dir,
		"--listen-client-urls", m.ClientURL + ",http://" + net.JoinHostPort(s.NSAddr, hostPort),
		"--advertise-client-urls", m.ClientURL,
		"--listen-peer-urls", m.PeerURL, "--initial-advertise-peer-urls", m.PeerURL,
		"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
		"--initial-cluster-token", "corral-lab-" + s.ID,
		"--logger", "zap", "--log-outputs", "stderr",
	}
}

// startEtcd starts the members detached in the namespace (they outlive
// corral-lab; Down stops them) and waits until each reports healthy.
func (s *State) startEtcd(ctx context.Context) error {
	bin, err := exec.LookPath("etcd")
	if err != nil {
		return fmt.Errorf("etcd not installed (apt-get install etcd-server): %w", err)
	}
	for i := range s.Etcd {
		m := &s.Etcd[i]
		if err := os.MkdirAll(filepath.Dir(m.Dir), 0o755); err != nil {
			return err
		}
		pid, err := startDetached(m.Log, append([]string{"netns", "exec", s.Namespace, bin}, s.etcdArgs(*m)...)...)
		if err != nil {
			return err
		}
		m.Process = Process{PID: pid, Marker: m.Dir}
		if err := s.Save(); err != nil {
			return err
		}
	}
	hc := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for _, m := range s.Etcd {
		for {
			err := etcdHealthy(ctx, hc, m.HostURL)
			if err == nil {
				break
			}
			if !alive(m.Process.PID, m.Process.Marker) {
				b, _ := os.ReadFile(m.Log)
				return fmt.Errorf("etcd %s exited:\n%s", m.Name, tail(string(b), 3000))
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("etcd %s not healthy within 30s: %v (log %s)", m.Name, err, m.Log)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	return nil
}

// etcdHealthy asks a member's /health (true once the cluster has a leader).
func etcdHealthy(ctx context.Context, hc *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var h struct {
		Health string `json:"health"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4096)).Decode(&h); err != nil {
		return fmt.Errorf("%s/health: %w", url, err)
	}
	if h.Health != "true" {
		return fmt.Errorf("%s/health: %q", url, h.Health)
	}
	return nil
}

// applianceArgs is appliance i's `corrald serve` command line (after the
// binary).
func (s *State) applianceArgs(i int, autoAccept bool, extra []string) []string {
	a := s.Appliances[i]
	args := []string{"serve", "--data-dir", a.DataDir,
		"--store", "etcd", "--etcd-endpoints", s.etcdEndpoints(), "--etcd-prefix", s.EtcdPrefix,
		"--appliance-name", a.Name,
		"--api-listen", fmt.Sprintf(":%d", a.APIPort), "--api-san", s.NSAddr, "--api-san", a.Addr,
		"--api-advertise", a.Endpoint(),
		"--boot-interface", a.Link, "--http-listen", net.JoinHostPort(a.Addr, "8080"),
		"--bmc-poll-interval", "15s"}
	if a.DHCP {
		args = append(args, "--dhcp-mode", "full", "--dhcp-range", s.Subnet+".100-"+s.Subnet+".199",
			"--dhcp-router", s.Subnet+".1", "--tftp-listen", net.JoinHostPort(a.Addr, "69"))
	} else {
		args = append(args, "--dhcp-mode", "off", "--tftp-listen", "off")
	}
	if autoAccept {
		args = append(args, "--auto-accept")
	}
	return append(args, extra...)
}

// startAppliances starts the fleet's corrald one after the other, each
// detached in the namespace, and waits until each answers its API: the
// first initialises the fleet (CA, seal key, admin token, cluster key);
// the others get a copy of its cluster key and join.
func (s *State) startAppliances(ctx context.Context, c Config, say func(string, ...any)) error {
	if c.Accept && corraldHas(ctx, s.Bin.Corrald, "auto-accept") {
		s.AutoAccept = true
	}
	first := s.Appliances[0]
	for i := range s.Appliances {
		a := &s.Appliances[i]
		if err := os.MkdirAll(a.DataDir, 0o700); err != nil {
			return err
		}
		if i > 0 {
			// What an operator adding an appliance copies: the cluster key,
			// and an admin.conf for the CLI on that host.
			key, err := os.ReadFile(filepath.Join(first.DataDir, "cluster.key"))
			if err != nil {
				return fmt.Errorf("%s's cluster key: %w", first.Name, err)
			}
			if err := os.WriteFile(filepath.Join(a.DataDir, "cluster.key"), key, 0o600); err != nil {
				return err
			}
			cfg, err := clientconfig.Load(filepath.Join(first.DataDir, "admin.conf"))
			if err != nil {
				return fmt.Errorf("%s's admin.conf: %w", first.Name, err)
			}
			cfg.Endpoint = net.JoinHostPort("127.0.0.1", strconv.Itoa(a.APIPort))
			if err := cfg.Write(filepath.Join(a.DataDir, "admin.conf")); err != nil {
				return err
			}
		}
		a.Args = s.applianceArgs(i, s.AutoAccept, c.CorraldArgs)
		pid, err := startDetached(a.Log, append([]string{"netns", "exec", s.Namespace, s.Bin.Corrald}, a.Args...)...)
		if err != nil {
			return err
		}
		a.Process = Process{PID: pid, Marker: a.DataDir}
		if i == 0 {
			s.Corrald, s.CorraldArgs = a.Process, a.Args
		}
		if err := s.Save(); err != nil {
			return err
		}
		if err := s.waitAPI(ctx, a.Process, a.Log, filepath.Join(first.DataDir, "admin.conf"), a.ClientConfig, a.HostEndpoint); err != nil {
			return fmt.Errorf("%s: %w", a.Name, err)
		}
		dhcp := "HTTP boot and API"
		if a.DHCP {
			dhcp = "DHCP (full), TFTP, HTTP boot and API"
		}
		say("%s serving %s on %s (API %s, from the host %s; pid %d, log %s)", a.Name, dhcp, a.Addr, a.Endpoint(), a.HostEndpoint, pid, a.Log)
	}
	return nil
}

// FleetStatus is what Fleet reads of a fleet lab.
type FleetStatus struct {
	Prefix     string
	Etcd       []MemberStatus
	Appliances []ApplianceStatus
	// Leader is the leader the API names ("" when unknown); Note says why
	// roles are missing (no appliance answered, or it lacks the service).
	Leader string
	Note   string
}

// MemberStatus is one etcd member.
type MemberStatus struct {
	Name, HostURL string
	Running       bool
}

// ApplianceStatus is one appliance: the lab's view (process, addresses)
// and, when the fleet's ApplianceService answers, the fleet's (role,
// load, last heartbeat).
type ApplianceStatus struct {
	Name, Addr, Endpoint, HostEndpoint string
	DHCP, Running                      bool
	PID                                int
	Role                               string
	Load, Assigned                     uint32
	LastHeartbeat                      time.Time
}

// Fleet reads the fleet's processes from the host and its appliances'
// records from the first appliance that answers. It does not fail: what
// it could not read is left empty and said in Note.
func Fleet(ctx context.Context, s *State) FleetStatus {
	fs := FleetStatus{Prefix: s.EtcdPrefix}
	for _, m := range s.Etcd {
		fs.Etcd = append(fs.Etcd, MemberStatus{Name: m.Name, HostURL: m.HostURL, Running: alive(m.Process.PID, m.Process.Marker)})
	}
	for _, a := range s.Appliances {
		fs.Appliances = append(fs.Appliances, ApplianceStatus{Name: a.Name, Addr: a.Addr, Endpoint: a.Endpoint(), HostEndpoint: a.HostEndpoint,
			DHCP: a.DHCP, PID: a.Process.PID, Running: alive(a.Process.PID, a.Process.Marker)})
	}
	api, err := dialAPI(s)
	if err != nil {
		fs.Note = err.Error()
		return fs
	}
	defer api.Close()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := fleetv1.NewApplianceServiceClient(api.cc).ListAppliances(cctx, &fleetv1.ListAppliancesRequest{})
	if err != nil {
		fs.Note = "ListAppliances: " + err.Error()
		return fs
	}
	fs.Leader = resp.GetLeader()
	for _, r := range resp.GetAppliances() {
		i := -1
		for j := range fs.Appliances {
			if fs.Appliances[j].Name == r.GetName() {
				i = j
			}
		}
		if i < 0 {
			// An appliance of the fleet the lab did not start.
			fs.Appliances = append(fs.Appliances, ApplianceStatus{Name: r.GetName(), Endpoint: r.GetApiEndpoint()})
			i = len(fs.Appliances) - 1
		}
		a := &fs.Appliances[i]
		a.Role = strings.TrimPrefix(r.GetRole().String(), "ROLE_")
		a.Load, a.Assigned = r.GetLoad(), r.GetAssigned()
		if r.GetLastHeartbeat() != nil {
			a.LastHeartbeat = r.GetLastHeartbeat().AsTime()
		}
	}
	return fs
}

// PrintFleet writes FleetStatus as a table.
func PrintFleet(w io.Writer, fs FleetStatus) error {
	var ms []string
	for _, m := range fs.Etcd {
		ms = append(ms, m.Name+" "+aliveWord(m.Running))
	}
	fmt.Fprintf(w, "fleet: %d appliances on etcd (prefix %s; members %s)", len(fs.Appliances), fs.Prefix, strings.Join(ms, ", "))
	if fs.Leader != "" {
		fmt.Fprintf(w, ", leader %s", fs.Leader)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	fmt.Fprintln(tw, "APPLIANCE\tPROCESS\tAPI (SEGMENT)\tAPI (HOST)\tDHCP+TFTP\tROLE\tLOAD\tASSIGNED\tHEARTBEAT")
	now := time.Now()
	for _, a := range fs.Appliances {
		proc := "-"
		if a.PID > 0 {
			proc = fmt.Sprintf("%s %d", aliveWord(a.Running), a.PID)
		}
		hb := "-"
		if !a.LastHeartbeat.IsZero() {
			hb = now.Sub(a.LastHeartbeat).Round(time.Second).String() + " ago"
		}
		dhcp := "no"
		if a.DHCP {
			dhcp = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", a.Name, proc, orDash(a.Endpoint), orDash(a.HostEndpoint), dhcp, orDash(a.Role), a.Load, a.Assigned, hb)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if fs.Note != "" {
		fmt.Fprintf(w, "(roles unknown: %s)\n", short(fs.Note, 200))
	}
	return nil
}

// stopFleet stops the appliances, then the etcd members (the appliances
// resign their lead and leave the fleet through etcd on the way out).
func (s *State) stopFleet(out io.Writer) []error {
	var errs []error
	halt := func(name string, p Process, grace time.Duration) {
		switch {
		case p.PID <= 0:
		case !alive(p.PID, p.Marker):
			fmt.Fprintf(out, "%s was not running (pid %d)\n", name, p.PID)
		default:
			if err := stop(p, grace); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
			} else {
				fmt.Fprintf(out, "%s stopped (pid %d)\n", name, p.PID)
			}
		}
	}
	for _, a := range s.Appliances {
		halt(a.Name, a.Process, 15*time.Second)
	}
	for _, m := range s.Etcd {
		halt("etcd "+m.Name, m.Process, 10*time.Second)
	}
	return errs
}

// errNoAppliance: no appliance of the fleet runs.
var errNoAppliance = errors.New("no appliance of the fleet is running")
