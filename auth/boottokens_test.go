package auth

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/store/record"
	"github.com/google/go-cmp/cmp"
)

// writeCounter counts the writes that reach a store.
type writeCounter struct {
	store.Store
	writes atomic.Int64
}

func (w *writeCounter) Put(ctx context.Context, key string, v []byte, rev int64) (int64, error) {
	w.writes.Add(1)
	return w.Store.Put(ctx, key, v, rev)
}

func (w *writeCounter) Delete(ctx context.Context, key string, rev int64) error {
	w.writes.Add(1)
	return w.Store.Delete(ctx, key, rev)
}

func newBootTokens(t *testing.T) (*Tokens, *writeCounter, *clock) {
	t.Helper()
	s := mem.New()
	t.Cleanup(func() { s.Close() })
	w := &writeCounter{Store: s}
	c := &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	return &Tokens{Store: w, Now: c.now}, w, c
}

const (
	bootMAC = "52:54:00:12:34:56"
	bootTTL = time.Hour
)

func issue(t *testing.T, tk *Tokens, mac, machine string) (string, bool) {
	t.Helper()
	tok, minted, err := tk.IssueBoot(context.Background(), mac, machine, bootTTL)
	if err != nil {
		t.Fatalf("IssueBoot(%s, %s): %v", mac, machine, err)
	}
	if !tokenShape.MatchString(tok) {
		t.Fatalf("boot token %q does not match %v", tok, tokenShape)
	}
	return tok, minted
}

// Re-rendering a script returns the same token without writing; the token
// authenticates as an AGENT bound to its MAC and machine.
func TestIssueBootReusesLiveToken(t *testing.T) {
	ctx := context.Background()
	tk, w, clk := newBootTokens(t)
	first, minted := issue(t, tk, bootMAC, "m-1")
	if !minted {
		t.Fatal("first IssueBoot did not mint")
	}
	writes := w.writes.Load() // the key and the token
	for i := range 20 {
		clk.t = clk.t.Add(time.Minute) // 20 min: less than half the TTL
		again, minted := issue(t, tk, bootMAC, "m-1")
		if again != first || minted {
			t.Fatalf("render %d: token %q minted=%t; want the first token, not minted", i, again, minted)
		}
	}
	if n := w.writes.Load() - writes; n != 0 {
		t.Errorf("%d store writes for 20 re-renders; want 0", n)
	}
	p, err := tk.Authenticate(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	want := Principal{Role: authv1.Role_ROLE_AGENT, ID: first[4:20], Subject: "boot " + bootMAC + " m-1", MAC: bootMAC, Machine: "m-1"}
	if diff := cmp.Diff(want, p); diff != "" {
		t.Errorf("principal (-want +got):\n%s", diff)
	}
	other, minted := issue(t, tk, "52:54:00:12:34:57", "m-2")
	if !minted || other == first || other[4:20] == first[4:20] {
		t.Errorf("another MAC got %q (minted %t); want a new token and id", other, minted)
	}
}

// Past half its lifetime a re-render extends the expiry with one write; an
// expired token is never brought back.
func TestIssueBootSlidesAndExpires(t *testing.T) {
	ctx := context.Background()
	tk, w, clk := newBootTokens(t)
	start := clk.t
	first, _ := issue(t, tk, bootMAC, "m-1")
	clk.t = start.Add(31 * time.Minute)
	before := w.writes.Load()
	if again, minted := issue(t, tk, bootMAC, "m-1"); again != first || minted {
		t.Fatalf("render past half TTL: %q minted=%t; want the same token", again, minted)
	}
	if again, _ := issue(t, tk, bootMAC, "m-1"); again != first {
		t.Fatal("second render past half TTL changed the token")
	}
	if n := w.writes.Load() - before; n != 1 {
		t.Errorf("%d writes to extend; want 1", n)
	}
	// Extended to 31m+1h: gone at 1h31m.
	clk.t = start.Add(91*time.Minute + time.Second)
	if _, err := tk.Authenticate(ctx, first); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("token after its extended expiry: %v; want ErrUnauthenticated", err)
	}
	next, minted := issue(t, tk, bootMAC, "m-1")
	if next == first || !minted {
		t.Fatalf("render after expiry gave %q minted=%t; want a new token", next, minted)
	}
	if next[4:20] != first[4:20] {
		t.Errorf("the MAC's token id changed: %s -> %s", first[4:20], next[4:20])
	}
	if _, err := tk.Authenticate(ctx, first); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("the expired token authenticates again: %v", err)
	}
}

// Using a boot token (Register, Session) also slides its expiry, at most
// once per half lifetime.
func TestAuthenticateSlidesBootToken(t *testing.T) {
	ctx := context.Background()
	tk, w, clk := newBootTokens(t)
	start := clk.t
	tok, _ := issue(t, tk, bootMAC, "m-1")
	before := w.writes.Load()
	for _, at := range []time.Duration{10 * time.Minute, 29 * time.Minute} {
		clk.t = start.Add(at)
		if _, err := tk.Authenticate(ctx, tok); err != nil {
			t.Fatal(err)
		}
	}
	if n := w.writes.Load() - before; n != 0 {
		t.Fatalf("%d writes before half the lifetime; want 0", n)
	}
	for _, at := range []time.Duration{45 * time.Minute, 50 * time.Minute, 100 * time.Minute} {
		clk.t = start.Add(at)
		if _, err := tk.Authenticate(ctx, tok); err != nil {
			t.Fatalf("at %v: %v", at, err)
		}
	}
	// 45m: extended to 1h45m; 50m: nothing; 100m (5 min left): extended.
	if n := w.writes.Load() - before; n != 2 {
		t.Errorf("%d writes; want 2", n)
	}
}

// Revoking a boot token ends it at once, and the next render in the same
// second mints a different one.
func TestRevokeBootToken(t *testing.T) {
	ctx := context.Background()
	tk, _, _ := newBootTokens(t)
	first, _ := issue(t, tk, bootMAC, "m-1")
	if err := tk.Revoke(ctx, first[4:20]); err != nil {
		t.Fatal(err)
	}
	if _, err := tk.Authenticate(ctx, first); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("revoked boot token: %v", err)
	}
	if err := tk.Revoke(ctx, first[4:20]); err != nil {
		t.Errorf("revoking twice: %v", err)
	}
	next, minted := issue(t, tk, bootMAC, "m-1")
	if next == first || !minted {
		t.Fatalf("render after revoke: %q minted=%t; want a new token", next, minted)
	}
	if _, err := tk.Authenticate(ctx, first); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("revoked token works again: %v", err)
	}
	if _, err := tk.Authenticate(ctx, next); err != nil {
		t.Errorf("new token: %v", err)
	}
}

// A purge right after expiry leaves the record until a second has passed,
// so a mint can never reuse a purged token's creation time.
func TestPurgeThenIssueNeverRepeats(t *testing.T) {
	ctx := context.Background()
	tk, _, clk := newBootTokens(t)
	seen := map[string]bool{}
	for range 5 {
		tok, _ := issue(t, tk, bootMAC, "m-1")
		if seen[tok] {
			t.Fatalf("token %s issued twice", tok)
		}
		seen[tok] = true
		if err := tk.Revoke(ctx, tok[4:20]); err != nil {
			t.Fatal(err)
		}
		if _, err := tk.PurgeExpired(ctx); err != nil {
			t.Fatal(err)
		}
		clk.t = clk.t.Add(time.Second)
		if _, err := tk.PurgeExpired(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// The MAC's machine changed (a placeholder merged into a registered
// machine): the live token stays and its binding follows.
func TestIssueBootRebinds(t *testing.T) {
	ctx := context.Background()
	tk, _, _ := newBootTokens(t)
	first, _ := issue(t, tk, bootMAC, "m-525400123456")
	again, minted := issue(t, tk, bootMAC, "rack1-u5")
	if again != first || minted {
		t.Fatalf("rebind: %q minted=%t; want the same token", again, minted)
	}
	p, err := tk.Authenticate(ctx, first)
	if err != nil || p.Machine != "rack1-u5" {
		t.Fatalf("principal after rebind: %+v, %v", p, err)
	}
}

// A new boot key (the record deleted): the next render mints a new token
// under a new id.
func TestIssueBootNewKey(t *testing.T) {
	ctx := context.Background()
	tk, w, _ := newBootTokens(t)
	first, _ := issue(t, tk, bootMAC, "m-1")
	kv, err := w.Get(ctx, BootKeyKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Delete(ctx, BootKeyKey, kv.Revision); err != nil {
		t.Fatal(err)
	}
	fresh := &Tokens{Store: w, Now: tk.Now}
	next, minted := issue(t, fresh, bootMAC, "m-1")
	if !minted || next == first || next[4:20] == first[4:20] {
		t.Fatalf("render under a new key: %q minted=%t; want a new token and id", next, minted)
	}
}

// Two Tokens over one store (two appliances) issue the same token.
func TestIssueBootAgreesAcrossAppliances(t *testing.T) {
	tk, w, _ := newBootTokens(t)
	other := &Tokens{Store: w, Now: tk.Now}
	var wg sync.WaitGroup
	toks := make([]string, 16)
	for i := range toks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := tk
			if i%2 == 1 {
				k = other
			}
			tok, _, err := k.IssueBoot(context.Background(), bootMAC, "m-1", bootTTL)
			if err != nil {
				t.Error(err)
			}
			toks[i] = tok
		}()
	}
	wg.Wait()
	for i, tok := range toks {
		if tok != toks[0] {
			t.Fatalf("render %d got %q, render 0 %q", i, tok, toks[0])
		}
	}
}

func TestIssueBootRejects(t *testing.T) {
	tests := map[string]struct {
		mac, machine string
		ttl          time.Duration
	}{
		"upper-case mac": {mac: "52:54:00:12:34:5A", machine: "m", ttl: bootTTL},
		"dash mac":       {mac: "52-54-00-12-34-56", machine: "m", ttl: bootTTL},
		"short mac":      {mac: "52:54:00:12:34", machine: "m", ttl: bootTTL},
		"empty machine":  {mac: bootMAC, ttl: bootTTL},
		"zero ttl":       {mac: bootMAC, machine: "m"},
		"negative ttl":   {mac: bootMAC, machine: "m", ttl: -time.Hour},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tk, w, _ := newBootTokens(t)
			tok, _, err := tk.IssueBoot(context.Background(), tc.mac, tc.machine, tc.ttl)
			if !errors.Is(err, ErrBootToken) || tok != "" {
				t.Fatalf("IssueBoot = %q, %v; want ErrBootToken", tok, err)
			}
			if n := w.writes.Load(); n != 0 {
				t.Errorf("%d writes for a refused request", n)
			}
		})
	}
}

// A 64-bit id collision with a hand-made token is an error, never an
// overwrite.
func TestIssueBootNeverOverwritesOtherTokens(t *testing.T) {
	ctx := context.Background()
	tk, w, _ := newBootTokens(t)
	key, err := tk.bootKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id := bootID(key, bootMAC)
	admin := &authv1.Token{Id: id, Sha256: make([]byte, 32), Role: authv1.Role_ROLE_ADMIN, Description: "admin"}
	if _, err := record.Put(ctx, w, tokenKey(id), admin, 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := tk.IssueBoot(ctx, bootMAC, "m-1", bootTTL); err == nil {
		t.Fatal("IssueBoot overwrote a token of another kind")
	}
	var got authv1.Token
	if _, err := record.Get(ctx, w, tokenKey(id), &got); err != nil || got.GetRole() != authv1.Role_ROLE_ADMIN {
		t.Fatalf("record after refused IssueBoot: %v %v", &got, err)
	}
}
