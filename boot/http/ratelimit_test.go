package http

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/auth"
	"github.com/corralhq/corral/images"
	"github.com/corralhq/corral/store/bolt"
	"github.com/corralhq/corral/store/mem"
)

// settable is a test clock.
type settable struct {
	mu sync.Mutex
	t  time.Time
}

func (c *settable) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *settable) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// fakeLeases maps addresses to the MAC holding them.
type fakeLeases map[netip.Addr]string

func (f fakeLeases) LeaseHolder(_ context.Context, a netip.Addr) (string, bool, error) {
	m, ok := f[a]
	return m, ok, nil
}

// direct is a Server driven through ServeHTTP, so that each request can
// come from any source address.
type direct struct {
	s   *Server
	inv *fakeInv
	rec *recorder
	clk *settable
}

func newDirect(t testing.TB, tokens TokenIssuer, mutate func(*Config)) *direct {
	t.Helper()
	src := t.TempDir()
	for _, n := range []string{images.UndionlyKPXE, "ipxe.lkrn"} {
		writeFile(t, filepath.Join(src, n), "bin "+n)
	}
	writeFile(t, filepath.Join(src, "initrd"), "initramfs")
	cat, err := images.Open(images.Config{Dir: t.TempDir(), IPXEDirs: []string{src}, Initrd: filepath.Join(src, "initrd")})
	if err != nil {
		t.Fatal(err)
	}
	d := &direct{inv: &fakeInv{machines: map[string]*inventoryv1.Machine{}}, rec: &recorder{}, clk: &settable{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}}
	cfg := Config{Listen: "127.0.0.1:0", Catalog: cat, Inventory: d.inv, Tokens: tokens, Timeline: d.rec, CreateUnknown: true,
		APIEndpoint: ":20180", CAFingerprint: strings.Repeat("ab", 32), Now: d.clk.now}
	if mutate != nil {
		mutate(&cfg)
	}
	if d.s, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	d.s.Close()
	return d
}

// get asks for mac's script from addr.
func (d *direct) get(mac, addr string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, "http://10.0.0.1:8080/boot.ipxe?mac="+mac, nil)
	r.RemoteAddr = addr + ":40000"
	w := httptest.NewRecorder()
	d.s.ServeHTTP(w, r)
	return w
}

func (d *direct) count(mac, event string) int {
	d.rec.mu.Lock()
	defer d.rec.mu.Unlock()
	n := 0
	for _, e := range d.rec.full {
		if e.mac == mac && e.event == event {
			n++
		}
	}
	return n
}

// TestScriptRateLimits: a MAC gets its burst, then one script per
// interval; a source address likewise across MACs; refusals are 429 with
// Retry-After, noted on the timeline at most once a minute.
func TestScriptRateLimits(t *testing.T) {
	tests := map[string]struct {
		lim      ScriptLimits
		mac      func(i int) string
		addr     func(i int) string
		served   int
		retry    string
		limitMAC string // the MAC whose timeline notes the refusals
	}{
		"one MAC from many addresses": {
			lim:    ScriptLimits{MACBurst: 3, MACInterval: 6 * time.Second, AddrBurst: 100, AddrInterval: time.Second},
			mac:    func(int) string { return "52:54:00:00:00:01" },
			addr:   func(i int) string { return fmt.Sprintf("10.0.0.%d", 10+i) },
			served: 3, retry: "6", limitMAC: "52:54:00:00:00:01",
		},
		"many MACs from one address": {
			lim:    ScriptLimits{MACBurst: 3, MACInterval: 6 * time.Second, AddrBurst: 5, AddrInterval: 2 * time.Second},
			mac:    func(i int) string { return fmt.Sprintf("52:54:00:00:01:%02x", i) },
			addr:   func(int) string { return "10.0.0.9" },
			served: 5, retry: "2", limitMAC: "52:54:00:00:01:05",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d := newDirect(t, &fakeTokens{}, func(c *Config) { c.Scripts = tc.lim })
			served := 0
			var refused *httptest.ResponseRecorder
			for i := range 10 {
				w := d.get(tc.mac(i), tc.addr(i))
				switch w.Code {
				case http.StatusOK:
					served++
				case http.StatusTooManyRequests:
					if refused == nil {
						refused = w
					}
				default:
					t.Fatalf("request %d: %d %s", i, w.Code, w.Body)
				}
			}
			if served != tc.served || refused == nil {
				t.Fatalf("%d served of 10; want %d and the rest refused", served, tc.served)
			}
			if got := refused.Header().Get("Retry-After"); got != tc.retry {
				t.Errorf("Retry-After %q; want %q", got, tc.retry)
			}
			if !strings.Contains(refused.Body.String(), "too many boot script requests") {
				t.Errorf("refusal body %q", refused.Body)
			}
			if n := d.count(tc.limitMAC, "http-refused"); n != 1 {
				t.Errorf("%d refusals on %s's timeline; want 1 (noted once a minute)", n, tc.limitMAC)
			}
			// Refilled after the interval.
			d.clk.add(10 * time.Second)
			if w := d.get(tc.mac(0), tc.addr(0)); w.Code != http.StatusOK {
				t.Errorf("after the interval: %d %s", w.Code, w.Body)
			}
		})
	}
}

// TestScriptOnlyToTheLeasedAddress: with leases (full DHCP mode) a MAC's
// script goes only to the address leased to that MAC; refused requests
// spend none of the victim MAC's budget.
func TestScriptOnlyToTheLeasedAddress(t *testing.T) {
	const victim, attacker = "52:54:00:00:00:01", "52:54:00:00:00:02"
	leases := fakeLeases{netip.MustParseAddr("10.0.0.101"): victim, netip.MustParseAddr("10.9.0.50"): attacker}
	d := newDirect(t, &fakeTokens{}, func(c *Config) {
		c.Leases = leases
		c.Scripts = ScriptLimits{MACBurst: 2, AddrBurst: 100}
	})
	for name, tc := range map[string]struct {
		mac, addr string
		status    int
		want      string
	}{
		"the attacker's lease, the victim's MAC": {mac: victim, addr: "10.9.0.50", status: 403, want: "10.9.0.50 is leased to " + attacker + ", not " + victim},
		"no lease":                               {mac: victim, addr: "10.0.0.7", status: 403, want: "10.0.0.7 holds no DHCP lease"},
		"ipv4-mapped, wrong lease":               {mac: victim, addr: "[::ffff:10.9.0.50]", status: 403, want: "is leased to"},
		"the attacker's own MAC (relayed)":       {mac: attacker, addr: "10.9.0.50", status: 200},
	} {
		t.Run(name, func(t *testing.T) {
			for range 3 {
				w := d.get(tc.mac, tc.addr)
				if w.Code != tc.status || !strings.Contains(w.Body.String(), tc.want) {
					t.Fatalf("GET %s from %s = %d %q; want %d %q", tc.mac, tc.addr, w.Code, w.Body, tc.status, tc.want)
				}
				if tc.status == 200 {
					break
				}
			}
		})
	}
	if n := d.count(victim, "http-refused"); n != 9 {
		t.Errorf("%d refusals on the victim's timeline; want 9", n)
	}
	// The victim's budget is whole.
	for i := range 2 {
		if w := d.get(victim, "10.0.0.101"); w.Code != 200 {
			t.Fatalf("victim's own request %d: %d %s", i, w.Code, w.Body)
		}
	}
}

// TestRerenderKeepsTheToken: with the real token store, asking again for
// a booting machine's script returns the token it holds (no revocation).
func TestRerenderKeepsTheToken(t *testing.T) {
	tk := &auth.Tokens{Store: mem.New()}
	d := newDirect(t, tk, nil)
	first := tokenOf(t, d.get("52:54:00:00:00:01", "10.0.0.1"))
	for i := range 5 {
		if again := tokenOf(t, d.get("52:54:00:00:00:01", fmt.Sprintf("10.0.0.%d", 2+i))); again != first {
			t.Fatalf("render %d gave another token", i)
		}
	}
	p, err := tk.Authenticate(context.Background(), first)
	if err != nil || p.MAC != "52:54:00:00:00:01" || p.Machine != "m-525400000001" {
		t.Fatalf("token principal %+v, %v", p, err)
	}
	if got := d.rec.attr("52:54:00:00:00:01", "script", "token"); got != "reused "+first[4:20] {
		t.Errorf("script token attribute %q", got)
	}
}

func tokenOf(t *testing.T, w *httptest.ResponseRecorder) string {
	t.Helper()
	if w.Code != 200 {
		t.Fatalf("script: %d %s", w.Code, w.Body)
	}
	_, rest, ok := strings.Cut(w.Body.String(), "corral.token=")
	if !ok {
		t.Fatalf("no token in\n%s", w.Body)
	}
	tok, _, _ := strings.Cut(rest, " ")
	return tok
}

func TestBudgetsBounded(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	b := newBudgets(2, time.Second, 4)
	for i := range 10 {
		b.take(fmt.Sprint(i), now)
	}
	if n := b.len(); n != 4 {
		t.Fatalf("%d budgets; want the bound, 4", n)
	}
	if n := b.takeEvicted(); n != 6 {
		t.Errorf("%d live budgets forgotten; want 6", n)
	}
	// Refilled budgets go first and silently.
	later := now.Add(time.Minute)
	for i := range 4 {
		b.take(fmt.Sprint(100+i), later)
	}
	if n := b.takeEvicted(); n != 0 {
		t.Errorf("%d live budgets forgotten while refilled ones could go", n)
	}
}

// BenchmarkBootScript prints /boot.ipxe requests per second with the rate
// limits on (the defaults) and the real token store (auth.Tokens), through
// ServeHTTP (no sockets); it asserts nothing (bench/README.md says how to
// run it):
//   - one-mac: one MAC's script from one address again and again: after
//     the burst of 10, 429s (the per-MAC limit bites);
//   - many-macs-mint: every request a new machine on its own address, so
//     every render mints its token: one bolt write with its fsync;
//   - many-macs-rerender: 50,000 machines, each on its own address, whose
//     tokens are live: every render reuses its token, no store write
//     (tokens on the mem store: a re-render only reads).
func BenchmarkBootScript(b *testing.B) {
	mac := func(n int) string { return fmt.Sprintf("52:54:00:%02x:%02x:%02x", n>>16, n>>8&0xff, n&0xff) }
	addr := func(n int) string { return fmt.Sprintf("10.%d.%d.%d", n>>16, n>>8&0xff, n&0xff) }
	const pool = 50000
	for _, bc := range []struct {
		name  string
		which func(i int) int
		bolt  bool
		mint  int // tokens minted before the clock starts
	}{
		{"one-mac", func(int) int { return 0 }, true, 0},
		{"many-macs-mint", func(i int) int { return i }, true, 0},
		{"many-macs-rerender", func(i int) int { return i % pool }, false, pool},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var tk *auth.Tokens
			if bc.bolt {
				st, err := bolt.Open(filepath.Join(b.TempDir(), "corral.db"), bolt.Options{})
				if err != nil {
					b.Fatal(err)
				}
				defer st.Close()
				tk = &auth.Tokens{Store: st}
			} else {
				tk = &auth.Tokens{Store: mem.New()}
			}
			d := newDirect(b, tk, func(c *Config) { c.Now = time.Now })
			for n := range bc.mint {
				if _, _, err := tk.IssueBoot(context.Background(), mac(n), "m-"+strings.ReplaceAll(mac(n), ":", ""), time.Hour); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			start := time.Now()
			var served, refused int
			for i := range b.N {
				n := bc.which(i)
				switch w := d.get(mac(n), addr(n)); w.Code {
				case http.StatusOK:
					served++
				case http.StatusTooManyRequests:
					refused++
				default:
					b.Fatalf("%d %s", w.Code, w.Body)
				}
			}
			el := time.Since(start).Seconds()
			b.ReportMetric(float64(served)/el, "served/s")
			b.ReportMetric(float64(refused)/el, "refused/s")
			b.ReportMetric(float64(b.N)/el, "requests/s")
		})
	}
}

func writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
