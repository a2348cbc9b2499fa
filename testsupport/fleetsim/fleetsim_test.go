package fleetsim

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/corralhq/corral/agent/cmdline"
	"github.com/corralhq/corral/testsupport/require"
)

// TestSmallStorm: 200 machines and 200 nodes against the built corrald
// (with -race), powered on over 10 s. Node heartbeats (3 s), the
// appliance's NOT_READY timeout (9 s) and sweep (4.5 s) are the real
// 10/30/15 s scaled by 0.3, in proportion. It asserts correctness only:
// every machine INVENTORIED in the appliance's own view, none lost, no
// duplicate address (as the clients saw the ACKs, and in the appliance's
// leases), every node READY, no NOT_READY flap. Never timings.
func TestSmallStorm(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end storm: skipped with -short")
	}
	require.Root(t, "the storm makes network namespaces")
	require.Tool(t, "ip", "go")
	bin := buildCorrald(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	work := t.TempDir()
	r, err := Run(ctx, Config{
		Machines: 200, Nodes: 200, Stagger: 10 * time.Second,
		KernelBytes: 256 << 10, InitrdBytes: 1 << 20,
		AgentHeartbeat: 3 * time.Second, NodeHeartbeat: 3 * time.Second,
		NodeHeartbeatTimeout: 9 * time.Second, NodeSweepInterval: 4500 * time.Millisecond,
		Soak: 10 * time.Second, InstallStep: 20 * time.Millisecond, Timeout: 3 * time.Minute,
		CorraldArgs: []string{"--reconcile-interval", "2s"},
		Corrald:     filepath.Join(bin, "corrald"), WorkDir: work, ID: fmt.Sprintf("t%d", os.Getpid()%10000),
		Log: testLog{t},
	})
	if err != nil {
		t.Fatalf("storm: %v\ncorrald log:\n%s", err, tail(filepath.Join(work, "corrald.log"), 30))
	}
	var b strings.Builder
	r.Print(&b, nil)
	t.Log("\n" + b.String())
	got := map[string]int{"inventoried": r.Inventoried, "lost": r.Lost, "failed": r.Failed, "duplicates": r.Duplicates,
		"lease MACs twice": r.LeaseMACsTwice, "lease mismatch": r.LeaseMismatch, "nodes READY": r.NodesReady, "flaps": r.Flaps}
	want := map[string]int{"inventoried": 200, "lost": 0, "failed": 0, "duplicates": 0,
		"lease MACs twice": 0, "lease mismatch": 0, "nodes READY": 200, "flaps": 0}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("storm correctness (-want +got):\n%s\ncorrald log:\n%s", d, tail(filepath.Join(work, "corrald.log"), 30))
	}
	if !r.OK() {
		t.Errorf("report not OK: %s", r.Summary())
	}
}

// buildCorrald builds corrald with -race into a directory of t's.
func buildCorrald(t *testing.T) string {
	t.Helper()
	bin := t.TempDir()
	build := exec.Command("go", "build", "-race", "-o", bin+"/", "github.com/corralhq/corral/cmd/corrald")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build corrald: %v\n%s", err, out)
	}
	return bin
}

// TestSmallFleetStorm: 20 machines and 20 nodes against a fleet of two
// appliances (corrald with -race) on a three-member etcd, both serving
// DHCP from the one range on the one segment, the relay forwarding to
// both. Correctness only, as TestSmallStorm: every machine inventoried in
// each appliance's own view, no duplicate address (the ACKs, and the
// leases as etcd holds them), every node READY, no flap; and the report
// has both appliances and the three members.
func TestSmallFleetStorm(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end storm: skipped with -short")
	}
	require.Root(t, "the storm makes network namespaces")
	require.Tool(t, "ip", "go", "etcd")
	bin := buildCorrald(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	work := t.TempDir()
	r, err := Run(ctx, Config{
		Machines: 20, Nodes: 20, Appliances: 2, Stagger: 5 * time.Second,
		KernelBytes: 256 << 10, InitrdBytes: 1 << 20,
		AgentHeartbeat: 3 * time.Second, NodeHeartbeat: 3 * time.Second,
		NodeHeartbeatTimeout: 9 * time.Second, NodeSweepInterval: 4500 * time.Millisecond,
		Soak: 10 * time.Second, InstallStep: 20 * time.Millisecond, Timeout: 3 * time.Minute,
		CorraldArgs: []string{"--reconcile-interval", "2s"},
		Corrald:     filepath.Join(bin, "corrald"), WorkDir: work, ID: fmt.Sprintf("f%d", os.Getpid()%10000),
		Log: testLog{t},
	})
	logs := func() string {
		return "fsim-a1 log:\n" + tail(filepath.Join(work, "fsim-a1", "corrald.log"), 20) + "\nfsim-a2 log:\n" + tail(filepath.Join(work, "fsim-a2", "corrald.log"), 20)
	}
	if err != nil {
		t.Fatalf("storm: %v\n%s", err, logs())
	}
	var b strings.Builder
	r.Print(&b, nil)
	t.Log("\n" + b.String())
	got := map[string]int{"inventoried": r.Inventoried, "lost": r.Lost, "failed": r.Failed, "duplicates": r.Duplicates,
		"lease MACs twice": r.LeaseMACsTwice, "lease mismatch": r.LeaseMismatch, "leases in etcd": min(r.LeasesLive, 1),
		"nodes READY": r.NodesReady, "flaps": r.Flaps, "appliances": len(r.Fleet), "etcd members": len(r.Etcd)}
	want := map[string]int{"inventoried": 20, "lost": 0, "failed": 0, "duplicates": 0,
		"lease MACs twice": 0, "lease mismatch": 0, "leases in etcd": 1,
		"nodes READY": 20, "flaps": 0, "appliances": 2, "etcd members": 3}
	for _, f := range r.Fleet {
		got[f.Name+" inventoried"] = f.Inventoried
		want[f.Name+" inventoried"] = 20
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("fleet storm correctness (-want +got):\n%s\n%s", d, logs())
	}
	if !r.OK() {
		t.Errorf("report not OK: %s", r.Summary())
	}
}

// TestFleetShape: the appliances' addresses on the segment are distinct
// and clear of the client end, the relay and the etcd members; a fleet's
// baseline key and setup name the appliances, one appliance's stay as
// they were.
func TestFleetShape(t *testing.T) {
	seen := map[netip.Addr]bool{relayAddr: true, giaddr: true, etcdAddr: true}
	for i := range maxAppliances {
		a := applianceAddr(i)
		if seen[a] || !segment.Contains(a) || poolPrefix.Contains(a) {
			t.Errorf("appliance %d address %s: taken, off the segment or in the pool", i, a)
		}
		seen[a] = true
	}
	if applianceAddr(0) != serverAddr {
		t.Errorf("the first appliance is at %s, want %s (the single appliance's)", applianceAddr(0), serverAddr)
	}
	one := Config{Machines: 5, Corrald: "x"}
	fleet := Config{Machines: 5, Corrald: "x", Appliances: 3}
	for _, c := range []*Config{&one, &fleet} {
		if err := c.defaults(); err != nil {
			t.Fatal(err)
		}
	}
	if one.Appliances != 1 || strings.Contains(one.setup(), "appliances") {
		t.Errorf("one appliance: Appliances %d, setup %q", one.Appliances, one.setup())
	}
	if !strings.HasPrefix(fleet.setup(), "appliances=3 (etcd, dhcp on all) ") {
		t.Errorf("fleet setup %q", fleet.setup())
	}
	if err := (&Config{Machines: 5, Corrald: "x", Appliances: maxAppliances + 1}).defaults(); err == nil {
		t.Errorf("%d appliances accepted", maxAppliances+1)
	}
	for k, want := range map[string]string{"/inventory/timeline/m-1/0001": "inventory/timeline", "/boot/leases/10.0.0.1": "boot/leases", "/audit/20261128T220301Z-be65-lan": "audit", "/x": "x"} {
		if got := keyClass(k); got != want {
			t.Errorf("keyClass(%q) = %q, want %q", k, got, want)
		}
	}
	for _, tc := range []struct {
		r    Report
		want string
	}{{Report{Machines: 10000, Nodes: 1000, Appliances: 3}, "10000x1000@3"}, {Report{Machines: 5000, Nodes: 5000, Appliances: 1}, "5000x5000"}, {Report{Machines: 5, Nodes: 5}, "5x5"}} {
		if got := tc.r.BaselineKey(); got != tc.want {
			t.Errorf("BaselineKey = %q, want %q", got, tc.want)
		}
	}
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func TestParseScript(t *testing.T) {
	golden, err := os.ReadFile("../../boot/http/testdata/discover.ipxe")
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		body    string
		want    bootScript
		wantErr string
	}{
		"discover golden": {body: string(golden), want: bootScript{
			intent: "discover", kernel: "http://10.0.0.1:8080/images/vmlinuz?mac=52:54:00:00:00:01",
			initrd: "http://10.0.0.1:8080/images/initrd.img?mac=52:54:00:00:00:01", hasKernelParams: true,
			params: cmdline.Params{Endpoints: []string{"10.0.0.1:20180"}, Token: "crl_0123456789abcdef_secretsecretsecretsecretsecretsecretsecretsecretsecre",
				CAFingerprint: strings.Repeat("ab", 32), MAC: "52:54:00:00:00:01"},
		}},
		"local":       {body: "#!ipxe\n# Corral local boot for m-1 (52:54:00:00:00:01)\necho Corral: m-1 boots from its local disk\nexit\n", want: bootScript{intent: "local"}},
		"not ipxe":    {body: "<html>", wantErr: "not an iPXE script"},
		"no intent":   {body: "#!ipxe\nexit\n", wantErr: "no Corral intent"},
		"no initrd":   {body: "#!ipxe\n# Corral discover boot for m\nkernel http://x/k corral.endpoint=1.2.3.4:1 corral.token=t corral.ca=" + strings.Repeat("ab", 32) + " corral.mac=52:54:00:00:00:01\nboot\n", wantErr: "kernel without initrd"},
		"bad cmdline": {body: "#!ipxe\n# Corral discover boot for m\nkernel http://x/k corral.mac=zz\n", wantErr: "kernel command line"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := parseScript([]byte(tc.body))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got, cmp.AllowUnexported(bootScript{})); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

// TestMachineIdentity: MACs, serials and UUIDs are unique across a row,
// and a large machine reports 2 sockets, 24 DIMMs, 12 disks, 4 NICs.
func TestMachineIdentity(t *testing.T) {
	seen := map[string]bool{}
	for i := range 70000 {
		id := newMachineID(0xbeef, i, i%4 == 0)
		for _, k := range []string{id.serial, id.uuidString(), id.macs[0].String(), id.macs[3].String()} {
			if seen[k] {
				t.Fatalf("machine %d: %s twice", i, k)
			}
			seen[k] = true
		}
	}
	f := newMachineID(1, 7, true).facts()
	got := map[string]int{"sockets": int(f.GetCpu().GetSockets()), "dimms": len(f.GetMemory().GetDimms()), "disks": len(f.GetDisks()), "nics": len(f.GetNics())}
	if d := cmp.Diff(map[string]int{"sockets": 2, "dimms": 24, "disks": 12, "nics": 4}, got); d != "" {
		t.Errorf("large machine (-want +got):\n%s", d)
	}
	for _, d := range f.GetDisks() {
		if d.GetSerial() == "" || d.GetWwn() == "" {
			t.Errorf("disk %s without serial or WWN", d.GetName())
		}
	}
}

// TestReportOK: each correctness failure makes the report not OK, and
// the summary line has the shape scripts read.
func TestReportOK(t *testing.T) {
	good := func() *Report { return &Report{Machines: 10, Inventoried: 10, Seconds: 12.4} }
	tests := map[string]struct {
		mut  func(*Report)
		want bool
	}{
		"all good":          {mut: func(*Report) {}, want: true},
		"one lost":          {mut: func(r *Report) { r.Inventoried, r.Lost = 9, 1 }},
		"one failed":        {mut: func(r *Report) { r.Failed = 1 }},
		"duplicate":         {mut: func(r *Report) { r.Duplicates = 1 }},
		"lease twice":       {mut: func(r *Report) { r.LeaseMACsTwice = 1 }},
		"lease to another":  {mut: func(r *Report) { r.LeaseMismatch = 1 }},
		"not ready flap":    {mut: func(r *Report) { r.Flaps = 1 }},
		"inventoried short": {mut: func(r *Report) { r.Inventoried = 9 }},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := good()
			tc.mut(r)
			if got := r.OK(); got != tc.want {
				t.Errorf("OK() = %v, want %v", got, tc.want)
			}
		})
	}
	if got, want := good().Summary(), "fleet: 10/10 inventoried, 0 lost, 0 duplicate addresses, 0 NOT_READY flaps, 12 s"; got != want {
		t.Errorf("summary %q, want %q", got, want)
	}
}

// TestQueueFigures: corrald's histogram text becomes count, mean and
// bucket-estimated quantiles; label values with commas survive.
func TestQueueFigures(t *testing.T) {
	text := `# HELP corral_store_commit_seconds x
corral_store_commit_seconds_bucket{op="put",outcome="ok",le="0.001"} 50
corral_store_commit_seconds_bucket{op="put",outcome="ok",le="0.01"} 90
corral_store_commit_seconds_bucket{op="put",outcome="ok",le="0.1"} 100
corral_store_commit_seconds_bucket{op="put",outcome="ok",le="+Inf"} 100
corral_store_commit_seconds_sum{op="put",outcome="ok"} 0.5
corral_store_commit_seconds_count{op="put",outcome="ok"} 100
corral_dhcp_packets_total{outcome="ack",type="request"} 7
corral_machines{state="DEPLOYED"} 3
go_threads 9
`
	path := filepath.Join(t.TempDir(), "m.txt")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	q, c, err := queueFigures(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []QueueLine{{Series: `store_commit_seconds{op="put",outcome="ok"}`, Count: 100, Mean: 0.005, P50: 0.001, P99: 0.091, Sum: 0.5}}
	if d := cmp.Diff(want, q, cmpopts.EquateApprox(0, 1e-9)); d != "" {
		t.Errorf("queue lines (-want +got):\n%s", d)
	}
	if d := cmp.Diff(map[string]float64{`dhcp_packets_total{outcome="ack",type="request"}`: 7}, c); d != "" {
		t.Errorf("counters (-want +got):\n%s", d)
	}
	tests := map[string]struct{ in, want string }{
		"api":      {`api_grpc_server_handling_seconds{grpc_method="Register",grpc_service="corral.node.v1.AgentService",grpc_type="unary"}`, "api_grpc_server_handling_seconds{grpc_method=Register}"},
		"store":    {`store_commit_seconds{op="put",outcome="ok"}`, "store_commit_seconds{op=put,outcome=ok}"},
		"no label": {`x{}`, "x"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := shortSeries(tc.in); got != tc.want {
				t.Errorf("shortSeries = %q, want %q", got, tc.want)
			}
		})
	}
	if got := splitLabels(`a="x,y",b="z"`); !cmp.Equal(got, []string{`a="x,y"`, `b="z"`}) {
		t.Errorf("splitLabels = %q", got)
	}
}

func TestHotFunctions(t *testing.T) {
	out := []byte(`# Children      Self  Symbol
    10.30%     0.02%  [.] github.com/corralhq/corral/store/record.Unmarshal   -   -
     9.26%     0.02%  [.] github.com/corralhq/corral/boot/dhcp.(*Server).serve.gowrap1   -   -
     8.89%     0.05%  [.] crypto/tls.(*Conn).serverHandshake   -   -
     7.00%     7.00%  [.] runtime.memmove   -   -
     6.78%     0.00%  [.] runtime.gcBgMarkWorker   -   -
`)
	want := []string{" 10.30%  store/record.Unmarshal", "  8.89%  crypto/tls.(*Conn).serverHandshake", "  6.78%  runtime.gcBgMarkWorker"}
	if d := cmp.Diff(want, hotFunctions(out, 10)); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
}
