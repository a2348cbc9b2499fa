package webhook

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	auditv1 "github.com/corralhq/corral/api/audit/v1"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	webhookv1 "github.com/corralhq/corral/api/webhook/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/store/record"
)

// verifyStandard is an independent Standard Webhooks verifier: it takes
// the secret as printed and the request as received.
func verifyStandard(secret string, h http.Header, body []byte) error {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return err
	}
	signed := h.Get("webhook-id") + "." + h.Get("webhook-timestamp") + "." + string(body)
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(signed))
	want := mac.Sum(nil)
	for _, sig := range strings.Fields(h.Get("webhook-signature")) {
		v, b64, ok := strings.Cut(sig, ",")
		if !ok || v != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(b64)
		if err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return errors.New("no valid v1 signature")
}

func verifyHub(secret string, h http.Header, body []byte) error {
	key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	mac := hmac.New(sha256.New, key)
	mac.Write(body)
	if h.Get("X-Hub-Signature-256") != "sha256="+hex.EncodeToString(mac.Sum(nil)) {
		return errors.New("bad X-Hub-Signature-256")
	}
	return nil
}

func TestSignatures(t *testing.T) {
	// Standard Webhooks' published example (its specification's test
	// vector).
	key, err := ParseSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		t.Fatal(err)
	}
	std, _ := Signatures(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, []byte(`{"test": 2432232314}`))
	if want := "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; std != want {
		t.Fatalf("signature %q, want %q", std, want)
	}
	// A fresh secret, checked by the independent verifiers.
	key, printed, err := NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"specversion":"1.0"}`)
	h := http.Header{}
	SetHeaders(h, key, "evt_1", 1700000000, body)
	if err := verifyStandard(printed, h, body); err != nil {
		t.Fatal(err)
	}
	if err := verifyHub(printed, h, body); err != nil {
		t.Fatal(err)
	}
	if err := verifyStandard(printed, h, append(body, ' ')); err == nil {
		t.Fatal("a changed body verified")
	}
	h.Set("webhook-timestamp", "1700000001")
	if err := verifyStandard(printed, h, body); err == nil {
		t.Fatal("a changed timestamp verified")
	}
	if h.Get("Content-Type") != "application/cloudevents+json" {
		t.Fatalf("content type %q", h.Get("Content-Type"))
	}
}

func TestEnvelope(t *testing.T) {
	at := time.Date(2026, 11, 29, 12, 0, 0, 5, time.FixedZone("x", 3600))
	e := &Event{ID: EventID(ClassMachineState, "/inventory/machines/m1", 42), Class: ClassMachineState, Type: TypeMachineState,
		Subject: "machine/m1", Time: at, Data: json.RawMessage(`{"state":"READY"}`)}
	b, err := Encode(e, "corral://rack-1")
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"specversion": "1.0", "id": e.ID, "source": "corral://rack-1", "type": "io.corral.machine.state_changed",
		"subject": "machine/m1", "time": "2026-11-29T11:00:00.000000005Z", "datacontenttype": "application/json",
		"data": map[string]any{"state": "READY"}}
	if d := gocmp.Diff(want, got); d != "" {
		t.Fatalf("envelope (-want +got):\n%s", d)
	}
	if EventID(ClassMachineState, "/inventory/machines/m1", 42) != e.ID || EventID(ClassMachineState, "/inventory/machines/m1", 43) == e.ID {
		t.Fatal("event ids are not a function of key and revision")
	}
}

func TestBackoffSchedule(t *testing.T) {
	// The schedule: doubling from the initial pause, jitter within ±50 %,
	// capped; checked on the pauses themselves, not on a clock.
	d, err := NewDispatcher(Config{Store: mem.New(), Service: NewService(mem.New(), plainSealer{}, Guard{}, nil),
		InitialInterval: 20 * time.Millisecond, MaxInterval: 80 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	jittered := false
	for range 50 {
		b := d.newBackOff()
		for i := range 6 {
			base := min(20*time.Millisecond<<i, 80*time.Millisecond)
			p := b.NextBackOff()
			if p < base/2 || p > base*3/2 {
				t.Fatalf("pause %d: %v, want %v ±50%%", i, p, base)
			}
			jittered = jittered || p != base
		}
	}
	if !jittered {
		t.Fatal("no pause was jittered")
	}
	// Bounded attempts: a receiver that always fails gets MaxAttempts,
	// then the event is counted as failed.
	var mu sync.Mutex
	attempts := 0
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		attempts++
		mu.Unlock()
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	d, tg := testTarget(t, srv, Config{InitialInterval: time.Millisecond, MaxInterval: 4 * time.Millisecond, MaxAttempts: 6})
	d.deliver(context.Background(), tg, &Event{ID: "evt_x", body: []byte("{}"), queued: time.Now()})
	mu.Lock()
	defer mu.Unlock()
	if attempts != 6 {
		t.Fatalf("%d attempts, want 6", attempts)
	}
	if v := value(d.metrics.deliveries.WithLabelValues(tg.name, "failed")); v != 1 {
		t.Fatalf("failed deliveries %v, want 1", v)
	}
}

func TestGuard(t *testing.T) {
	rs, err := ParseBootRange("10.9.0.0/24=10.9.0.100-10.9.0.200@10.9.0.1")
	if err != nil {
		t.Fatal(err)
	}
	local, err := ParseBootRange("192.168.50.100-192.168.50.199/24")
	if err != nil {
		t.Fatal(err)
	}
	g := Guard{BootLAN: append(rs, append(local, PrefixRange(netip.MustParsePrefix("fd00:1::/64")))...)}
	tests := map[string]struct {
		url                    string
		insecure, bootLAN, bad bool
	}{
		"https name":             {url: "https://hooks.example.com/x"},
		"http refused":           {url: "http://hooks.example.com/x", bad: true},
		"http allowed":           {url: "http://hooks.example.com/x", insecure: true},
		"loopback refused":       {url: "https://127.0.0.1:8443/", bad: true},
		"localhost refused":      {url: "https://localhost:8443/", bad: true},
		"loopback allowed":       {url: "https://127.0.0.1:8443/", bootLAN: true},
		"link-local refused":     {url: "https://[fe80::1]/", bad: true},
		"relay subnet refused":   {url: "https://10.9.0.5/", bad: true},
		"dhcp range refused":     {url: "https://192.168.50.150/", bad: true},
		"outside range":          {url: "https://192.168.50.20/"},
		"v6 boot LAN refused":    {url: "https://[fd00:1::9]/", bad: true},
		"mapped v4 refused":      {url: "https://[::ffff:127.0.0.1]/", bad: true},
		"user info refused":      {url: "https://u:p@hooks.example.com/", bad: true},
		"other scheme refused":   {url: "ftp://hooks.example.com/", bad: true},
		"boot LAN with the flag": {url: "https://10.9.0.5/", bootLAN: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := g.CheckURL(tc.url, tc.insecure, tc.bootLAN)
			if (err != nil) != tc.bad {
				t.Fatalf("CheckURL(%q) = %v, want refused %v", tc.url, err, tc.bad)
			}
		})
	}
	// The dialled address decides, whatever the name was.
	ctl := g.Control(false)
	for addr, bad := range map[string]bool{"127.0.0.1:443": true, "10.9.0.7:443": true, "[fe80::2]:443": true, "8.8.8.8:443": false, "[2001:db8::1]:443": false} {
		if err := ctl("tcp", addr, nil); (err != nil) != bad || (err != nil && !errors.Is(err, ErrRefused)) {
			t.Errorf("Control(%s) = %v, want refused %v", addr, err, bad)
		}
	}
}

// plainSealer is a Sealer for tests: it binds a blob to its associated
// data without encrypting.
type plainSealer struct{}

func (plainSealer) Seal(p, ad []byte) ([]byte, error) {
	return append(append([]byte{}, ad...), append([]byte{0}, p...)...), nil
}
func (plainSealer) Open(b, ad []byte) ([]byte, error) {
	a, p, ok := strings.Cut(string(b), "\x00")
	if !ok || a != string(ad) {
		return nil, errors.New("wrong associated data")
	}
	return []byte(p), nil
}

func testTarget(t *testing.T, srv *httptest.Server, cfg Config) (*Dispatcher, *target) {
	t.Helper()
	st := mem.New()
	cfg.Store, cfg.Service = st, NewService(st, plainSealer{}, Guard{}, nil)
	cfg.Registerer = prometheus.NewRegistry()
	d, err := NewDispatcher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	key, _, _ := NewSecret()
	sealed, _ := plainSealer{}.Seal(key, sealAD("t"))
	tg, err := d.newTarget(&webhookv1.Receiver{Name: "t", Url: srv.URL, AllowBootLan: true, SealedSecret: sealed, CaPem: caPEM(srv)})
	if err != nil {
		t.Fatal(err)
	}
	return d, tg
}

func caPEM(srv *httptest.Server) []byte {
	return pemCert(srv.Certificate().Raw)
}

// receiver is an HTTPS webhook receiver for tests: it verifies every
// request and keeps the events, dropping duplicates by id.
type receiver struct {
	t      *testing.T
	srv    *httptest.Server
	secret string
	mu     sync.Mutex
	down   bool
	delay  time.Duration
	seen   map[string]bool
	events []map[string]any
	dups   int
	bad    int
	// refused counts requests answered 503 while down.
	refused int
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{t: t, seen: map[string]bool{}}
	r.srv = httptest.NewUnstartedServer(http.HandlerFunc(r.serve))
	r.srv.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	r.srv.StartTLS()
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	down, delay := r.down, r.delay
	r.mu.Unlock()
	if delay > 0 {
		time.Sleep(delay)
	}
	if down {
		r.mu.Lock()
		r.refused++
		r.mu.Unlock()
		http.Error(w, "down", http.StatusServiceUnavailable)
		return
	}
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	defer r.mu.Unlock()
	if verifyStandard(r.secret, req.Header, body) != nil || verifyHub(r.secret, req.Header, body) != nil {
		r.bad++
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	var ev map[string]any
	if err := json.Unmarshal(body, &ev); err != nil || ev["id"] != req.Header.Get("webhook-id") {
		r.bad++
		http.Error(w, "bad event", http.StatusBadRequest)
		return
	}
	if r.seen[ev["id"].(string)] {
		r.dups++
	} else {
		r.seen[ev["id"].(string)] = true
		r.events = append(r.events, ev)
	}
	w.WriteHeader(http.StatusNoContent)
}

func (r *receiver) states(machine string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, ev := range r.events {
		if ev["type"] == TypeMachineState && ev["subject"] == "machine/"+machine {
			out = append(out, ev["data"].(map[string]any)["state"].(string))
		}
	}
	return out
}

func setState(t *testing.T, st store.Store, name string, s inventoryv1.Machine_MachineState) {
	t.Helper()
	if _, err := record.Update(context.Background(), st, store.MachinesPrefix+name, func() *inventoryv1.Machine { return &inventoryv1.Machine{} },
		func(m *inventoryv1.Machine, _ bool) (bool, error) {
			m.Name, m.State, m.UpdatedAt = name, s, timestamppb.Now()
			return false, nil
		}); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, what string, d time.Duration, ok func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !ok() {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestDispatch: every state change of a machine arrives in order, with
// valid signatures, after the receiver was down for a while; a receiver
// that cannot keep up is cut off and counted while another keeps
// receiving.
func TestDispatch(t *testing.T) {
	st := mem.NewWithHistory(10000, 0)
	svc := NewService(st, plainSealer{}, Guard{}, nil)
	reg := prometheus.NewRegistry()
	d, err := NewDispatcher(Config{Store: st, Service: svc, Registerer: reg, QueueSize: 64, InitialInterval: 10 * time.Millisecond,
		MaxInterval: 100 * time.Millisecond, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	good, slow := newReceiver(t), newReceiver(t)
	add := func(r *receiver, name string) {
		_, secret, err := svc.Add(ctx, &webhookv1.AddWebhookRequest{Name: name, Url: r.srv.URL, Events: []string{"machine.state"}, AllowBootLan: true, CaPem: caPEM(r.srv)})
		if err != nil {
			t.Fatal(err)
		}
		r.secret = secret
	}
	add(good, "good")
	add(slow, "slow")
	waitFor(t, "receivers served", 5*time.Second, func() bool { d.mu.Lock(); defer d.mu.Unlock(); return len(d.targets) == 2 })

	good.mu.Lock()
	good.down = true
	good.mu.Unlock()
	slow.mu.Lock()
	slow.delay = time.Second
	slow.mu.Unlock()

	cycle := []inventoryv1.Machine_MachineState{inventoryv1.Machine_INVENTORIED, inventoryv1.Machine_READY, inventoryv1.Machine_ALLOCATED, inventoryv1.Machine_DEPLOYING, inventoryv1.Machine_DEPLOYED}
	var want []string
	for i := range 40 {
		s := cycle[i%len(cycle)]
		setState(t, st, "m1", s)
		want = append(want, s.String())
	}
	waitFor(t, "several refused attempts", 10*time.Second, func() bool { good.mu.Lock(); defer good.mu.Unlock(); return good.refused >= 3 })
	good.mu.Lock()
	good.down = false
	good.mu.Unlock()
	waitFor(t, "every state change", 20*time.Second, func() bool { return len(good.states("m1")) >= len(want) })
	if got := good.states("m1"); !slices.Equal(got, want) {
		t.Fatalf("states %v, want %v", got, want)
	}
	if good.bad != 0 {
		t.Fatalf("%d requests failed verification", good.bad)
	}
	if v := value(d.metrics.deliveries.WithLabelValues("good", "retry")); v == 0 {
		t.Fatal("no retries counted while the receiver was down")
	}
	// 40 changes in a queue of 64 with a slow receiver: not cut yet.
	// 100 more, paced so the good receiver keeps up, overflow it.
	for i := range 100 {
		setState(t, st, "m2", cycle[i%len(cycle)])
		time.Sleep(5 * time.Millisecond)
	}
	waitFor(t, "the slow receiver cut off", 10*time.Second, func() bool {
		return value(d.metrics.overflow.WithLabelValues("slow")) > 0
	})
	waitFor(t, "the cut recorded", 10*time.Second, func() bool {
		rs, _, err := svc.List(ctx, 0, "")
		return err == nil && slices.ContainsFunc(rs, func(r *webhookv1.Receiver) bool {
			return r.GetName() == "slow" && r.GetCutAt() != nil && r.GetOverflowed() > 0
		})
	})
	waitFor(t, "the good receiver's m2 changes", 10*time.Second, func() bool { return len(good.states("m2")) == 100 })
	if v := value(d.metrics.cut.WithLabelValues("slow")); v != 1 {
		t.Fatalf("cut gauge %v", v)
	}
	if n := len(good.states("m2")); n != 100 {
		t.Fatalf("good receiver got %d of 100", n)
	}

	// Enabled again, the cut receiver gets what comes after, with the
	// same secret (its requests verify), and keeps its overflow count.
	slow.mu.Lock()
	slow.delay = 0
	slow.mu.Unlock()
	r, err := svc.Enable(ctx, "slow")
	if err != nil {
		t.Fatal(err)
	}
	if r.GetCutAt() != nil || r.GetCutReason() != "" || r.GetOverflowed() == 0 || len(r.GetSealedSecret()) != 0 {
		t.Fatalf("enabled receiver %v: want no cut, the overflow count kept, no secret", r)
	}
	waitFor(t, "the slow receiver served again", 5*time.Second, func() bool { return value(d.metrics.cut.WithLabelValues("slow")) == 0 })
	slowBefore := len(slow.states("m3"))
	for i := range 5 {
		setState(t, st, "m3", cycle[i%len(cycle)])
	}
	waitFor(t, "the enabled receiver's m3 changes", 10*time.Second, func() bool { return len(slow.states("m3")) == slowBefore+5 })
	if got, want := slow.states("m3")[slowBefore:], []string{"INVENTORIED", "READY", "ALLOCATED", "DEPLOYING", "DEPLOYED"}; !slices.Equal(got, want) {
		t.Fatalf("enabled receiver got %v, want %v", got, want)
	}
	if slow.bad != 0 {
		t.Fatalf("%d requests to the enabled receiver failed verification", slow.bad)
	}
	for name, want := range map[string]error{"slow": apierr.ErrPrecondition, "nope": apierr.ErrNotFound, "Bad_Name": apierr.ErrInvalid} {
		if _, err := svc.Enable(ctx, name); !errors.Is(err, want) {
			t.Errorf("Enable(%q) = %v, want %v", name, err, want)
		}
	}
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// value reads a counter's or gauge's value.
func value(c prometheus.Collector) float64 {
	reg := prometheus.NewRegistry()
	if err := reg.Register(c); err != nil {
		return -1
	}
	mfs, err := reg.Gather()
	if err != nil || len(mfs) == 0 || len(mfs[0].GetMetric()) == 0 {
		return -1
	}
	m := mfs[0].GetMetric()[0]
	if m.GetCounter() != nil {
		return m.GetCounter().GetValue()
	}
	return m.GetGauge().GetValue()
}

// TestHealthAndAudit: BMC reachability, BMC health status and node state
// changes arrive as health conditions, audit records as audit events,
// each only to receivers subscribed to its class.
func TestHealthAndAudit(t *testing.T) {
	st := mem.NewWithHistory(1000, 0)
	svc := NewService(st, plainSealer{}, Guard{}, nil)
	d, err := NewDispatcher(Config{Store: st, Service: svc, Registerer: prometheus.NewRegistry(), InitialInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() { cancel(); <-done }()
	r := newReceiver(t)
	_, secret, err := svc.Add(ctx, &webhookv1.AddWebhookRequest{Name: "ops", Url: r.srv.URL, Events: []string{"health", "audit"}, AllowBootLan: true, CaPem: caPEM(r.srv)})
	if err != nil {
		t.Fatal(err)
	}
	r.secret = secret
	waitFor(t, "receiver served", 5*time.Second, func() bool { d.mu.Lock(); defer d.mu.Unlock(); return len(d.targets) == 1 })

	put := func(key string, m proto.Message) {
		t.Helper()
		kv, err := st.Get(ctx, key)
		rev := kv.Revision
		if errors.Is(err, store.ErrNotFound) {
			rev = 0
		}
		if _, err := record.Put(ctx, st, key, m, rev); err != nil {
			t.Fatal(err)
		}
	}
	m := &inventoryv1.Machine{Name: "m1", State: inventoryv1.Machine_READY, PowerState: inventoryv1.PowerState_POWER_STATE_OFF}
	put(store.MachinesPrefix+"m1", m)
	m.PowerState = inventoryv1.PowerState_POWER_STATE_UNKNOWN
	put(store.MachinesPrefix+"m1", m)
	m.PowerState = inventoryv1.PowerState_POWER_STATE_ON
	m.Bmc = &inventoryv1.Bmc{Health: &inventoryv1.BmcHealth{Status: "critical"}}
	put(store.MachinesPrefix+"m1", m)
	put(store.NodesPrefix+"n1", &poolv1.Node{Name: "n1", State: poolv1.Node_READY})
	put(store.NodesPrefix+"n1", &poolv1.Node{Name: "n1", State: poolv1.Node_NOT_READY})
	put(store.AuditPrefix+"0001", &auditv1.AuditEvent{Id: "0001", Method: "/corral.inventory.v1.MachineService/SetPower", Object: "machine/m1", At: timestamppb.Now()})

	var got []string
	waitFor(t, "six events", 10*time.Second, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		got = got[:0]
		for _, ev := range r.events {
			data := ev["data"].(map[string]any)
			switch ev["type"] {
			case TypeHealth:
				got = append(got, fmt.Sprintf("%s %v %v", ev["subject"], data["condition"], cmp.Or(data["state"], data["status"])))
			case TypeAudit:
				got = append(got, fmt.Sprintf("audit %v %v", ev["subject"], data["method"]))
			default:
				got = append(got, fmt.Sprint("unexpected ", ev["type"]))
			}
		}
		return len(got) >= 6
	})
	slices.Sort(got)
	want := []string{
		"audit machine/m1 /corral.inventory.v1.MachineService/SetPower",
		"machine/m1 bmc_health critical",
		"machine/m1 bmc_reachable <nil>",
		"machine/m1 bmc_unreachable <nil>",
		"node/n1 node_state NOT_READY",
		"node/n1 node_state READY",
	}
	if d := gocmp.Diff(want, got); d != "" {
		t.Fatalf("events (-want +got):\n%s", d)
	}
}
