package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/api/clientconfig"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	webhookv1 "github.com/corralhq/corral/api/webhook/v1"
	"github.com/corralhq/corral/testsupport/redfishtest"
)

// hookReceiver is an HTTPS webhook receiver: it checks both signatures
// with its own HMAC code and keeps events by id (duplicates dropped).
type hookReceiver struct {
	srv     *httptest.Server
	secret  string
	mu      sync.Mutex
	down    bool
	block   chan struct{} // non-nil: every request waits on it
	ids     map[string]bool
	states  []string
	dups    int
	bad     int
	refused int
	// inflight counts requests being served (a blocked one included: the
	// server notices its client giving up only once it reads the body).
	inflight int
	// lossy: this many more new events are recorded and then answered 500,
	// as if the answer were lost: the appliance sends them again.
	lossy int
}

func newHookReceiver(t *testing.T) *hookReceiver {
	r := &hookReceiver{ids: map[string]bool{}}
	r.srv = httptest.NewTLSServer(http.HandlerFunc(r.serve))
	t.Cleanup(func() {
		r.mu.Lock()
		if r.block != nil {
			close(r.block)
			r.block = nil
		}
		r.mu.Unlock()
		r.srv.Close()
	})
	return r
}

func (r *hookReceiver) caFile(t *testing.T) string {
	p := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: r.srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func (r *hookReceiver) serve(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	down, block := r.down, r.block
	r.inflight++
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.inflight--
		r.mu.Unlock()
	}()
	if block != nil {
		select {
		case <-block:
		case <-req.Context().Done():
			return
		}
	}
	if down {
		r.mu.Lock()
		r.refused++
		r.mu.Unlock()
		http.Error(w, "down", http.StatusServiceUnavailable)
		return
	}
	body, _ := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	r.mu.Lock()
	defer r.mu.Unlock()
	key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(r.secret, "whsec_"))
	std := hmac.New(sha256.New, key)
	std.Write([]byte(req.Header.Get("webhook-id") + "." + req.Header.Get("webhook-timestamp") + "." + string(body)))
	hub := hmac.New(sha256.New, key)
	hub.Write(body)
	var ev struct {
		ID, Type, Subject, SpecVersion string
		Data                           struct{ State string }
	}
	if req.Header.Get("webhook-signature") != "v1,"+base64.StdEncoding.EncodeToString(std.Sum(nil)) ||
		req.Header.Get("X-Hub-Signature-256") != "sha256="+hex.EncodeToString(hub.Sum(nil)) ||
		req.Header.Get("Content-Type") != "application/cloudevents+json" || json.Unmarshal(body, &ev) != nil ||
		ev.ID != req.Header.Get("webhook-id") || ev.SpecVersion != "1.0" {
		r.bad++
		http.Error(w, "refused", http.StatusUnauthorized)
		return
	}
	first := !r.ids[ev.ID]
	if !first {
		r.dups++
	} else if ev.Type == "io.corral.machine.state_changed" && ev.Subject == "machine/rack1-u09" {
		r.ids[ev.ID] = true
		r.states = append(r.states, ev.Data.State)
	}
	if first && r.lossy > 0 {
		r.lossy--
		http.Error(w, "lost", http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (r *hookReceiver) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.states)
}

// TestE2EWebhooks: the built corrald posts every state change of a
// machine, in order and signed, to an HTTPS receiver that was down for a
// while (retried, nothing lost); a receiver that stops answering is cut
// off and counted while the other and the gRPC API stay fast, and once
// enabled again gets the changes that follow; plain http and loopback
// receivers are refused without their flags.
func TestE2EWebhooks(t *testing.T) {
	needE2E(t)
	rf := redfishtest.Start(t, "root", "e2e-bmc-Pa55-hooks", &redfishtest.MemMachine{})
	dataDir, addr := t.TempDir(), freePort(t)
	startCorrald(t, dataDir, addr, "CORRAL_WEBHOOK_QUEUE=32", "CORRAL_WEBHOOK_RETRY_INITIAL=50ms", "CORRAL_WEBHOOK_TIMEOUT=3s")
	conf := filepath.Join(dataDir, "admin.conf")
	corral := func(args ...string) (string, error) {
		out, err := exec.Command(filepath.Join(binDir, "corral"), append([]string{"--config", conf}, args...)...).CombinedOutput()
		return string(out), err
	}
	good, slow := newHookReceiver(t), newHookReceiver(t)

	// Refusals without the flags.
	for _, args := range [][]string{
		{"webhook", "add", "http://hooks.example.com/x", "--events", "audit"},
		{"webhook", "add", good.srv.URL, "--events", "machine.state", "--ca", good.caFile(t)},
		{"webhook", "add", strings.Replace(good.srv.URL, "127.0.0.1", "localhost", 1), "--events", "machine.state"},
	} {
		if out, err := corral(args...); err == nil || !strings.Contains(out, "allow") {
			t.Fatalf("corral %v: %v\n%s", args, err, out)
		}
	}
	secretRE := regexp.MustCompile(`whsec_[A-Za-z0-9+/=]+`)
	add := func(r *hookReceiver, name string) {
		out, err := corral("webhook", "add", r.srv.URL, "--name", name, "--events", "machine.state,health", "--ca", r.caFile(t), "--allow-boot-lan")
		if err != nil {
			t.Fatalf("add %s: %v\n%s", name, err, out)
		}
		r.mu.Lock()
		r.secret = secretRE.FindString(out)
		r.mu.Unlock()
	}
	good.mu.Lock()
	good.down = true
	good.mu.Unlock()
	slow.mu.Lock()
	slow.block = make(chan struct{})
	slow.mu.Unlock()
	add(good, "good")
	add(slow, "slow")

	cc, err := clientconfig.Load(conf)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := clientconfig.Dial(cc)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	mc := inventoryv1.NewMachineServiceClient(conn)
	const name = "rack1-u09"
	if _, err := mc.EnrollMachine(ctx, &inventoryv1.EnrollMachineRequest{Name: name, BmcAddress: rf.Host, BmcPort: uint32(rf.Port),
		BmcProtocol: inventoryv1.BmcProtocol_BMC_PROTOCOL_REDFISH, BmcUsername: "root", BmcPassword: "e2e-bmc-Pa55-hooks",
		BmcTlsSha256: rf.Fingerprint(), BootMac: "52:54:00:e2:e0:09"}); err != nil {
		t.Fatalf("enroll: %v", err)
	}
	m, err := mc.GetMachine(ctx, &inventoryv1.GetMachineRequest{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{m.GetState().String()}
	toggle := func(n int) {
		for i := range n {
			on := i%2 == 0
			got, err := mc.SetMaintenance(ctx, &inventoryv1.SetMaintenanceRequest{Name: name, On: on, Reason: "e2e"})
			if err != nil {
				t.Fatalf("maintenance %v: %v", on, err)
			}
			want = append(want, got.GetState().String())
		}
	}
	// The good receiver is down: 20 changes wait in its queue, retried.
	toggle(20)
	waitUntil(t, "several refused attempts", 30*time.Second, func() bool { good.mu.Lock(); defer good.mu.Unlock(); return good.refused >= 4 })
	good.mu.Lock()
	good.down, good.lossy = false, 5
	good.mu.Unlock()
	waitUntil(t, "every change delivered", 30*time.Second, func() bool { return len(good.got()) >= len(want) })
	if got := good.got(); !slices.Equal(got, want) {
		t.Fatalf("states delivered %v\nwant %v", got, want)
	}

	// 40 more changes: the blocked receiver's queue (32) overflows, it is
	// cut; the good one gets them all; the API stays fast.
	var worst time.Duration
	for range 20 {
		toggle(2)
		start := time.Now()
		if _, err := mc.ListMachines(ctx, &inventoryv1.ListMachinesRequest{}); err != nil {
			t.Fatal(err)
		}
		worst = max(worst, time.Since(start))
	}
	t.Logf("slowest ListMachines while a receiver overflowed: %v", worst)
	// Not a timing check: a producer that waited on the blocked receiver
	// would hold the API for the receiver's whole timeout or longer.
	if worst > 10*time.Second {
		t.Errorf("ListMachines took %v while a receiver overflowed", worst)
	}
	waitUntil(t, "every change delivered", 30*time.Second, func() bool { return len(good.got()) >= len(want) })
	if got := good.got(); !slices.Equal(got, want) {
		t.Fatalf("states delivered %v\nwant %v", got, want)
	}
	waitUntil(t, "the blocked receiver cut off", 20*time.Second, func() bool {
		resp, err := webhookv1.NewWebhookServiceClient(conn).ListWebhooks(ctx, &webhookv1.ListWebhooksRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range resp.GetReceivers() {
			if len(r.GetSealedSecret()) > 0 {
				t.Fatal("ListWebhooks returned a sealed secret")
			}
			if r.GetName() == "slow" {
				return r.GetCutAt() != nil && r.GetOverflowed() > 0
			}
		}
		return false
	})
	out, err := corral("webhook", "list")
	if err != nil || !regexp.MustCompile(`(?m)^slow\s+\S+\s+\S+\s+[1-9]\d*\s+20`).MatchString(out) {
		t.Fatalf("webhook list: %v\n%s", err, out)
	}
	good.mu.Lock()
	bad, dups := good.bad, good.dups
	good.mu.Unlock()
	if bad != 0 {
		t.Fatalf("%d requests failed verification", bad)
	}
	if dups < 5 {
		t.Fatalf("%d duplicates seen, want at least the 5 whose answers were lost", dups)
	}
	t.Logf("good receiver: %d changes, %d duplicates dropped by id", len(want), dups)

	// Answering again and enabled, the cut receiver gets the changes made
	// after the enable (not those dropped), signed with its unchanged
	// secret; enabling it twice is refused.
	slow.mu.Lock()
	close(slow.block)
	slow.block = nil
	slow.mu.Unlock()
	// Requests blocked before the cut finish now (their events, dropped
	// by the appliance long ago, are recorded): count from after them.
	waitUntil(t, "the blocked requests finished", 10*time.Second, func() bool { slow.mu.Lock(); defer slow.mu.Unlock(); return slow.inflight == 0 })
	before := len(slow.got())
	if out, err := corral("webhook", "enable", "slow"); err != nil || !strings.Contains(out, "webhook slow enabled") {
		t.Fatalf("webhook enable: %v\n%s", err, out)
	}
	if out, err := corral("webhook", "list"); err != nil || !regexp.MustCompile(`(?m)^slow\s+\S+\s+\S+\s+[1-9]\d*\s+-`).MatchString(out) {
		t.Fatalf("webhook list after enable: %v\n%s", err, out)
	}
	toggle(4)
	waitUntil(t, "the enabled receiver's changes", 30*time.Second, func() bool { return len(slow.got()) >= before+4 })
	if got := slow.got()[before:]; !slices.Equal(got, want[len(want)-4:]) {
		t.Fatalf("enabled receiver got %v, want %v", got, want[len(want)-4:])
	}
	slow.mu.Lock()
	bad = slow.bad
	slow.mu.Unlock()
	if bad != 0 {
		t.Fatalf("%d requests to the enabled receiver failed verification", bad)
	}
	if out, err := corral("webhook", "enable", "slow"); err == nil || !strings.Contains(out, "not cut off") {
		t.Fatalf("second enable: %v\n%s", err, out)
	}
	if out, err := corral("webhook", "remove", "slow"); err != nil {
		t.Fatalf("remove: %v\n%s", err, out)
	}
}
