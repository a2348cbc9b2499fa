package lab

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// fleetState is a lab state as newState names it, without touching the
// host.
func fleetState(n int, dhcp string) *State {
	s := &State{ID: "a1b2", Dir: "/var/lib/corral-lab", RunDir: "/var/lib/corral-lab/run", Namespace: "corral-lab-a1b2",
		Bridge: "clbra1b2", VethHost: "clvha1b2", VethNS: "clvna1b2", HostAddr: "10.252.9.1", NSAddr: "10.252.9.2",
		Subnet: "10.66.42", ClientConfig: "/var/lib/corral-lab/lab.conf"}
	s.planFleet(n, dhcp)
	return s
}

// flags reads a command line's --flag value pairs (every flag here takes
// a value except --auto-accept).
func flags(args []string) map[string][]string {
	out := map[string][]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "--") {
			continue
		}
		if a == "--auto-accept" || i+1 == len(args) {
			out[a] = append(out[a], "")
			continue
		}
		out[a] = append(out[a], args[i+1])
		i++
	}
	return out
}

// TestPlanFleet: every appliance of the largest fleet gets its own
// interface names (within Linux's 15 bytes), address on the segment
// (outside the DHCP range and the bridge's .1), API port, data directory
// and client file; the first is the lab's lab.conf and data directory.
func TestPlanFleet(t *testing.T) {
	s := fleetState(MaxAppliances, DHCPFirst)
	if len(s.Appliances) != MaxAppliances || len(s.Etcd) != etcdMembers {
		t.Fatalf("%d appliances, %d etcd members; want %d and %d", len(s.Appliances), len(s.Etcd), MaxAppliances, etcdMembers)
	}
	subnet := netip.MustParsePrefix(s.Subnet + ".0/24")
	dhcpLo, dhcpHi := netip.MustParseAddr(s.Subnet+".100"), netip.MustParseAddr(s.Subnet+".199")
	seen := map[string]string{}
	once := func(what, v, who string) {
		t.Helper()
		if prev, dup := seen[what+" "+v]; dup {
			t.Errorf("%s %s of %s is also %s's", what, v, who, prev)
		}
		seen[what+" "+v] = who
	}
	for _, n := range []string{s.Bridge, s.VethHost, s.VethNS} {
		once("link", n, "the lab")
	}
	for i, a := range s.Appliances {
		for _, n := range []string{a.Link, a.Port} {
			if len(n) > 15 {
				t.Errorf("%s: link name %q is %d bytes (Linux allows 15)", a.Name, n, len(n))
			}
			once("link", n, a.Name)
		}
		addr := netip.MustParseAddr(a.Addr)
		if !subnet.Contains(addr) || addr == netip.MustParseAddr(s.Subnet+".1") || (dhcpLo.Compare(addr) <= 0 && addr.Compare(dhcpHi) <= 0) {
			t.Errorf("%s: address %s is not a free address of %s outside the bridge's .1 and the DHCP range", a.Name, a.Addr, subnet)
		}
		once("address", a.Addr, a.Name)
		once("api port", a.HostEndpoint, a.Name)
		once("data dir", a.DataDir, a.Name)
		once("client file", a.ClientConfig, a.Name)
		if want := i == 0; a.DHCP != want {
			t.Errorf("%s: DHCP %t with --appliance-dhcp first, want %t", a.Name, a.DHCP, want)
		}
	}
	if s.DataDir != s.Appliances[0].DataDir || s.Appliances[0].ClientConfig != s.ClientConfig {
		t.Errorf("the lab's data dir %s and client file %s are not the first appliance's (%s, %s)", s.DataDir, s.ClientConfig, s.Appliances[0].DataDir, s.Appliances[0].ClientConfig)
	}
	for _, a := range fleetState(2, DHCPAll).Appliances {
		if !a.DHCP {
			t.Errorf("%s: no DHCP with --appliance-dhcp all", a.Name)
		}
	}
}

// TestFleetMarkers: Down signals a pid only when its command line holds
// the process's marker, so each appliance's and member's marker must be in
// its own command line and in no other's.
func TestFleetMarkers(t *testing.T) {
	s := fleetState(MaxAppliances, DHCPAll)
	type proc struct{ name, marker, cmdline string }
	var ps []proc
	for i, a := range s.Appliances {
		ps = append(ps, proc{a.Name, a.DataDir, strings.Join(append([]string{"/x/corrald"}, s.applianceArgs(i, true, nil)...), " ")})
	}
	for _, m := range s.Etcd {
		ps = append(ps, proc{"etcd " + m.Name, m.Dir, strings.Join(append([]string{"/usr/bin/etcd"}, s.etcdArgs(m)...), " ")})
	}
	for _, p := range ps {
		for _, q := range ps {
			if got, want := strings.Contains(q.cmdline, p.marker), p.name == q.name; got != want {
				t.Errorf("%s's marker %q in %s's command line: %t, want %t", p.name, p.marker, q.name, got, want)
			}
		}
	}
}

// TestApplianceArgs: each appliance joins the lab's etcd under its own
// name, binds boot and API to its own address, advertises the endpoint
// machines reach it on, and serves DHCP and TFTP only where planned; the
// caller's extra arguments come last (they win).
func TestApplianceArgs(t *testing.T) {
	etcd := "http://127.0.0.1:2379,http://127.0.0.1:12379,http://127.0.0.1:22379"
	for name, tc := range map[string]struct {
		dhcp  string
		i     int
		extra []string
		want  map[string][]string
	}{
		"first appliance serves DHCP": {dhcp: DHCPFirst, i: 0, want: map[string][]string{
			"--store": {"etcd"}, "--etcd-endpoints": {etcd}, "--etcd-prefix": {EtcdPrefix}, "--appliance-name": {"lab-a1"},
			"--api-listen": {":20180"}, "--api-san": {"10.252.9.2", "10.66.42.11"}, "--api-advertise": {"10.66.42.11:20180"},
			"--boot-interface": {"claa1b21"}, "--http-listen": {"10.66.42.11:8080"},
			"--dhcp-mode": {"full"}, "--dhcp-range": {"10.66.42.100-10.66.42.199"}, "--dhcp-router": {"10.66.42.1"}, "--tftp-listen": {"10.66.42.11:69"},
		}},
		"second appliance without DHCP": {dhcp: DHCPFirst, i: 1, want: map[string][]string{
			"--store": {"etcd"}, "--etcd-endpoints": {etcd}, "--etcd-prefix": {EtcdPrefix}, "--appliance-name": {"lab-a2"},
			"--api-listen": {":20181"}, "--api-san": {"10.252.9.2", "10.66.42.12"}, "--api-advertise": {"10.66.42.12:20181"},
			"--boot-interface": {"claa1b22"}, "--http-listen": {"10.66.42.12:8080"},
			"--dhcp-mode": {"off"}, "--tftp-listen": {"off"},
		}},
		"second appliance with DHCP, extra args": {dhcp: DHCPAll, i: 1, extra: []string{"--leader-lease-ttl=5s"}, want: map[string][]string{
			"--store": {"etcd"}, "--etcd-endpoints": {etcd}, "--etcd-prefix": {EtcdPrefix}, "--appliance-name": {"lab-a2"},
			"--api-listen": {":20181"}, "--api-san": {"10.252.9.2", "10.66.42.12"}, "--api-advertise": {"10.66.42.12:20181"},
			"--boot-interface": {"claa1b22"}, "--http-listen": {"10.66.42.12:8080"},
			"--dhcp-mode": {"full"}, "--dhcp-range": {"10.66.42.100-10.66.42.199"}, "--dhcp-router": {"10.66.42.1"}, "--tftp-listen": {"10.66.42.12:69"},
			"--leader-lease-ttl=5s": {""},
		}},
	} {
		t.Run(name, func(t *testing.T) {
			s := fleetState(2, tc.dhcp)
			args := s.applianceArgs(tc.i, false, tc.extra)
			if args[0] != "serve" {
				t.Fatalf("args start %q, want serve", args[0])
			}
			got := flags(args)
			delete(got, "--data-dir")
			delete(got, "--bmc-poll-interval")
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("flags (-want +got):\n%s", diff)
			}
			if n := len(tc.extra); n > 0 && !cmp.Equal(args[len(args)-n:], tc.extra) {
				t.Errorf("extra args not last: %q", args)
			}
		})
	}
}

// TestEtcdArgs: the members form one cluster of all three on distinct
// ports; each is reachable from the host on the veth address.
func TestEtcdArgs(t *testing.T) {
	s := fleetState(2, DHCPFirst)
	want := "m1=http://127.0.0.1:2380,m2=http://127.0.0.1:12380,m3=http://127.0.0.1:22380"
	for _, m := range s.Etcd {
		f := flags(s.etcdArgs(m))
		if got := f["--initial-cluster"]; !cmp.Equal(got, []string{want}) {
			t.Errorf("%s: --initial-cluster %q, want %q", m.Name, got, want)
		}
		if got, want := f["--listen-client-urls"], []string{m.ClientURL + "," + m.HostURL}; !cmp.Equal(got, want) {
			t.Errorf("%s: --listen-client-urls %q, want %q", m.Name, got, want)
		}
		if !strings.HasPrefix(m.HostURL, "http://"+s.NSAddr+":") {
			t.Errorf("%s: host URL %s is not on the namespace's veth address %s", m.Name, m.HostURL, s.NSAddr)
		}
	}
	if got, want := s.etcdEndpoints(), "http://127.0.0.1:2379,http://127.0.0.1:12379,http://127.0.0.1:22379"; got != want {
		t.Errorf("etcd endpoints %q, want %q", got, want)
	}
}

// TestConfigAppliances: --appliances and --appliance-dhcp are checked
// before anything starts, with a message naming the flag.
func TestConfigAppliances(t *testing.T) {
	for name, tc := range map[string]struct {
		c       Config
		wantN   int
		wantErr string
	}{
		"default one":     {wantN: 1},
		"two":             {c: Config{Appliances: 2, ApplianceDHCP: DHCPAll}, wantN: 2},
		"most":            {c: Config{Appliances: MaxAppliances}, wantN: MaxAppliances},
		"too many":        {c: Config{Appliances: MaxAppliances + 1}, wantErr: "--appliances 9: want 1-8"},
		"negative":        {c: Config{Appliances: -1}, wantErr: "--appliances -1: want 1-8"},
		"bad dhcp choice": {c: Config{Appliances: 2, ApplianceDHCP: "some"}, wantErr: `--appliance-dhcp "some": want first or all`},
	} {
		t.Run(name, func(t *testing.T) {
			tc.c.Dir = t.TempDir()
			err := tc.c.defaults()
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("defaults() = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.c.Appliances != tc.wantN || tc.c.ApplianceDHCP == "" {
				t.Errorf("appliances %d dhcp %q, want %d and a default", tc.c.Appliances, tc.c.ApplianceDHCP, tc.wantN)
			}
		})
	}
}

// TestPrintFleet: the table shows every appliance's process, endpoints,
// DHCP duty and, when the API answered, its role; otherwise why not.
func TestPrintFleet(t *testing.T) {
	hb := time.Now().Add(-3 * time.Second)
	var b bytes.Buffer
	err := PrintFleet(&b, FleetStatus{Prefix: EtcdPrefix, Leader: "lab-a2",
		Etcd: []MemberStatus{{Name: "m1", Running: true}, {Name: "m2"}, {Name: "m3", Running: true}},
		Appliances: []ApplianceStatus{
			{Name: "lab-a1", Endpoint: "10.66.42.11:20180", HostEndpoint: "10.252.9.2:20180", DHCP: true, PID: 41},
			{Name: "lab-a2", Endpoint: "10.66.42.12:20181", HostEndpoint: "10.252.9.2:20181", PID: 42, Running: true, Role: "LEADER", Load: 1, Assigned: 1, LastHeartbeat: hb},
		}})
	if err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"fleet: 2 appliances on etcd (prefix /corral-lab; members m1 running, m2 stopped, m3 running), leader lab-a2",
		"lab-a1      stopped 41   10.66.42.11:20180   10.252.9.2:20180   yes         -",
		"lab-a2      running 42   10.66.42.12:20181   10.252.9.2:20181   no          LEADER   1      1          3s ago",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	b.Reset()
	if err := PrintFleet(&b, FleetStatus{Note: "ListAppliances: unknown service"}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "(roles unknown: ListAppliances: unknown service)") {
		t.Errorf("the note is missing:\n%s", b.String())
	}
}
