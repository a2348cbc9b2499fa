package main

// End-to-end tests of several corrald on one etcd cluster: real etcd
// members (testsupport/etcdtest) and the built corrald binaries, driven by
// a real gRPC client over TLS.

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corralhq/corral/api/clientconfig"
	fleetv1 "github.com/corralhq/corral/api/fleet/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/testsupport/etcdtest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fleetEnv is the environment of a corrald on the cluster c.
func fleetEnv(c *etcdtest.Cluster, name string) []string {
	return []string{"CORRAL_STORE=etcd", "CORRAL_ETCD_ENDPOINTS=" + c.EndpointsFlag(), "CORRAL_ETCD_PREFIX=/e2e",
		"CORRAL_APPLIANCE_NAME=" + name, "CORRAL_LEADER_LEASE_TTL=3s",
		// The agent in these tests beats every second; a dead appliance's
		// session claim goes stale after this.
		"CORRAL_AGENT_HEARTBEAT_TIMEOUT=5s"}
}

// startFleet starts appliances a and b on c; b gets a's cluster key.
func startFleet(t *testing.T, c *etcdtest.Cluster) (a, b *daemon, dirA string) {
	t.Helper()
	dirA, dirB := t.TempDir(), t.TempDir()
	ma, mb := freePort(t), freePort(t)
	a = startCorrald(t, dirA, freePort(t), append(fleetEnv(c, "a"), "CORRAL_METRICS_LISTEN="+ma)...)
	a.metrics = ma
	key, err := os.ReadFile(filepath.Join(dirA, "cluster.key"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dirB, "cluster.key"), key, 0o600); err != nil {
		t.Fatal(err)
	}
	b = startCorrald(t, dirB, freePort(t), append(fleetEnv(c, "b"), "CORRAL_METRICS_LISTEN="+mb)...)
	b.metrics = mb
	return a, b, dirA
}

// poolClient dials addr with dataDir's admin.conf.
func poolClient(t *testing.T, dataDir, addr string) poolv1.NodeServiceClient {
	t.Helper()
	cc, err := clientconfig.Load(filepath.Join(dataDir, "admin.conf"))
	if err != nil {
		t.Fatal(err)
	}
	cc.Endpoint = addr
	conn, err := clientconfig.Dial(cc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return poolv1.NewNodeServiceClient(conn)
}

func reserve(ctx context.Context, c poolv1.NodeServiceClient, name string) error {
	_, err := c.ReserveCompute(ctx, &poolv1.ReserveComputeRequest{NodeName: "n1", ComputeName: name,
		RequestCpuMilliCore: 1000, LimitCpuMilliCore: 1000, RequestMemoryBytes: 1 << 30, LimitMemoryBytes: 1 << 30})
	return err
}

// TestE2EFleetEtcd: two corrald on a three-member etcd cluster. Writes
// through one are read through the other; 40 concurrent reservations
// through both on room for 10 give exactly 10; with one member killed every
// write still commits; with two killed calls fail with a clear Unavailable
// and nothing is lost; when they return the fleet serves again; a leader
// killed with SIGKILL is replaced within the lease TTL.
func TestE2EFleetEtcd(t *testing.T) {
	needE2E(t)
	c := etcdtest.New(t, 3)
	a, b, dirA := startFleet(t, c)
	ca, cb := poolClient(t, dirA, a.addr), poolClient(t, dirA, b.addr)
	ctx := context.Background()
	if _, err := ca.ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: "n1", Address: "10.0.0.9", CpuMilliCores: 10000, MemoryBytes: 64 << 30, StorageBytes: 1 << 40}); err != nil {
		t.Fatal(err)
	}
	if n, err := cb.GetNode(ctx, &poolv1.GetNodeRequest{Name: "n1"}); err != nil || n.GetCpuMilliCores() != 10000 {
		t.Fatalf("node written through a, read through b: %v %v", n, err)
	}
	// Both appliances are runners; one leads.
	cc0, err := clientconfig.Load(filepath.Join(dirA, "admin.conf"))
	if err != nil {
		t.Fatal(err)
	}
	cc0.Endpoint = b.addr
	fconn, err := clientconfig.Dial(cc0)
	if err != nil {
		t.Fatal(err)
	}
	defer fconn.Close()
	apps := fleetv1.NewApplianceServiceClient(fconn)
	waitUntil(t, "two live appliances, one leader", 20*time.Second, func() bool {
		resp, err := apps.ListAppliances(ctx, &fleetv1.ListAppliancesRequest{})
		roles := map[string]fleetv1.Appliance_Role{}
		for _, ap := range resp.GetAppliances() {
			roles[ap.GetName()] = ap.GetRole()
		}
		return err == nil && resp.GetLeader() == "a" && roles["a"] == fleetv1.Appliance_LEADER && roles["b"] == fleetv1.Appliance_RUNNER
	})
	// A token made offline on the fleet's store works on every appliance.
	out, err := runCmd(t, filepath.Join(binDir, "corrald"), "token", "create", "--role", "viewer", "--data-dir", t.TempDir(),
		"--store", "etcd", "--etcd-endpoints", c.EndpointsFlag(), "--etcd-prefix", "/e2e")
	if err != nil {
		t.Fatalf("corrald token create on etcd: %v\n%s", err, out)
	}
	viewer := strings.TrimSpace(out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:])
	cc, err := clientconfig.Load(filepath.Join(dirA, "admin.conf"))
	if err != nil {
		t.Fatal(err)
	}
	cc.Endpoint, cc.Token = b.addr, viewer
	vconn, err := clientconfig.Dial(cc)
	if err != nil {
		t.Fatal(err)
	}
	defer vconn.Close()
	if _, err := poolv1.NewNodeServiceClient(vconn).ListNodes(ctx, &poolv1.ListNodesRequest{}); err != nil {
		t.Fatalf("offline-made viewer token on b: %v", err)
	}
	// FetchArtifact is for peer appliances (and admins): a viewer and a
	// caller without credentials get nothing.
	sum := strings.Repeat("ab", 32)
	for name, conn := range map[string]*grpc.ClientConn{"viewer": vconn, "no token": noTokenConn(t, dirA, b.addr)} {
		st, err := fleetv1.NewApplianceServiceClient(conn).FetchArtifact(ctx, &fleetv1.FetchArtifactRequest{Sha256: sum})
		if err == nil {
			_, err = st.Recv()
		}
		want := codes.PermissionDenied
		if name == "no token" {
			want = codes.Unauthenticated
		}
		if status.Code(err) != want {
			t.Errorf("FetchArtifact as %s: %v, want %v", name, err, want)
		}
	}

	// Contention through both appliances: room for 10 one-core computes.
	var wg sync.WaitGroup
	var mu sync.Mutex
	won, exhausted := 0, 0
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := ca
			if i%2 == 1 {
				cl = cb
			}
			err := reserve(ctx, cl, fmt.Sprintf("c%02d", i))
			mu.Lock()
			defer mu.Unlock()
			switch status.Code(err) {
			case codes.OK:
				won++
			case codes.ResourceExhausted:
				exhausted++
			default:
				t.Errorf("reserve c%02d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if won != 10 || exhausted != 30 {
		t.Fatalf("40 reservations through two appliances on room for 10: %d won, %d exhausted", won, exhausted)
	}
	for _, cl := range []poolv1.NodeServiceClient{ca, cb} {
		n, err := cl.GetNode(ctx, &poolv1.GetNodeRequest{Name: "n1"})
		if err != nil || len(n.GetReservedComputes()) != 10 {
			t.Fatalf("node after contention: %d computes, %v", len(n.GetReservedComputes()), err)
		}
	}
	n0, err := cb.GetNode(ctx, &poolv1.GetNodeRequest{Name: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	for name := range n0.GetReservedComputes() {
		if _, err := ca.ReleaseCompute(ctx, &poolv1.ReleaseComputeRequest{NodeName: "n1", ComputeName: name}); err != nil {
			t.Fatal(err)
		}
	}

	// One member down: quorum holds, every write commits.
	c.Kill(2)
	if err := c.WaitHealthy(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		cl := ca
		if i%2 == 1 {
			cl = cb
		}
		if err := reserve(ctx, cl, fmt.Sprintf("q%d", i)); err != nil {
			t.Fatalf("with one etcd member down: %v", err)
		}
	}
	// Two down: no quorum. Calls fail with Unavailable, quickly and clearly.
	c.Kill(1)
	for _, cl := range []poolv1.NodeServiceClient{ca, cb} {
		start := time.Now()
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		err := reserve(cctx, cl, "lost")
		cancel()
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "quorum") {
			t.Fatalf("without quorum: %v, want Unavailable naming the lost quorum", err)
		}
		t.Logf("without quorum after %s: %v", time.Since(start).Round(time.Millisecond), err)
		if d := time.Since(start); d > 12*time.Second {
			t.Errorf("the refusal took %s", d)
		}
	}
	for _, i := range []int{1, 2} {
		if err := c.StartMember(i); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.WaitHealthy(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	var n *poolv1.Node
	deadline := time.Now().Add(20 * time.Second)
	for {
		var err error
		n, err = cb.GetNode(ctx, &poolv1.GetNodeRequest{Name: "n1"})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("fleet did not serve again after quorum returned: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	names := map[string]bool{}
	for name := range n.GetReservedComputes() {
		names[name] = true
	}
	for i := range 6 {
		if !names[fmt.Sprintf("q%d", i)] {
			t.Errorf("acknowledged reservation q%d lost: %v", i, names)
		}
	}
	if err := reserve(ctx, ca, "after"); err != nil {
		t.Fatalf("write after recovery: %v", err)
	}

	// SIGKILL the leader: the other appliance leads within the lease TTL.
	// The leader is the one whose corral_leader is 1 (after the quorum's
	// return above, once it has campaigned again); the other's is 0.
	leader, other := a, b
	waitUntil(t, "a leader again after the quorum's return (corral_leader 1)", 20*time.Second, func() bool {
		return scrapeValue(t, a.metrics, "corral_leader")+scrapeValue(t, b.metrics, "corral_leader") == 1
	})
	if scrapeValue(t, b.metrics, "corral_leader") == 1 {
		leader, other = b, a
	}
	otherChanges := scrapeValue(t, other.metrics, "corral_leader_changes_total")
	before := strings.Count(other.logs.String(), "leading the fleet")
	start := time.Now()
	if err := leader.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-leader.exited
	for strings.Count(other.logs.String(), "leading the fleet") == before {
		if time.Since(start) > 15*time.Second {
			t.Fatalf("no takeover within 15s of killing the leader (TTL 3s)")
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("leader takeover after SIGKILL: %s (lease TTL 3s)", time.Since(start).Round(time.Millisecond))
	waitUntil(t, "corral_leader 1 on the new leader", 10*time.Second, func() bool { return scrapeValue(t, other.metrics, "corral_leader") == 1 })
	if n := scrapeValue(t, other.metrics, "corral_leader_changes_total"); n != otherChanges+1 {
		t.Errorf("corral_leader_changes_total on the new leader: %v, want %v", n, otherChanges+1)
	}
	if other == b {
		resp, err := apps.ListAppliances(ctx, &fleetv1.ListAppliancesRequest{})
		if err != nil || resp.GetLeader() != "b" {
			t.Fatalf("ListAppliances after the takeover: leader %q, %v", resp.GetLeader(), err)
		}
	}
}

// noTokenConn dials addr over TLS with dataDir's CA and no token.
func noTokenConn(t *testing.T, dataDir, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := clientconfig.Load(filepath.Join(dataDir, "admin.conf"))
	if err != nil {
		t.Fatal(err)
	}
	cc.Endpoint, cc.Token = addr, ""
	conn, err := clientconfig.Dial(cc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// scrapeValue reads the unlabelled sample name from the /metrics at addr
// (-1 when it is absent).
func scrapeValue(t *testing.T, addr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %q", name, sc.Text())
			}
			return f
		}
	}
	return -1
}
