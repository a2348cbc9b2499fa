package web_test

import (
	"crypto/tls"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	authv1 "github.com/corralhq/corral/api/auth/v1"
)

// TestConsoleSocket: the console socket is refused to a page of another
// origin; on this page's origin its first message must be a token the
// appliance accepts, and a message larger than the bound ends it.
func TestConsoleSocket(t *testing.T) {
	a := startAppliance(t)
	url := "wss" + strings.TrimPrefix(a.base, "https") + "/api/console/m1"
	dial := func(origin string) (*websocket.Conn, error) {
		cfg, err := websocket.NewConfig(url, origin)
		if err != nil {
			t.Fatal(err)
		}
		cfg.TlsConfig = &tls.Config{RootCAs: a.srv.CA().Pool(), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
		return websocket.DialConfig(cfg)
	}
	for _, origin := range []string{"https://evil.example", "http" + strings.TrimPrefix(a.base, "https"), a.base + "/x"} {
		if ws, err := dial(origin); err == nil {
			ws.Close()
			t.Errorf("a console socket from origin %s was accepted", origin)
		}
	}
	// errorOf sends msg and returns the code of the error event that ends
	// the socket, or "closed" when the socket ended without one (the
	// server may close while a message too large is still being sent:
	// the client's write or read then fails).
	errorOf := func(msg string) string {
		t.Helper()
		ws, err := dial(a.base)
		if err != nil {
			t.Fatalf("a console socket from the page's own origin: %v", err)
		}
		defer ws.Close()
		_ = ws.SetDeadline(time.Now().Add(20 * time.Second))
		if err := websocket.Message.Send(ws, msg); err != nil {
			return "closed"
		}
		var got struct {
			Error struct{ Code string } `json:"error"`
		}
		var text string
		if err := websocket.Message.Receive(ws, &text); err != nil {
			return "closed"
		}
		if err := json.Unmarshal([]byte(text), &got); err != nil {
			t.Fatalf("event %q: %v", text, err)
		}
		return got.Error.Code
	}
	for msg, want := range map[string]string{
		`{"token":"not-a-token"}`: "Unauthenticated",
		`{"token":""}`:            "Unauthenticated",
		`hello`:                   "InvalidArgument",
	} {
		if got := errorOf(msg); got != want {
			t.Errorf("first message %.40q: error %q, want %q", msg, got, want)
		}
	}
	if got := errorOf(`{"token":"` + strings.Repeat("x", 8<<10) + `"}`); got != "InvalidArgument" && got != "closed" {
		t.Errorf("a first message of 8 KiB: %q, want the socket ended", got)
	}
}

// TestVMConsoleSocket: a virtual machine's console socket is the
// machine's with a VM target: refused to another origin, its token
// checked, and a VM the appliance does not know answered NotFound by the
// API (an operator's token).
func TestVMConsoleSocket(t *testing.T) {
	a := startAppliance(t)
	url := "wss" + strings.TrimPrefix(a.base, "https") + "/api/vms/nope/console"
	dial := func(origin string) (*websocket.Conn, error) {
		cfg, err := websocket.NewConfig(url, origin)
		if err != nil {
			t.Fatal(err)
		}
		cfg.TlsConfig = &tls.Config{RootCAs: a.srv.CA().Pool(), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
		return websocket.DialConfig(cfg)
	}
	if ws, err := dial("https://evil.example"); err == nil {
		ws.Close()
		t.Error("a VM console socket from another origin was accepted")
	}
	for first, want := range map[string]string{
		`{"token":"not-a-token"}`: "Unauthenticated",
		`{"token":"` + a.tokens[authv1.Role_ROLE_OPERATOR] + `","write":true}`: "NotFound",
	} {
		ws, err := dial(a.base)
		if err != nil {
			t.Fatal(err)
		}
		_ = ws.SetDeadline(time.Now().Add(20 * time.Second))
		if err := websocket.Message.Send(ws, first); err != nil {
			t.Fatal(err)
		}
		var text string
		if err := websocket.Message.Receive(ws, &text); err != nil {
			t.Fatalf("first message %.30q: %v", first, err)
		}
		var got struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if err := json.Unmarshal([]byte(text), &got); err != nil || got.Error.Code != want {
			t.Errorf("first message %.30q: %s, want error %s", first, text, want)
		}
		ws.Close()
	}
}
