package node

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/testsupport/syncbuf"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestNewAppliances(t *testing.T) {
	for name, tc := range map[string]struct {
		in      []string
		want    []string
		wantErr string
	}{
		"one":         {in: []string{"a:1"}, want: []string{"a:1"}},
		"order, once": {in: []string{"b:1", "a:1", "b:1"}, want: []string{"b:1", "a:1"}},
		"eight":       {in: []string{"a:1", "b:1", "c:1", "d:1", "e:1", "f:1", "g:1", "h:1"}, want: []string{"a:1", "b:1", "c:1", "d:1", "e:1", "f:1", "g:1", "h:1"}},
		"none":        {wantErr: "no appliance endpoint"},
		"nine":        {in: []string{"a:1", "b:1", "c:1", "d:1", "e:1", "f:1", "g:1", "h:1", "i:1"}, wantErr: "9 appliance endpoints, at most 8"},
		"empty":       {in: []string{"a:1", ""}, wantErr: `appliance endpoint 2 "": want host:port`},
		"no port":     {in: []string{"appliance"}, wantErr: `appliance endpoint 1 "appliance": want host:port`},
	} {
		t.Run(name, func(t *testing.T) {
			a, err := NewAppliances(tc.in, nil)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("NewAppliances = %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, a.List()); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if a.Current() != tc.want[0] {
				t.Errorf("starts on %q, want %q", a.Current(), tc.want[0])
			}
		})
	}
}

// deadAddr is a loopback address nothing listens on (connection refused).
func deadAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}

// silentAddr accepts connections and never says a word: an appliance
// that hangs.
func silentAddr(t *testing.T) string {
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

func (f *fakeAppliance) joined() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.joins
}

func (f *fakeAppliance) applies() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.serials)
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHeartbeatFailsOver: a node heartbeating to appliance A moves to B
// (same CA: one fleet) when A stops, over real gRPC and mutual TLS, and
// logs which appliance it is on.
func TestHeartbeatFailsOver(t *testing.T) {
	a := newFakeAppliance(t)
	b := &fakeAppliance{ca: a.ca, token: a.token}
	addrA, srvA := serveAppliance(t, a, nil)
	addrB := startAppliance(t, b, nil)
	logs := &syncbuf.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	apps, err := NewAppliances([]string{addrA, addrB}, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	id, err := Enrol(ctx, EnrolConfig{Name: "node-1", DataDir: t.TempDir(), Appliances: apps, Token: a.token, CACertPEM: a.ca.CertPEM()})
	if err != nil {
		t.Fatal(err)
	}
	if a.joined() != 1 || b.joined() != 0 {
		t.Fatalf("joins A %d B %d, want the first appliance's", a.joined(), b.joined())
	}
	reg, err := id.RegistryOn(apps)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{
			Name: "node-1", DataDir: t.TempDir(), Listener: lis, CAPool: id.CAPool, GetCertificate: id.GetCertificate,
			Registry: reg, Heartbeat: 50 * time.Millisecond, Accel: "tcg", SkipRestart: true, Logger: log,
		})
	}()
	waitUntil(t, "heartbeats on A", func() bool { return a.applies() >= 3 })
	if b.applies() != 0 {
		t.Errorf("B got %d heartbeats while A answered", b.applies())
	}
	stopped := time.Now()
	srvA.Stop()
	waitUntil(t, "heartbeats on B", func() bool { return b.applies() >= 3 })
	t.Logf("three heartbeats on B %v after A stopped", time.Since(stopped).Round(time.Millisecond))
	if apps.Current() != addrB {
		t.Errorf("on %q, want B %q", apps.Current(), addrB)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	out := logs.String()
	for _, want := range []string{
		`msg="on appliance" appliance=` + addrA,
		`msg="appliance not answering: failing over" appliance=` + addrA + ` next=` + addrB + ` call=apply_node`,
		`msg="on appliance after failover" appliance=` + addrB + ` previous=` + addrA,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}

// TestApplyNodeFailover: ApplyNode goes on to the next appliance when
// one refuses the connection (in the same call) or hangs (the call times
// out; the next call goes to the next), and not when one answers with a
// refusal; it stays on the appliance that answers and wraps around.
func TestApplyNodeFailover(t *testing.T) {
	f := newFakeAppliance(t)
	ctx := context.Background()
	id, err := Enrol(ctx, EnrolConfig{Name: "node-1", DataDir: t.TempDir(), Join: startAppliance(t, f, nil), Token: f.token, CACertPEM: f.ca.CertPEM()})
	if err != nil {
		t.Fatal(err)
	}
	apply := func(reg *ApplianceRegistry, d time.Duration) error {
		cctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		_, err := reg.ApplyNode(cctx, &poolv1.ApplyNodeRequest{Name: "node-1"})
		return err
	}

	t.Run("dead then live", func(t *testing.T) {
		live := &fakeAppliance{ca: f.ca}
		apps, _ := NewAppliances([]string{deadAddr(t), startAppliance(t, live, nil)}, nil)
		reg, err := id.RegistryOn(apps)
		if err != nil {
			t.Fatal(err)
		}
		defer reg.Close()
		if err := apply(reg, 5*time.Second); err != nil {
			t.Fatalf("ApplyNode = %v, want the live appliance's answer in the same call", err)
		}
		if live.applies() != 1 || apps.Current() != apps.List()[1] {
			t.Errorf("live appliance calls %d, current %q", live.applies(), apps.Current())
		}
	})
	t.Run("silent then live", func(t *testing.T) {
		live := &fakeAppliance{ca: f.ca}
		apps, _ := NewAppliances([]string{silentAddr(t), startAppliance(t, live, nil)}, nil)
		reg, err := id.RegistryOn(apps)
		if err != nil {
			t.Fatal(err)
		}
		defer reg.Close()
		if err := apply(reg, 300*time.Millisecond); status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("first ApplyNode = %v, want DeadlineExceeded from the silent appliance", err)
		}
		if err := apply(reg, 5*time.Second); err != nil {
			t.Fatalf("second ApplyNode = %v, want the live appliance's answer", err)
		}
		if live.applies() != 1 {
			t.Errorf("live appliance calls %d, want 1", live.applies())
		}
	})
	t.Run("a refusal is an answer", func(t *testing.T) {
		refusing := &fakeAppliance{ca: f.ca, applyErr: status.Error(codes.PermissionDenied, "certificate revoked")}
		other := &fakeAppliance{ca: f.ca}
		apps, _ := NewAppliances([]string{startAppliance(t, refusing, nil), startAppliance(t, other, nil)}, nil)
		reg, err := id.RegistryOn(apps)
		if err != nil {
			t.Fatal(err)
		}
		defer reg.Close()
		if err := apply(reg, 5*time.Second); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("ApplyNode = %v, want the refusal", err)
		}
		if other.applies() != 0 || apps.Current() != apps.List()[0] {
			t.Errorf("failed over on a refusal: other got %d calls, current %q", other.applies(), apps.Current())
		}
	})
	t.Run("all dead", func(t *testing.T) {
		apps, _ := NewAppliances([]string{deadAddr(t), deadAddr(t), deadAddr(t)}, nil)
		reg, err := id.RegistryOn(apps)
		if err != nil {
			t.Fatal(err)
		}
		defer reg.Close()
		if err := apply(reg, 5*time.Second); status.Code(err) != codes.Unavailable {
			t.Fatalf("ApplyNode = %v, want Unavailable", err)
		}
		if apps.Current() != apps.List()[0] {
			t.Errorf("after a full round on %q, want back on the first", apps.Current())
		}
	})
}

// TestEnrolAndRenewFailOver: the first Join and the renewals go to the
// next appliance when the first is gone.
func TestEnrolAndRenewFailOver(t *testing.T) {
	a := newFakeAppliance(t)
	a.validity = 4 * time.Second
	b := &fakeAppliance{ca: a.ca, token: a.token, validity: 4 * time.Second}
	addrA, srvA := serveAppliance(t, a, nil)
	addrB := startAppliance(t, b, nil)
	srvA.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	apps, _ := NewAppliances([]string{addrA, addrB}, nil)
	id, err := Enrol(ctx, EnrolConfig{Name: "node-1", DataDir: t.TempDir(), Appliances: apps, Token: a.token, CACertPEM: a.ca.CertPEM()})
	if err != nil {
		t.Fatalf("Enrol with A gone: %v", err)
	}
	if b.joined() != 1 {
		t.Fatalf("B joins %d, want 1", b.joined())
	}
	first := id.Current().Leaf
	// The renewer starts on A again (a fresh list), which is gone.
	renewApps, _ := NewAppliances([]string{addrA, addrB}, nil)
	done := make(chan error, 1)
	go func() { done <- id.Renew(ctx, RenewConfig{Appliances: renewApps, Retry: 100 * time.Millisecond}) }()
	waitUntil(t, "a renewal through B", func() bool { return !id.Current().Leaf.Equal(first) })
	if joins := b.joined(); joins < 2 || renewApps.Current() != addrB {
		t.Errorf("B joins %d (want the renewal too), renewer on %q", b.joined(), renewApps.Current())
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Renew = %v", err)
	}
}
