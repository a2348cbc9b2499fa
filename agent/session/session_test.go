package session

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/auth/pki"
	"github.com/corralhq/corral/testsupport/syncbuf"
)

const token = "per-boot-token"

// fakeAppliance is a hand-written AgentService: it refuses the first
// `refuse` Registers with Unauthenticated, then accepts, and on Session
// sends `cmds` after the first heartbeat.
type fakeAppliance struct {
	nodev1.UnimplementedAgentServiceServer
	refuse int
	cmds   []*nodev1.ApplianceMessage
	// caPEM is the CA serve() made; install plans without one get it
	// unless noPlanCA is set.
	caPEM    string
	noPlanCA bool

	mu         sync.Mutex
	registers  []*nodev1.RegisterRequest
	attempts   int
	heartbeats int
	progress   []*nodev1.Progress
	csrs       []*nodev1.CertificateRequest
	beats      chan struct{}
	// onCSR answers a certificate request; an error ends the stream.
	onCSR func(stream grpc.BidiStreamingServer[nodev1.AgentMessage, nodev1.ApplianceMessage], req *nodev1.CertificateRequest) error
	// onProgress answers a progress message with commands (nil: none).
	onProgress func(p *nodev1.Progress) []*nodev1.ApplianceMessage
}

func (f *fakeAppliance) checkToken(ctx context.Context) error {
	md, _ := metadata.FromIncomingContext(ctx)
	if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer "+token {
		return status.Error(codes.Unauthenticated, "bad token")
	}
	return nil
}

func (f *fakeAppliance) Register(ctx context.Context, req *nodev1.RegisterRequest) (*nodev1.RegisterResponse, error) {
	if err := f.checkToken(ctx); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.attempts++
	if f.attempts <= f.refuse {
		return nil, status.Error(codes.Unauthenticated, "per-boot token expired")
	}
	f.registers = append(f.registers, req)
	return &nodev1.RegisterResponse{MachineName: "m-0001", SessionId: "s-1"}, nil
}

func (f *fakeAppliance) Session(stream grpc.BidiStreamingServer[nodev1.AgentMessage, nodev1.ApplianceMessage]) error {
	if err := f.checkToken(stream.Context()); err != nil {
		return err
	}
	first := true
	for {
		m, err := stream.Recv()
		if err != nil {
			return nil //nolint:nilerr // the agent closing its stream ends the fake's session cleanly
		}
		f.mu.Lock()
		if hb := m.GetHeartbeat(); hb != nil && hb.GetSessionId() == "s-1" {
			f.heartbeats++
			select {
			case f.beats <- struct{}{}:
			default:
			}
		}
		if p := m.GetProgress(); p != nil {
			f.progress = append(f.progress, p)
		}
		csr, onCSR := m.GetCsr(), f.onCSR
		if csr != nil {
			f.csrs = append(f.csrs, csr)
		}
		var answers []*nodev1.ApplianceMessage
		if p := m.GetProgress(); p != nil && f.onProgress != nil {
			answers = f.onProgress(p)
		}
		f.mu.Unlock()
		for _, c := range answers {
			if err := stream.Send(c); err != nil {
				return err
			}
		}
		if csr != nil && onCSR != nil {
			if err := onCSR(stream, csr); err != nil {
				return err
			}
		}
		if first {
			first = false
			for _, c := range f.cmds {
				if in := c.GetInstall(); in != nil && in.GetCaCertPem() == "" && !f.noPlanCA {
					// A plan names the CA the appliance serves with, as
					// corrald's does.
					c = proto.CloneOf(c)
					c.GetInstall().CaCertPem = f.caPEM
				}
				if err := stream.Send(c); err != nil {
					return err
				}
			}
		}
	}
}

// serve starts f over TLS on 127.0.0.1. chain selects whether the server
// sends its CA after the leaf. It returns the endpoint and the CA.
func serve(t *testing.T, f *fakeAppliance, chain bool) (string, *x509.Certificate) {
	t.Helper()
	ca, err := pki.EnsureCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	endpoint, caCert, _ := serveCA(t, f, ca, chain)
	return endpoint, caCert
}

// serveCA is serve with the appliance certificate from ca (appliances of
// one fleet share their CA); it also returns the server, to stop it.
func serveCA(t *testing.T, f *fakeAppliance, ca *pki.CA, chain bool) (string, *x509.Certificate, *grpc.Server) {
	t.Helper()
	return serveAt(t, f, ca, chain, "127.0.0.1:0")
}

// serveAt is serveCA listening on addr.
func serveAt(t *testing.T, f *fakeAppliance, ca *pki.CA, chain bool, addr string) (string, *x509.Certificate, *grpc.Server) {
	t.Helper()
	cert, err := ca.EnsureServerCert(t.TempDir(), []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(ca.CertPEM())
	caCert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if chain {
		cert.Certificate = append(cert.Certificate, caCert.Raw)
	}
	f.caPEM = string(ca.CertPEM())
	if f.beats == nil {
		f.beats = make(chan struct{}, 1)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))
	nodev1.RegisterAgentServiceServer(srv, f)
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String(), caCert, srv
}

// syncBuffer is a buffer safe for concurrent writers and the test.
type syncBuffer = syncbuf.Buffer

type fakePower struct {
	mu            sync.Mutex
	off, rebooted int
}

func (p *fakePower) PowerOff() error { p.mu.Lock(); p.off++; p.mu.Unlock(); return nil }
func (p *fakePower) Reboot() error   { p.mu.Lock(); p.rebooted++; p.mu.Unlock(); return nil }

func config(endpoint, fp string, console *syncBuffer, power Power) Config {
	return Config{
		Endpoints: []string{endpoint}, Token: token, CAFingerprint: fp, BootMAC: "52:54:00:12:34:56", AgentVersion: "test",
		Facts: func(context.Context) *inventoryv1.Facts {
			return &inventoryv1.Facts{System: &inventoryv1.Facts_System{Serial: "S1"}}
		},
		Power: power, Console: console,
		Heartbeat:  20 * time.Millisecond,
		RPCTimeout: 5 * time.Second,
		Backoff:    Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond},
	}
}

// waitFor polls cond until it holds or the test deadline nears.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestRegisterHeartbeatWaitOverPinnedTLS(t *testing.T) {
	for name, tc := range map[string]struct {
		chain    bool // server sends its CA
		extraCAs bool // agent has the CA from elsewhere
	}{
		"CA in server chain":   {chain: true},
		"CA from extra bundle": {extraCAs: true},
	} {
		t.Run(name, func(t *testing.T) {
			wait := &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Wait_{Wait: &nodev1.ApplianceMessage_Wait{}}}
			install := &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Install{Install: &nodev1.InstallPlan{Disk: "sda"}}}
			f := &fakeAppliance{cmds: []*nodev1.ApplianceMessage{wait, install}}
			endpoint, ca := serve(t, f, tc.chain)
			console := &syncBuffer{}
			power := &fakePower{}
			cfg := config(endpoint, Fingerprint(ca), console, power)
			if tc.extraCAs {
				cfg.ExtraCAs = []*x509.Certificate{ca}
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- Run(ctx, cfg) }()

			waitFor(t, "3 heartbeats and the install answer", func() bool {
				f.mu.Lock()
				defer f.mu.Unlock()
				return f.heartbeats >= 3 && len(f.progress) >= 1
			})
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run = %v, want nil after cancel", err)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if len(f.registers) != 1 {
				t.Fatalf("registers = %d, want 1", len(f.registers))
			}
			if r := f.registers[0]; r.GetBootMac() != "52:54:00:12:34:56" || r.GetFacts().GetSystem().GetSerial() != "S1" || r.GetAgentVersion() != "test" {
				t.Errorf("register request = %v", r)
			}
			if p := f.progress[0]; p.GetStep() != "install" || p.GetError() != "not supported by this agent yet" {
				t.Errorf("install answer = %v", p)
			}
			if power.off+power.rebooted != 0 {
				t.Errorf("wait caused power actions: off=%d reboot=%d", power.off, power.rebooted)
			}
			if !strings.Contains(console.String(), "registered as m-0001") {
				t.Errorf("console lacks the registration line:\n%s", console)
			}
		})
	}
}

func TestPowerCommands(t *testing.T) {
	for name, tc := range map[string]struct {
		cmd               *nodev1.ApplianceMessage
		wantOff, wantBoot int
	}{
		"power_off": {cmd: &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_PowerOff_{PowerOff: &nodev1.ApplianceMessage_PowerOff{}}}, wantOff: 1},
		"reboot":    {cmd: &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Reboot_{Reboot: &nodev1.ApplianceMessage_Reboot{}}}, wantBoot: 1},
	} {
		t.Run(name, func(t *testing.T) {
			f := &fakeAppliance{cmds: []*nodev1.ApplianceMessage{tc.cmd}}
			endpoint, ca := serve(t, f, true)
			power := &fakePower{}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go Run(ctx, config(endpoint, Fingerprint(ca), &syncBuffer{}, power))
			waitFor(t, name, func() bool {
				power.mu.Lock()
				defer power.mu.Unlock()
				return power.off == tc.wantOff && power.rebooted == tc.wantBoot
			})
		})
	}
}

func TestWrongFingerprintRefused(t *testing.T) {
	f := &fakeAppliance{}
	endpoint, _ := serve(t, f, true)
	console := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, config(endpoint, strings.Repeat("ab", 32), console, &fakePower{})) }()
	waitFor(t, "two refused attempts on the console", func() bool {
		return strings.Count(console.String(), "register with") >= 2
	})
	cancel()
	<-done
	out := console.String()
	t.Logf("console:\n%s", out)
	if !strings.Contains(out, "does not match the pinned CA fingerprint") || !strings.Contains(out, "abababababababab") {
		t.Errorf("console does not explain the refusal:\n%s", out)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.attempts != 0 {
		t.Errorf("server saw %d Register calls through a refused handshake", f.attempts)
	}
}

func TestUnauthenticatedRetried(t *testing.T) {
	f := &fakeAppliance{refuse: 3}
	endpoint, ca := serve(t, f, true)
	console := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go Run(ctx, config(endpoint, Fingerprint(ca), console, &fakePower{}))
	waitFor(t, "registration after 3 refusals", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		// The console line follows the Register reply.
		return len(f.registers) == 1 && strings.Contains(console.String(), "registered as")
	})
	out := console.String()
	for _, want := range []string{"(attempt 1): Unauthenticated: per-boot token expired", "(attempt 3): Unauthenticated", "registered as m-0001"} {
		if !strings.Contains(out, want) {
			t.Errorf("console lacks %q:\n%s", want, out)
		}
	}
}

func TestBackoff(t *testing.T) {
	b := Backoff{Initial: 100 * time.Millisecond, Max: time.Second, Jitter: 0.2}
	for name, tc := range map[string]struct {
		attempt  int
		min, max time.Duration
	}{
		"first":  {0, 80 * time.Millisecond, 120 * time.Millisecond},
		"third":  {2, 320 * time.Millisecond, 480 * time.Millisecond},
		"capped": {30, 800 * time.Millisecond, 1200 * time.Millisecond},
	} {
		for i := 0; i < 50; i++ {
			if d := b.Delay(tc.attempt); d < tc.min || d > tc.max {
				t.Errorf("%s: Delay(%d) = %v, want in [%v, %v]", name, tc.attempt, d, tc.min, tc.max)
			}
		}
	}
}

func TestConfigRejects(t *testing.T) {
	good := config("127.0.0.1:1", strings.Repeat("ab", 32), &syncBuffer{}, &fakePower{})
	for name, mutate := range map[string]func(*Config){
		"no endpoint":  func(c *Config) { c.Endpoints = nil },
		"bad endpoint": func(c *Config) { c.Endpoints = []string{"127.0.0.1:1", ""} },
		"9 endpoints": func(c *Config) {
			c.Endpoints = []string{"a:1", "b:1", "c:1", "d:1", "e:1", "f:1", "g:1", "h:1", "i:1"}
		},
		"no token": func(c *Config) { c.Token = "" },
		"bad pin":  func(c *Config) { c.CAFingerprint = "abc" },
		"no mac":   func(c *Config) { c.BootMAC = "" },
		"no facts": func(c *Config) { c.Facts = nil },
		"no power": func(c *Config) { c.Power = nil },
	} {
		c := good
		mutate(&c)
		if err := Run(context.Background(), c); err == nil {
			t.Errorf("%s: Run accepted the config", name)
		}
	}
}
