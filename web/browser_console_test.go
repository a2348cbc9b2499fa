package web_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	authv1 "github.com/corralhq/corral/api/auth/v1"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/appliance"
	"github.com/corralhq/corral/testsupport/ipmisim"
)

// serialLine is the machine's side of its console: a TCP serial port that
// ipmi_sim's SOL connects to. What the test writes is what the machine
// prints; what arrives is what was typed.
type serialLine struct {
	lis  net.Listener
	conn chan net.Conn
	mu   sync.Mutex
	got  strings.Builder
}

func newSerialLine(t *testing.T) *serialLine {
	t.Helper()
	lis, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	p := &serialLine{lis: lis, conn: make(chan net.Conn, 1)}
	go func() {
		c, err := lis.Accept()
		if err != nil {
			return
		}
		t.Cleanup(func() { c.Close() })
		p.conn <- c
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			p.mu.Lock()
			p.got.Write(buf[:n])
			p.mu.Unlock()
		}
	}()
	return p
}

func (p *serialLine) received() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.got.String()
}

// termText is the text xterm.js shows, read from its buffer.
const termText = `(() => { const t = document.getElementById('console-term'); return t ? t.textContent : ''; })()`

// TestBrowserConsole drives Chromium against a running appliance whose
// machine's BMC is ipmi_sim carrying a serial port over SOL (as the CLI's
// console test does): an operator opens the Console on the machine's
// page, text the machine prints appears in the terminal, and after taking
// the write seat the keys typed in the terminal reach the machine. A
// viewer sees no Console button, and a socket it opens anyway is refused
// by the API. No Content-Security-Policy violation may occur.
func TestBrowserConsole(t *testing.T) {
	if testing.Short() {
		t.Skip("starts ipmi_sim and Chromium")
	}
	line := newSerialLine(t)
	sim := ipmisim.Start(t, ipmisim.Options{SOL: "tcp:" + line.lis.Addr().String()})
	// A short keepalive: the page must answer the pings, and a socket
	// that does not is closed within seconds.
	a := startApplianceWeb(t, appliance.BMCConfig{PollInterval: -1}, appliance.WebConfig{ConsoleKeepalive: time.Second})
	ctx := context.Background()
	if _, err := a.admin.EnrollMachine(ctx, &inventoryv1.EnrollMachineRequest{Name: "m1", BmcAddress: sim.Addr(),
		BmcProtocol: inventoryv1.BmcProtocol_BMC_PROTOCOL_IPMI, BmcUsername: sim.User, BmcPassword: sim.Pass}); err != nil {
		t.Fatalf("enroll: %v", err)
	}
	var w net.Conn
	select {
	case w = <-line.conn:
	case <-time.After(20 * time.Second):
		t.Fatal("ipmi_sim never connected to the serial port")
	}
	viewer, operator := a.tokens[authv1.Role_ROLE_VIEWER], a.tokens[authv1.Role_ROLE_OPERATOR]
	b := startBrowser(t, a)

	// A viewer: no Console button; a socket opened by hand is refused.
	b.signIn(viewer, "m1", 30*time.Second)
	b.step("viewer's machine page", 30*time.Second,
		chromedp.Navigate(a.base+"/#/machines/m1"),
		chromedp.WaitVisible(chromedp.CSS("div.card.console")),
		until(`document.getElementById('console-state').textContent.includes('operator')`, 10*time.Second),
	)
	if n := eval[int](b, `document.querySelectorAll('main [data-action]').length`); n != 0 {
		t.Errorf("a viewer sees %d action controls on the machine page", n)
	}
	b.step("viewer's socket refused", 20*time.Second,
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := chromedp.Evaluate[chromedp.Void](`window.refused = ''; (() => {
				const w = new WebSocket('wss://' + location.host + '/api/console/m1');
				w.onopen = () => w.send(JSON.stringify({ token: sessionStorage.getItem('corral.token'), write: true, take: true }));
				w.onmessage = (ev) => { if (typeof ev.data === 'string') { const m = JSON.parse(ev.data); if (m.error) window.refused = m.error.code; } };
			})(); undefined`)(ctx, tg)
			return err
		}),
		until(`window.refused === 'PermissionDenied'`, 15*time.Second),
	)
	checkCSP(b.ctx, t)

	// An operator: the console, read-only first, then writing.
	b.step("sign out", 10*time.Second, chromedp.Click(chromedp.CSS("#signout")), chromedp.WaitVisible(chromedp.CSS("#token")))
	b.signIn(operator, "m1", 30*time.Second)
	b.step("open the console", 30*time.Second,
		chromedp.Navigate(a.base+"/#/machines/m1"),
		chromedp.WaitVisible(chromedp.CSS("#console-open")),
		chromedp.Click(chromedp.CSS("#console-open")),
		chromedp.WaitVisible(chromedp.CSS("#console-term .xterm")),
		until(`document.getElementById('console-state').textContent.startsWith('Attached')`, 20*time.Second),
	)
	// The link opens once a viewer is attached: print until it shows.
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(eval[string](b, termText), "SeaBIOS (version corral-web)") {
		if time.Now().After(deadline) {
			shot(b.ctx, t, "console-failed")
			t.Fatalf("the machine's output never reached the terminal; it shows %q, state %q", eval[string](b, termText), eval[string](b, `document.getElementById('console-state').textContent`))
		}
		_, _ = w.Write([]byte("SeaBIOS (version corral-web)\r\n"))
		time.Sleep(200 * time.Millisecond)
	}
	shot(b.ctx, t, "console")

	b.step("take write", 20*time.Second,
		chromedp.Click(chromedp.CSS("#console-take")),
		until(`document.getElementById('console-state').textContent.startsWith('Attached, writing')`, 15*time.Second),
		chromedp.Click(chromedp.CSS("#console-term .xterm")),
		typeKeys("root\r"),
	)
	deadline = time.Now().Add(15 * time.Second)
	for !strings.Contains(line.received(), "root\r") {
		if time.Now().After(deadline) {
			t.Fatalf("keys typed in the terminal never reached the machine; it got %q", line.received())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The scrollback came first on the write socket too, and live output
	// still shows.
	_, _ = w.Write([]byte("login: "))
	b.step("live output", 15*time.Second, until(fmt.Sprintf(`%s.includes('login:')`, termText), 10*time.Second))
	shot(b.ctx, t, "console-write")

	// Keepalive: idle for three and a half intervals (past the 2.5 s a
	// silent socket is given), the page's socket answered the pings and
	// is still attached; a socket opened by hand that never answers is
	// closed.
	time.Sleep(3500 * time.Millisecond)
	if st := eval[string](b, `document.getElementById('console-state').textContent`); !strings.HasPrefix(st, "Attached, writing") {
		t.Errorf("after 3.5 s idle the console says %q, want still attached", st)
	}
	b.step("a silent socket is closed", 20*time.Second,
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := chromedp.Evaluate[chromedp.Void](`window.silent = { pings: 0, closed: 0 }; (() => {
				const w = new WebSocket('wss://' + location.host + '/api/console/m1');
				const t0 = Date.now();
				w.onopen = () => w.send(JSON.stringify({ token: sessionStorage.getItem('corral.token') }));
				w.onmessage = (ev) => { if (typeof ev.data === 'string' && JSON.parse(ev.data).event === 'ping') window.silent.pings++; };
				w.onclose = () => { window.silent.closed = Date.now() - t0; };
			})(); undefined`)(ctx, tg)
			return err
		}),
		until(`window.silent.closed > 0`, 15*time.Second),
	)
	if pings, closed := eval[int](b, `window.silent.pings`), eval[int](b, `window.silent.closed`); pings < 1 || closed < 2000 || closed > 6000 {
		t.Errorf("the silent socket got %d pings and was closed after %d ms; want pings and a close after about 2.5 s", pings, closed)
	} else {
		t.Logf("a socket that answers no ping: %d pings, closed after %d ms", pings, closed)
	}
	if st := eval[string](b, `document.getElementById('console-state').textContent`); !strings.HasPrefix(st, "Attached, writing") {
		t.Errorf("the page's own console was cut with the silent one: %q", st)
	}
	checkCSP(b.ctx, t)
}

// typeKeys types keys into the focused element as a keyboard does: one
// keyDown carrying the key's text, then keyUp, per key. (chromedp's
// KeyEvent adds a separate char event, which xterm.js takes as a second
// keystroke: each key arrived twice.)
func typeKeys(keys string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		for _, r := range keys {
			k, ok := kb.Keys[r]
			if !ok {
				return fmt.Errorf("typeKeys: no key for %q", r)
			}
			down := input.DispatchKeyEventParams{Type: kb.KeyDown, Key: k.Key, Code: k.Code, Text: k.Text, UnmodifiedText: k.Unmodified,
				WindowsVirtualKeyCode: k.Windows, NativeVirtualKeyCode: k.Native}
			up := down
			up.Type, up.Text, up.UnmodifiedText = kb.KeyUp, "", ""
			for _, e := range []input.DispatchKeyEventParams{down, up} {
				if _, err := cdp.Call(ctx, tg, input.DispatchKeyEvent, e); err != nil {
					return err
				}
			}
		}
		return nil
	})
}
