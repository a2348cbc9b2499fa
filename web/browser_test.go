package web_test

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	authv1 "github.com/corralhq/corral/api/auth/v1"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/testsupport/require"
)

// browser is a headless Chromium driven over the DevTools protocol,
// trusting the appliance's certificate by its SPKI pin (no blanket
// certificate bypass).
type browser struct {
	t    *testing.T
	base string // the page's https://127.0.0.1:port
	ctx  context.Context
}

// startBrowser starts Chromium for the appliance's web page.
func startBrowser(t *testing.T, a *applianceRig) *browser {
	t.Helper()
	return startBrowserAt(t, a.base, a.srv.WebAddr().String(), a.srv.CA().Pool())
}

// startBrowserAt starts Chromium for the page at base, served on addr
// with a certificate that roots verifies.
func startBrowserAt(t *testing.T, base, addr string, roots *x509.CertPool) *browser {
	t.Helper()
	chromium := "chromium"
	if _, err := exec.LookPath(chromium); err != nil {
		require.Tool(t, "chromium")
	}
	// The pin: base64 SHA-256 of the served certificate's public key,
	// read from a handshake that verified it against the appliance CA.
	tc, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatalf("TLS to the web page with the appliance CA: %v", err)
	}
	leaf := tc.ConnectionState().PeerCertificates[0]
	tc.Close()
	pin := sha256.Sum256(leaf.RawSubjectPublicKeyInfo)

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium),
		chromedp.Flag("ignore-certificate-errors-spki-list", base64.StdEncoding.EncodeToString(pin[:])),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 800),
	)
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox)
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	// Start the browser (no timeout on this first run); the page is made
	// for a 1280x800 screen.
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1280, 800)); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return &browser{t: t, base: base, ctx: ctx}
}

// step runs steps within timeout; on failure it saves a screenshot and
// fails the test.
func (b *browser) step(what string, timeout time.Duration, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	sctx, scancel := context.WithTimeout(b.ctx, timeout)
	defer scancel()
	if err := chromedp.Do(sctx, steps...); err != nil {
		shot(b.ctx, b.t, "failed")
		b.t.Fatalf("%s: %v", what, err)
	}
}

// eval evaluates a JavaScript expression in the page.
func eval[T any](b *browser, expr string) T {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		shot(b.ctx, b.t, "failed")
		b.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// until polls a JavaScript condition until it holds.
func until(expr string, timeout time.Duration) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(timeout))(ctx, tg)
		return err
	})
}

func stateIs(machine, state string) chromedp.Action[chromedp.Void] {
	return until(fmt.Sprintf(`(document.querySelector('tr[data-name=%q] td.state') || {}).textContent === %q`, machine, state), 30*time.Second)
}

func noticeHas(text string) chromedp.Action[chromedp.Void] {
	return until(fmt.Sprintf(`!document.getElementById('notice').hidden && document.getElementById('notice-text').textContent.includes(%q)`, text), 30*time.Second)
}

// signIn signs in with token and waits for the row of machine; from then
// on every Content-Security-Policy violation is recorded (the page must
// cause none) and window.notReloaded tells a reload apart.
func (b *browser) signIn(token, machine string, timeout time.Duration) {
	b.t.Helper()
	b.step("sign in", timeout,
		chromedp.Navigate(b.base+"/#/login"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), token),
		chromedp.Click(chromedp.CSS("#login-submit")),
		chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf("tr[data-name=%q]", machine))),
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := chromedp.Evaluate[chromedp.Void](`window.cspViolations = []; document.addEventListener('securitypolicyviolation', (e) => window.cspViolations.push(e.violatedDirective + ' ' + e.blockedURI)); window.notReloaded = true;`)(ctx, tg)
			return err
		}),
	)
}

// visibleRows is the names of the machine rows shown, in order.
const visibleRows = `[...document.querySelectorAll('table.machines tbody tr')].filter((r) => !r.hidden).map((r) => r.dataset.name)`

// TestBrowser drives Debian's Chromium against a running appliance: the
// sign-in page (no navigation, the right command for a token), a viewer
// who sees the machines (a serial that is markup shown as text) but no
// button its role cannot use, a change made
// over gRPC showing WITHOUT a reload in the same row element, search,
// state filter and sort, the machine page's timeline picture, a refusal
// said in words, and an operator's accept going through. No
// Content-Security-Policy violation may occur.
func TestBrowser(t *testing.T) {
	a := startAppliance(t)
	name := a.machine(t, "SN-BROWSER-1", "52:54:00:bb:00:01")
	other := a.machine(t, "SN-BROWSER-2", "52:54:00:bb:00:02")
	// A serial from the boot LAN that is markup must show as text.
	const hostile = `<img src=x id=pwn onerror="window.pwned=1">`
	third := a.machine(t, hostile, "52:54:00:bb:00:03")
	viewer, operator := a.tokens[authv1.Role_ROLE_VIEWER], a.tokens[authv1.Role_ROLE_OPERATOR]
	b := startBrowser(t, a)

	// The sign-in page: no navigation, and the command that makes a token.
	b.step("sign-in page", 30*time.Second,
		chromedp.Navigate(a.base+"/#/login"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
	)
	if navShown := eval[bool](b, `getComputedStyle(document.getElementById('nav')).display !== 'none'`); navShown {
		t.Error("the navigation shows on the sign-in page")
	}
	if cmd := eval[string](b, `document.getElementById('token-command').textContent`); cmd != "corral token create --role viewer" {
		t.Errorf("the sign-in page's token command is %q", cmd)
	}
	if login := eval[string](b, `document.getElementById('login').textContent`); strings.Contains(login, "corrald") {
		t.Errorf("the sign-in page names corrald: %q", login)
	}
	shot(b.ctx, t, "login")

	b.signIn(viewer, name, 30*time.Second)
	b.step("machine row", 30*time.Second, stateIs(name, "INVENTORIED"))
	if navShown := eval[bool](b, `getComputedStyle(document.getElementById('nav')).display !== 'none'`); !navShown {
		t.Error("the navigation is hidden after signing in")
	}
	if who := eval[string](b, `document.getElementById('who').textContent`); who != "viewer" {
		t.Errorf("the page says the role is %q, want viewer", who)
	}
	text, err := chromedp.Run(b.ctx, chromedp.Text(chromedp.CSS(fmt.Sprintf("tr[data-name=%q]", name))))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"SN-BROWSER-1", "QEMU Virtual CPU", "2 GiB", "2 · 30 GiB", "1 · 1 up"} {
		if !strings.Contains(text, want) {
			t.Errorf("machine row %q lacks %q", text, want)
		}
	}
	if cell := eval[string](b, fmt.Sprintf(`document.querySelector('tr[data-name=%q] td.mono').textContent`, third)); cell != hostile {
		t.Errorf("the markup serial shows as %q, want the text %q", cell, hostile)
	}
	if n := eval[bool](b, `document.getElementById('pwn') !== null || window.pwned === 1`); n {
		t.Error("a serial became markup")
	}
	// A viewer sees no action: no button, no power menu, no column.
	if n := eval[int](b, `document.querySelectorAll('main [data-action]').length`); n != 0 {
		t.Errorf("a viewer sees %d action controls on the machines page", n)
	}
	if heads := eval[string](b, `document.querySelector('table.machines thead').textContent`); strings.Contains(heads, "Actions") {
		t.Errorf("a viewer's table has an Actions column: %q", heads)
	}

	// A change made elsewhere (the CLI's RPC) shows without a reload, in
	// the same row element (updated in place, not rebuilt).
	eval[bool](b, fmt.Sprintf(`document.querySelector('tr[data-name=%q]').kept = true`, name))
	if _, err := a.admin.SetMaintenance(context.Background(), &inventoryv1.SetMaintenanceRequest{Name: name, On: true, Reason: "browser test"}); err != nil {
		t.Fatal(err)
	}
	b.step("live state change", 40*time.Second, stateIs(name, "MAINTENANCE"))
	if kept := eval[bool](b, `window.notReloaded === true`); !kept {
		t.Error("the page reloaded to show the change")
	}
	if kept := eval[bool](b, fmt.Sprintf(`document.querySelector('tr[data-name=%q]').kept === true`, name)); !kept {
		t.Error("the live update replaced the row element instead of updating it in place")
	}
	shot(b.ctx, t, "machines")

	// Search by serial and by MAC, filter by state, sort by a column.
	search := func(q string, want ...string) {
		t.Helper()
		b.step("search "+q, 10*time.Second,
			setInput("machine-search", q, "input"),
			until(fmt.Sprintf(`JSON.stringify(%s) === %q`, visibleRows, jsonList(want)), 5*time.Second),
		)
	}
	search("sn-browser-2", other)
	search("52:54:00:bb:00:01", name)
	search("<img", third)
	search("", name, other, third)
	b.step("filter by state", 10*time.Second,
		setInput("machine-state", "MAINTENANCE", "change"),
		until(fmt.Sprintf(`JSON.stringify(%s) === %q`, visibleRows, jsonList([]string{name})), 5*time.Second),
		until(`document.getElementById('machine-count').textContent === '1 of 3 machines shown'`, 5*time.Second),
	)
	shot(b.ctx, t, "filtered")
	b.step("all states", 10*time.Second,
		setInput("machine-state", "", "change"),
		// By state: INVENTORIED before MAINTENANCE; a second click reverses.
		chromedp.Click(chromedp.CSS(`th[data-sort=state] button`)),
		until(fmt.Sprintf(`JSON.stringify(%s) === %q`, visibleRows, jsonList([]string{other, third, name})), 5*time.Second),
		chromedp.Click(chromedp.CSS(`th[data-sort=state] button`)),
		until(fmt.Sprintf(`JSON.stringify(%s) === %q`, visibleRows, jsonList([]string{name, third, other})), 5*time.Second),
		until(`document.querySelector('th[data-sort=state]').getAttribute('aria-sort') === 'descending'`, 5*time.Second),
	)

	// The machine's page: facts, and the boot timeline as a picture.
	b.step("machine page", 30*time.Second,
		chromedp.Navigate(a.base+"/#/machines/"+name),
		chromedp.WaitVisible(chromedp.CSS("svg.timeline rect.phase")),
	)
	phases := eval[[]string](b, `[...new Set([...document.querySelectorAll('svg.timeline rect.phase')].map((r) => r.dataset.phase))]`)
	for _, want := range []string{"power", "dhcp", "tftp", "script", "kernel+initrd", "agent"} {
		if !strings.Contains(strings.Join(phases, ","), want) {
			t.Errorf("timeline phases %v lack %q", phases, want)
		}
	}
	if n := eval[int](b, `document.querySelectorAll('main [data-action]').length`); n != 0 {
		t.Errorf("a viewer sees %d action controls on the machine page", n)
	}
	// A machine without a BMC has no console and no BMC health card.
	if hidden := eval[bool](b, `document.querySelector('div.card.console').hidden && document.getElementById('bmc-health').hidden`); !hidden {
		t.Error("a machine without a BMC shows a console or a BMC health card")
	}
	shot(b.ctx, t, "machine")

	// Were the page to offer the viewer an accept (a role changed under
	// it), the API's refusal is said in words, not as an RPC name.
	b.step("viewer accept refused", 40*time.Second,
		chromedp.Navigate(a.base+"/#/machines"),
		stateIs(other, "INVENTORIED"),
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`act(%q, 'Accept', 'accept', { disk: 'auto' }); undefined`, other))(ctx, tg)
			return err
		}),
		chromedp.WaitVisible(chromedp.CSS("#confirm-ok")),
		chromedp.Click(chromedp.CSS("#confirm-ok")),
		noticeHas("Your token's role (viewer) cannot accept machines; an operator token can."),
	)
	if n := eval[string](b, `document.getElementById('notice-text').textContent`); strings.Contains(n, "PermissionDenied") || strings.Contains(n, "/corral.") {
		t.Errorf("the refusal shows the raw status: %q", n)
	}
	shot(b.ctx, t, "viewer-refused")
	checkCSP(b.ctx, t)

	// An operator sees the actions and its accept goes through.
	b.step("sign out", 10*time.Second, chromedp.Click(chromedp.CSS("#signout")), chromedp.WaitVisible(chromedp.CSS("#token")))
	if navShown := eval[bool](b, `getComputedStyle(document.getElementById('nav')).display !== 'none'`); navShown {
		t.Error("the navigation shows on the sign-in page after signing out")
	}
	b.signIn(operator, name, 30*time.Second)
	b.step("operator accept", 40*time.Second,
		stateIs(other, "INVENTORIED"),
		chromedp.Click(chromedp.CSS(fmt.Sprintf("tr[data-name=%q] button[data-action=accept]", other))),
		chromedp.WaitVisible(chromedp.CSS("#confirm-ok")),
		chromedp.Click(chromedp.CSS("#confirm-ok")),
		noticeHas("done"),
		stateIs(other, "INSTALLING"),
	)
	m, err := a.admin.GetMachine(context.Background(), &inventoryv1.GetMachineRequest{Name: other})
	if err != nil {
		t.Fatal(err)
	}
	if m.GetState() != inventoryv1.Machine_INSTALLING {
		t.Errorf("after the operator's accept the machine is %v", m.GetState())
	}
	checkCSP(b.ctx, t)
}

// setInput sets the value of the element with id as a person would and
// fires event (input or change).
func setInput(id, value, event string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`(() => { const e = document.getElementById(%q); e.value = %q; e.dispatchEvent(new Event(%q)); })()`, id, value, event))(ctx, tg)
		return err
	})
}

// jsonList is names as JSON.stringify writes them.
func jsonList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	return "[" + strings.Join(q, ",") + "]"
}

func checkCSP(ctx context.Context, t *testing.T) {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`window.cspViolations || []`))
	if err != nil {
		t.Fatal(err)
	}
	if len(v) > 0 {
		t.Errorf("Content-Security-Policy violations: %v", v)
	}
}

// shot saves a screenshot of the viewport under $CORRAL_TEST_ARTIFACTS
// (else the test's temporary directory) and logs its path.
func shot(ctx context.Context, t *testing.T, what string) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(sctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Logf("screenshot %s: %v", what, err)
		return
	}
	dir := os.Getenv("CORRAL_TEST_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "web-"+what+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}
