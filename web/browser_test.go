package web_test

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
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

// TestBrowser drives Debian's Chromium (headless, over the DevTools
// protocol) against a running appliance: it trusts the appliance's
// certificate by its SPKI pin (no blanket certificate bypass), signs in
// with a viewer token, sees the machine, sees it change state WITHOUT a
// reload when the test puts it into maintenance over gRPC, saves a
// screenshot, checks the machine page's timeline picture has phases, and
// checks that the viewer's accept shows the permission error while an
// operator's succeeds. No Content-Security-Policy violation may occur.
func TestBrowser(t *testing.T) {
	chromium := "chromium"
	if _, err := exec.LookPath(chromium); err != nil {
		require.Tool(t, "chromium")
	}
	a := startAppliance(t)
	name := a.machine(t, "SN-BROWSER-1", "52:54:00:bb:00:01")
	other := a.machine(t, "SN-BROWSER-2", "52:54:00:bb:00:02")
	viewer, operator := a.tokens[authv1.Role_ROLE_VIEWER], a.tokens[authv1.Role_ROLE_OPERATOR]

	// The pin: base64 SHA-256 of the served certificate's public key,
	// read from a handshake that verified it against the appliance CA.
	tc, err := tls.Dial("tcp", a.srv.WebAddr().String(), &tls.Config{RootCAs: a.srv.CA().Pool(), ServerName: "127.0.0.1"})
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
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	// Start the browser (no timeout on this first run); the page is made
	// for a 1280x800 screen.
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1280, 800)); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	step := func(what string, timeout time.Duration, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, scancel := context.WithTimeout(ctx, timeout)
		defer scancel()
		if err := chromedp.Do(sctx, steps...); err != nil {
			shot(t, ctx, "failed")
			t.Fatalf("%s: %v", what, err)
		}
	}
	stateIs := func(machine, state string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := chromedp.Poll[bool](fmt.Sprintf(`(document.querySelector('tr[data-name=%q] td.state') || {}).textContent === %q`, machine, state),
				chromedp.WithPollingTimeout(30*time.Second))(ctx, tg)
			return err
		})
	}
	noticeHas := func(text string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := chromedp.Poll[bool](fmt.Sprintf(`!document.getElementById('notice').hidden && document.getElementById('notice-text').textContent.includes(%q)`, text),
				chromedp.WithPollingTimeout(30*time.Second))(ctx, tg)
			return err
		})
	}
	signIn := func(token string) {
		t.Helper()
		step("sign in", 30*time.Second,
			chromedp.Navigate(a.base+"/#/login"),
			chromedp.WaitVisible(chromedp.CSS("#token")),
			chromedp.SendKeys(chromedp.CSS("#token"), token),
			chromedp.Click(chromedp.CSS("#login-submit")),
			chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf("tr[data-name=%q]", name))),
			// Every Content-Security-Policy violation from here on is
			// recorded; the page must cause none.
			chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
				_, err := chromedp.Evaluate[chromedp.Void](`window.cspViolations = []; document.addEventListener('securitypolicyviolation', (e) => window.cspViolations.push(e.violatedDirective + ' ' + e.blockedURI)); window.notReloaded = true;`)(ctx, tg)
				return err
			}),
		)
	}

	signIn(viewer)
	step("machine row", 30*time.Second, stateIs(name, "INVENTORIED"))
	text, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(fmt.Sprintf("tr[data-name=%q]", name))))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"SN-BROWSER-1", "QEMU Virtual CPU", "2 GiB", "2 · 30 GiB", "1 · 1 up"} {
		if !strings.Contains(text, want) {
			t.Errorf("machine row %q lacks %q", text, want)
		}
	}

	// A change made elsewhere (the CLI's RPC) shows without a reload.
	if _, err := a.admin.SetMaintenance(context.Background(), &inventoryv1.SetMaintenanceRequest{Name: name, On: true, Reason: "browser test"}); err != nil {
		t.Fatal(err)
	}
	step("live state change", 40*time.Second, stateIs(name, "MAINTENANCE"))
	if kept, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.notReloaded === true`)); err != nil || !kept {
		t.Errorf("the page reloaded to show the change (%v)", err)
	}
	shot(t, ctx, "machines")

	// The machine's page: facts, and the boot timeline as a picture.
	step("machine page", 30*time.Second,
		chromedp.Navigate(a.base+"/#/machines/"+name),
		chromedp.WaitVisible(chromedp.CSS("svg.timeline rect.phase")),
	)
	phases, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...new Set([...document.querySelectorAll('svg.timeline rect.phase')].map((r) => r.dataset.phase))]`))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"power", "dhcp", "tftp", "script", "kernel+initrd", "agent"} {
		if !strings.Contains(strings.Join(phases, ","), want) {
			t.Errorf("timeline phases %v lack %q", phases, want)
		}
	}
	shot(t, ctx, "machine")

	// The viewer's accept is refused by the API's own role check, shown.
	step("viewer accept refused", 40*time.Second,
		chromedp.Navigate(a.base+"/#/machines"),
		stateIs(other, "INVENTORIED"),
		chromedp.Click(chromedp.CSS(fmt.Sprintf("tr[data-name=%q] button[data-action=accept]", other))),
		chromedp.WaitVisible(chromedp.CSS("#confirm-ok")),
		chromedp.Click(chromedp.CSS("#confirm-ok")),
		noticeHas("PermissionDenied"),
	)
	shot(t, ctx, "viewer-refused")
	checkCSP(t, ctx)

	// An operator's accept goes through.
	step("sign out", 10*time.Second, chromedp.Click(chromedp.CSS("#signout")), chromedp.WaitVisible(chromedp.CSS("#token")))
	signIn(operator)
	step("operator accept", 40*time.Second,
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
	checkCSP(t, ctx)
}

func checkCSP(t *testing.T, ctx context.Context) {
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
func shot(t *testing.T, ctx context.Context, what string) {
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
