package session

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/auth/pki"
)

// fleetCA is the CA every appliance of a test fleet serves with.
func fleetCA(t *testing.T) *pki.CA {
	t.Helper()
	ca, err := pki.EnsureCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func caFingerprint(t *testing.T, ca *pki.CA) string {
	t.Helper()
	block, _ := pem.Decode(ca.CertPEM())
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return Fingerprint(c)
}

// deadEndpoint is a loopback address nothing listens on.
func deadEndpoint(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}

// silentEndpoint accepts connections and never answers (a hung
// appliance).
func silentEndpoint(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		lis.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return lis.Addr().String()
}

func (f *fakeAppliance) registered() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.registers)
}

func (f *fakeAppliance) registerCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.attempts
}

// TestRegisterFailsOver: when the first appliance is gone, hangs, or is
// not of the pinned CA, the agent registers on the next one of the list
// (same fleet CA) and carries out the install plan that appliance sends.
func TestRegisterFailsOver(t *testing.T) {
	for name, tc := range map[string]struct {
		first      func(t *testing.T) (endpoint string, f *fakeAppliance)
		rpcTimeout time.Duration
		console    []string // the first endpoint's refusal on the console
	}{
		"first dead": {
			first:   func(t *testing.T) (string, *fakeAppliance) { return deadEndpoint(t), nil },
			console: []string{"failed (attempt 1): Unavailable"},
		},
		"first does not answer": {
			first:      func(t *testing.T) (string, *fakeAppliance) { return silentEndpoint(t), nil },
			rpcTimeout: 300 * time.Millisecond,
			console:    []string{"failed (attempt 1): DeadlineExceeded"},
		},
		"first of another CA": {
			first: func(t *testing.T) (string, *fakeAppliance) {
				f := &fakeAppliance{}
				ep, _ := serve(t, f, true)
				return ep, f
			},
			console: []string{"failed (attempt 1): Unavailable", "does not match the pinned CA fingerprint"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			ca := fleetCA(t)
			first, other := tc.first(t)
			b := &fakeAppliance{cmds: []*nodev1.ApplianceMessage{installCmd("i-1")}}
			epB, caCert, _ := serveCA(t, b, ca, true)
			console := &syncBuffer{}
			inst := &fakeInstaller{release: make(chan struct{})}
			close(inst.release)
			cfg := config(first, Fingerprint(caCert), console, &fakePower{})
			cfg.Endpoints = []string{first, epB}
			cfg.Installer = inst
			if tc.rpcTimeout > 0 {
				cfg.RPCTimeout = tc.rpcTimeout
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- Run(ctx, cfg) }()
			waitFor(t, "the plan carried out through the second appliance", func() bool {
				return len(b.progressOf("i-1")) == 2
			})
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run = %v", err)
			}
			if got := b.progressOf("i-1"); strings.Join(got, "|") != "disk|done (done)" {
				t.Errorf("progress on B = %q", got)
			}
			if other != nil && other.registerCalls() != 0 {
				t.Errorf("the appliance of another CA saw %d Register calls through a refused handshake", other.registerCalls())
			}
			out := console.String()
			for _, want := range append([]string{"register with " + first + " ", "registered as m-0001 with " + epB}, tc.console...) {
				if !strings.Contains(out, want) {
					t.Errorf("console lacks %q:\n%s", want, out)
				}
			}
		})
	}
}

// TestSessionFailsOver: the appliance holding the session stops in the
// middle of an install; the agent registers on the next appliance of the
// fleet, the install keeps running and its progress and certificate
// request go there, and a plan sent there again for the same install is
// not run twice.
func TestSessionFailsOver(t *testing.T) {
	ca := fleetCA(t)
	a := &fakeAppliance{cmds: []*nodev1.ApplianceMessage{installCmd("i-1")}}
	epA, caCert, srvA := serveCA(t, a, ca, true)
	b := &fakeAppliance{cmds: []*nodev1.ApplianceMessage{installCmd("i-1")}}
	epB, _, _ := serveCA(t, b, ca, true)
	console := &syncBuffer{}
	inst := &fakeInstaller{release: make(chan struct{})}
	cfg := config(epA, Fingerprint(caCert), console, &fakePower{})
	cfg.Endpoints = []string{epA, epB}
	cfg.Installer = inst
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()

	waitFor(t, "the install's first step on A", func() bool { return len(a.progressOf("i-1")) == 1 })
	stopped := time.Now()
	srvA.Stop()
	waitFor(t, "a session with B", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.heartbeats >= 1
	})
	took := time.Since(stopped)
	// B sends its plan after the heartbeat is counted: release the
	// install only once the agent has seen that plan while it runs.
	waitFor(t, "B's plan found running", func() bool { return strings.Contains(console.String(), "install plan i-1 is already running") })
	close(inst.release)
	waitFor(t, "the install's end reported to B", func() bool { return len(b.progressOf("i-1")) >= 1 })
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v", err)
	}
	t.Logf("session on B %v after A stopped", took.Round(time.Millisecond))
	if got := b.progressOf("i-1"); got[len(got)-1] != "done (done)" {
		t.Errorf("progress on B = %q, want the install's done", got)
	}
	inst.mu.Lock()
	if strings.Join(inst.installs, ",") != "i-1" {
		t.Errorf("installs %v, want i-1 once", inst.installs)
	}
	inst.mu.Unlock()
	out := console.String()
	for _, want := range []string{
		"registered as m-0001 with " + epA,
		"session with " + epA + " ended: ",
		"registering with " + epB,
		"registered as m-0001 with " + epB,
		"install plan i-1 is already running",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("console lacks %q:\n%s", want, out)
		}
	}
}

// TestRegisterCyclesWithBackoff: with every appliance gone the agent
// tries them in turn, without a pause inside a round and with a growing
// backoff between rounds, and registers as soon as one comes back.
func TestRegisterCyclesWithBackoff(t *testing.T) {
	ca := fleetCA(t)
	eps := []string{deadEndpoint(t), deadEndpoint(t), deadEndpoint(t)}
	console := &syncBuffer{}
	cfg := config(eps[0], caFingerprint(t, ca), console, &fakePower{})
	cfg.Endpoints = eps
	cfg.Backoff = Backoff{Initial: 40 * time.Millisecond, Max: 200 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()
	waitFor(t, "three rounds", func() bool { return strings.Count(console.String(), "failed (attempt") >= 9 })
	out := console.String()
	var order []string
	for _, l := range strings.Split(out, "\n") {
		for i, e := range eps {
			if strings.Contains(l, "register with "+e+" failed") {
				order = append(order, fmt.Sprint(i))
			}
		}
	}
	if got := strings.Join(order[:9], ""); got != "012012012" {
		t.Errorf("endpoint order %s, want 012012012:\n%s", got, out)
	}
	if !strings.Contains(out, "(attempt 9)") {
		t.Errorf("attempts are not numbered across endpoints:\n%s", out)
	}
	// The third appliance comes back on its address.
	b := &fakeAppliance{}
	epB, _, _ := serveAt(t, b, ca, true, eps[2])
	waitFor(t, "registration on the appliance that came back", func() bool { return b.registered() == 1 })
	// The appliance counts the call before the agent has its answer and
	// says so on the console: wait for the line, do not race it.
	waitFor(t, "the console's word of the registration", func() bool {
		return strings.Contains(console.String(), "registered as m-0001 with "+epB)
	})
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v", err)
	}
}
