package main

// Attack tests for the evidence (docs/security.md, "Audit retention
// classes", "Agent rate limits", "Timeline classes", "Node
// certificates"), against the built corrald: plain HTTP for boot scripts
// and images, a real gRPC client over TLS for the agent edge and the
// operator's reads. An attacker on the boot LAN with a public per-boot
// token and no operator token floods Register and boot HTTP; the
// operator's audit record and the victim's lifecycle and security
// entries are still there afterwards, the flood is refused with a clear
// status and counted in /metrics. A node certificate reads its own node
// record and no other.

import (
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	auditv1 "github.com/corralhq/corral/api/audit/v1"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/testsupport/machinefacts"
)

// metricValue is the sum of the samples of a metric whose line starts
// with prefix (a name and, optionally, its first labels) on /metrics.
func metricValue(t *testing.T, addr, prefix string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	sum, found := 0.0, false
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		sum, found = sum+v, true
	}
	if !found {
		t.Fatalf("no %s on /metrics:\n%s", prefix, b)
	}
	return sum
}

// getFrom is a plain HTTP GET of path from a source address (safe off
// the test's goroutine: it reports, never fails the test).
func getFrom(addr, from, path string) (int, error) {
	cl := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext:       (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}).DialContext,
		DisableKeepAlives: true,
	}}
	resp, err := cl.Get("http://" + addr + path)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// TestAttackEvidenceRegisterFlood: a flood of Register calls with a
// machine's public per-boot token is throttled (ResourceExhausted naming
// the limit), counted in /metrics, and the audit purge it provokes
// deletes boot-LAN records only: the operator's record made before the
// flood is still there.
func TestAttackEvidenceRegisterFlood(t *testing.T) {
	metrics := freePort(t)
	// Small audit caps, so the flood provokes the purge within the test
	// (it runs early past a quarter of the boot LAN's cap).
	c := startCredCorrald(t, "--metrics-listen", metrics, "--audit-max-events", "10", "--audit-max-agent-events", "40")
	ctx := context.Background()
	const victim = "52:54:00:ee:00:01"

	// The operator's action before the flood.
	const evidence = "evidence-before-flood"
	_, err := poolv1.NewNodeServiceClient(c.admin).DeleteNode(ctx, &poolv1.DeleteNodeRequest{Name: evidence})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("DeleteNode %s: %v; want NotFound", evidence, err)
	}
	audit := auditv1.NewAuditServiceClient(c.admin)
	operatorRecord := func() bool {
		t.Helper()
		resp, err := audit.ListEvents(ctx, &auditv1.ListEventsRequest{Object: "node/" + evidence, Limit: 10})
		if err != nil {
			t.Fatalf("ListEvents: %v", err)
		}
		return len(resp.GetEvents()) == 1 && strings.HasPrefix(resp.GetEvents()[0].GetWho(), "token:")
	}
	for deadline := time.Now().Add(10 * time.Second); !operatorRecord(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the operator's DeleteNode is not in the audit")
		}
	}

	// The flood: the victim's token, read off its public script.
	agent := c.agent(c.token(victim, "127.0.4.1"))
	facts := machinefacts.QEMU("SN-FLOOD-1", "6a1c0f3e-eeee-4a5b-9c2d-000000000001", victim)
	const calls, workers = 3000, 16
	var ok, limited, other atomic.Int64
	var otherErr atomic.Value
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < calls; i += workers {
				_, err := agent.Register(ctx, &nodev1.RegisterRequest{BootMac: victim, Facts: facts})
				switch {
				case err == nil:
					ok.Add(1)
				case status.Code(err) == codes.ResourceExhausted && strings.Contains(status.Convert(err).Message(), "over its rate limit"):
					limited.Add(1)
				default:
					other.Add(1)
					otherErr.Store(err.Error())
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	t.Logf("%d Register calls in %s: %d answered, %d refused ResourceExhausted, %d other", calls, took.Round(time.Millisecond), ok.Load(), limited.Load(), other.Load())
	if other.Load() > 0 {
		t.Errorf("%d calls failed otherwise, e.g. %v", other.Load(), otherErr.Load())
	}
	// The token's burst (10) and 1 a second after it.
	if most := int64(10 + took.Seconds() + 2); ok.Load() > most {
		t.Errorf("%d Register calls answered in %s; want at most %d (--agent-burst-per-token 10, --agent-rate-per-token 1)", ok.Load(), took, most)
	}
	if got := metricValue(t, metrics, "corral_agent_calls_limited_total"); got < float64(limited.Load()) {
		t.Errorf("corral_agent_calls_limited_total %v; want at least the %d refused", got, limited.Load())
	}

	// The purge the flood provoked keeps the boot LAN's records to their
	// cap (and the quarter of it stored since, which wakes the next
	// purge) and leaves the operator's alone.
	const lanMax = 40 + 40/4
	var lan int
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		resp, err := audit.ListEvents(ctx, &auditv1.ListEventsRequest{Method: "Register", Limit: 5000})
		if err != nil {
			t.Fatal(err)
		}
		lan = len(resp.GetEvents())
		if lan <= lanMax || time.Now().After(deadline) {
			break
		}
	}
	if lan > lanMax {
		t.Errorf("%d Register records in the audit after the purge; want at most %d (--audit-max-agent-events 40 and a quarter)", lan, lanMax)
	}
	if !operatorRecord() {
		t.Error("the operator's record made before the flood is gone from the audit")
	}
	if got := metricValue(t, metrics, `corral_audit_events_purged_total{class="operator"}`); got != 0 {
		t.Errorf("%v operator records purged; want 0", got)
	}
	if got := metricValue(t, metrics, `corral_audit_events_purged_total{class="boot_lan"}`); got == 0 {
		t.Error("no boot-LAN record purged: the test did not provoke the purge")
	}
}

// TestAttackEvidenceTimelineFlood: 2,500 unauthenticated GET
// /images/x?mac=VICTIM leave the victim's registration and its refused
// registration on its timeline; the flood's own entries are rate-limited
// and counted.
func TestAttackEvidenceTimelineFlood(t *testing.T) {
	metrics := freePort(t)
	c := startCredCorrald(t, "--metrics-listen", metrics)
	ctx := context.Background()
	const victim, attacker = "52:54:00:ee:01:01", "52:54:00:ee:01:02"

	// The victim registers; the attacker's Register for the victim's MAC
	// is refused (a security entry on the victim's timeline).
	if _, err := c.agent(c.token(victim, "127.0.5.1")).Register(ctx, &nodev1.RegisterRequest{BootMac: victim,
		Facts: machinefacts.QEMU("SN-TL-1", "6a1c0f3e-eeee-4a5b-9c2d-000000000101", victim)}); err != nil {
		t.Fatalf("the victim's Register: %v", err)
	}
	_, err := c.agent(c.token(attacker, "127.0.6.1")).Register(ctx, &nodev1.RegisterRequest{BootMac: victim,
		Facts: machinefacts.QEMU("SN-TL-1", "", victim)})
	wantCode(t, "the attacker's Register", err, codes.PermissionDenied, "the token was issued for boot MAC "+attacker)
	c.waitEntry(victim, "registered", "")
	c.waitEntry(victim, "register-refused", "the token was issued for boot MAC "+attacker)

	const gets, workers = 2500, 4
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for range gets / workers {
				if code, err := getFrom(c.http, fmt.Sprintf("127.0.7.%d", w+1), "/images/x?mac="+victim); code != http.StatusNotFound {
					t.Errorf("GET /images/x: %d, %v; want 404", code, err)
					return
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d GET /images/x?mac=%s in %s", gets, victim, time.Since(start).Round(time.Millisecond))

	// Both record entries are still there, and only a rate's worth of the
	// flood's.
	c.waitEntry(victim, "registered", "")
	c.waitEntry(victim, "register-refused", "the token was issued for boot MAC "+attacker)
	resp, err := inventoryv1.NewMachineServiceClient(c.admin).Timeline(ctx, &inventoryv1.TimelineRequest{Mac: victim, Limit: 5000})
	if err != nil {
		t.Fatal(err)
	}
	refused := 0
	for _, e := range resp.GetEntries() {
		if e.GetEvent() == "http-refused" {
			refused++
		}
	}
	// The MAC's burst (100) and 2 a second after it.
	if most := 100 + int(2*time.Since(start).Seconds()) + 2; refused > most {
		t.Errorf("%d http-refused entries of the flood recorded; want at most %d (--timeline-boot-lan-burst-per-mac 100, --timeline-boot-lan-rate-per-mac 2)", refused, most)
	}
	dropped := metricValue(t, metrics, `corral_timeline_entries_dropped_total{reason="rate_mac"}`) +
		metricValue(t, metrics, `corral_timeline_entries_dropped_total{reason="rate_source"}`)
	if dropped < float64(gets-refused-10) {
		t.Errorf("%v entries counted dropped over the rates; want about %d", dropped, gets-refused)
	}
}

// TestAttackEvidenceNodeCertReadsOtherNode: a node certificate reads its
// own node record and is refused another's, by name or by listing.
func TestAttackEvidenceNodeCertReadsOtherNode(t *testing.T) {
	p := startPKICorrald(t)
	ctx := context.Background()
	k := newPKICSR(t, &x509.CertificateRequest{})
	resp, err := pkiJoin(p.dial(p.nodeToken()), "node-a", k.pem)
	if err != nil {
		t.Fatal(err)
	}
	mine := poolv1.NewNodeServiceClient(p.dialCert(k.pair(t, resp.GetCertPem())))
	if _, err := mine.ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: "node-a", CpuMilliCores: 1000, MemoryBytes: 1 << 30}); err != nil {
		t.Fatalf("node-a applying itself: %v", err)
	}
	admin := poolv1.NewNodeServiceClient(p.dial(p.admin.Token))
	if _, err := admin.ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: "node-b", CpuMilliCores: 2000, MemoryBytes: 2 << 30,
		Annotations: map[string]string{"secret": "of node-b"}}); err != nil {
		t.Fatal(err)
	}
	if n, err := mine.GetNode(ctx, &poolv1.GetNodeRequest{Name: "node-a"}); err != nil || n.GetName() != "node-a" {
		t.Fatalf("node-a reading its own record: %v, %v", n, err)
	}
	n, err := mine.GetNode(ctx, &poolv1.GetNodeRequest{Name: "node-b"})
	wantCode(t, "node-a reading node-b", err, codes.PermissionDenied, `node certificate "node-a" may not read node "node-b"`)
	if n != nil {
		t.Errorf("a refused read answered %v", n)
	}
	_, err = mine.ListNodes(ctx, &poolv1.ListNodesRequest{})
	wantCode(t, "node-a listing nodes", err, codes.PermissionDenied, "ListNodes needs")
	stream, err := mine.WatchNodes(ctx, &poolv1.WatchNodesRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	wantCode(t, "node-a watching nodes", err, codes.PermissionDenied, "WatchNodes needs")
	// Operators are unaffected.
	if n, err := admin.GetNode(ctx, &poolv1.GetNodeRequest{Name: "node-b"}); err != nil || n.GetAnnotations()["secret"] != "of node-b" {
		t.Errorf("the operator reading node-b: %v, %v", n, err)
	}
	if l, err := admin.ListNodes(ctx, &poolv1.ListNodesRequest{}); err != nil || len(l.GetNodes()) != 2 {
		t.Errorf("the operator listing nodes: %v, %v; want 2", l, err)
	}
}
