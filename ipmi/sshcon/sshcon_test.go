package sshcon_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/ipmi/sshcon"
	"github.com/corralhq/corral/testsupport/redfishtest"
)

// syncBuffer is a bytes.Buffer safe for a writer and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func waitFor(t *testing.T, what string, s func() string, want string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(s(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %q never arrived; got %q", what, want, s())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stream is one Stream running against srv's console.
type stream struct {
	in   *io.PipeWriter
	out  *syncBuffer
	done chan error
	stop context.CancelFunc
}

func start(t *testing.T, tg sshcon.Target) *stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	inR, inW := io.Pipe()
	s := &stream{in: inW, out: &syncBuffer{}, done: make(chan error, 1), stop: cancel}
	go func() { s.done <- sshcon.Stream(ctx, tg, inR, s.out) }()
	t.Cleanup(func() {
		cancel()
		inW.Close()
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			t.Error("Stream did not return after its context ended")
		}
	})
	return s
}

func (s *stream) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-s.done:
		s.done <- err
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("Stream did not return")
		return nil
	}
}

func target(srv *redfishtest.Server) sshcon.Target {
	return sshcon.Target{Host: srv.Host, Port: srv.Console.Port, Username: srv.User, Password: srv.Pass, ConnectTimeout: 10 * time.Second}
}

// TestStreamEchoAndFirstUse: the key presented is handed to Pin before
// the password goes out; the console's login prompt arrives, typed keys
// reach the console and its echo comes back; ctx's end is no error.
func TestStreamEchoAndFirstUse(t *testing.T) {
	srv := redfishtest.Start(t, "admin", "s3cret", &redfishtest.MemMachine{})
	tg := target(srv)
	var pinned []string
	var attemptsAtPin int
	tg.Pin = func(fp string) error {
		pinned = append(pinned, fp)
		attemptsAtPin = srv.Console.PasswordAttempts()
		return nil
	}
	ready := make(chan struct{})
	tg.Ready = func() { close(ready) }
	s := start(t, tg)
	waitFor(t, "login prompt", s.out.String, "login: ")
	<-ready
	if len(pinned) != 1 || pinned[0] != srv.Console.HostKey() {
		t.Fatalf("Pin heard %q, want the server's key %s once", pinned, srv.Console.HostKey())
	}
	if attemptsAtPin != 0 {
		t.Fatalf("the server saw %d password attempts before the key was pinned", attemptsAtPin)
	}
	if _, err := s.in.Write([]byte("root\r")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "keys at the console", srv.Console.Received, "root\r")
	waitFor(t, "echo", s.out.String, "login: root")
	srv.Console.Print([]byte("Password: "))
	waitFor(t, "machine output", s.out.String, "Password: ")
	s.stop()
	if err := s.wait(t); err != nil {
		t.Fatalf("Stream after ctx's end: %v", err)
	}
}

// TestStreamEntryCommand: a console shared with the BMC's CLI is entered
// by typing the BMC's entry command; keys typed afterwards reach the
// console, not the CLI.
func TestStreamEntryCommand(t *testing.T) {
	srv := redfishtest.Start(t, "admin", "s3cret", &redfishtest.MemMachine{})
	srv.Console.Configure(redfishtest.SerialConsoleConfig{Enabled: true, EntryCommand: "console system1"})
	tg := target(srv)
	tg.HostKey = srv.Console.HostKey()
	tg.EntryCommand = "console system1"
	s := start(t, tg)
	waitFor(t, "console after the entry command", s.out.String, redfishtest.CLIPrompt+"console system1\r\n"+redfishtest.ConsoleBanner)
	if _, err := s.in.Write([]byte("ls\r")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "keys at the console", srv.Console.Received, "ls\r")
	if strings.Contains(srv.Console.Received(), "console system1") {
		t.Fatal("the entry command reached the machine's console")
	}
}

// TestStreamWrongPassword: refused with ErrAuth, no login.
func TestStreamWrongPassword(t *testing.T) {
	srv := redfishtest.Start(t, "admin", "s3cret", &redfishtest.MemMachine{})
	tg := target(srv)
	tg.HostKey = srv.Console.HostKey()
	tg.Password = "wrong"
	err := start(t, tg).wait(t)
	if !errors.Is(err, sshcon.ErrAuth) {
		t.Fatalf("wrong password: %v, want ErrAuth", err)
	}
	if srv.Console.Logins() != 0 || srv.Console.PasswordAttempts() == 0 {
		t.Fatalf("logins %d, attempts %d", srv.Console.Logins(), srv.Console.PasswordAttempts())
	}
}

// TestStreamHostKeyChangedGetsNoPassword is the attack: a BMC (or an
// impostor at its address) presenting another host key than the pinned
// one is refused in the key exchange with both fingerprints, and the SSH
// server never sees a password; with nothing pinned and no Pin, or a Pin
// that refuses, the same.
func TestStreamHostKeyChangedGetsNoPassword(t *testing.T) {
	srv := redfishtest.Start(t, "admin", "s3cret", &redfishtest.MemMachine{})
	pinned := srv.Console.HostKey()
	if err := srv.Console.RotateHostKey(); err != nil {
		t.Fatal(err)
	}
	tg := target(srv)
	tg.HostKey = pinned
	tg.Pin = func(string) error { t.Error("Pin called with a key pinned"); return nil }
	err := start(t, tg).wait(t)
	var he *sshcon.HostKeyError
	if !errors.As(err, &he) || !errors.Is(err, sshcon.ErrHostKey) || he.Pinned != pinned || he.Presented != srv.Console.HostKey() {
		t.Fatalf("changed key: %v, want a HostKeyError pinned %s presented %s", err, pinned, srv.Console.HostKey())
	}
	if !strings.Contains(err.Error(), pinned) || !strings.Contains(err.Error(), srv.Console.HostKey()) {
		t.Fatalf("error %q does not name both keys", err)
	}

	tg = target(srv)
	if err := start(t, tg).wait(t); !errors.Is(err, sshcon.ErrHostKey) {
		t.Fatalf("no pin, no Pin: %v", err)
	}
	refuse := errors.New("store says no")
	tg.Pin = func(string) error { return refuse }
	if err := start(t, tg).wait(t); !errors.Is(err, refuse) {
		t.Fatalf("Pin refusing: %v", err)
	}
	if n := srv.Console.PasswordAttempts(); n != 0 {
		t.Fatalf("the SSH server saw %d password attempts from a client that did not trust its key", n)
	}
}

// TestStreamBannerBounded: the BMC's pre-login banner reaches the console
// escaped (no ESC, no BEL: an OSC 52 clipboard write stays text) and
// bounded; a hostile entry command is refused before anything is dialled.
func TestStreamBannerBounded(t *testing.T) {
	srv := redfishtest.Start(t, "admin", "s3cret", &redfishtest.MemMachine{})
	hostile := "Welcome\r\n\x1b]52;c;cm0gLXJmIH4=\x07\x9b31m" + strings.Repeat("A", 64<<10) + "\r\n"
	srv.Console.Configure(redfishtest.SerialConsoleConfig{Enabled: true, Banner: hostile})
	tg := target(srv)
	tg.HostKey = srv.Console.HostKey()
	s := start(t, tg)
	waitFor(t, "login prompt", s.out.String, "login: ")
	out := s.out.String()
	pre, _, _ := strings.Cut(out, redfishtest.ConsoleBanner)
	if strings.ContainsAny(pre, "\x1b\x07") || strings.Contains(pre, "\u009b") {
		t.Fatalf("banner reached the console with raw controls: %q", pre[:min(len(pre), 80)])
	}
	if !strings.Contains(pre, `\x1b]52;c;`) || !strings.HasPrefix(pre, "Welcome\r\n") {
		t.Fatalf("banner not shown escaped: %q", pre[:min(len(pre), 80)])
	}
	if len(pre) > 4*sshcon.MaxBanner {
		t.Fatalf("banner of %d bytes reached the console, want at most ~%d", len(pre), sshcon.MaxBanner)
	}

	tg.EntryCommand = "console\x1b[2J"
	before := srv.Console.PasswordAttempts()
	if err := start(t, tg).wait(t); !errors.Is(err, sshcon.ErrInvalid) {
		t.Fatalf("entry command with controls: %v", err)
	}
	tg.EntryCommand = strings.Repeat("x", sshcon.MaxEntryCommand+1)
	if err := start(t, tg).wait(t); !errors.Is(err, sshcon.ErrInvalid) {
		t.Fatalf("entry command too long: %v", err)
	}
	if srv.Console.PasswordAttempts() != before {
		t.Fatal("a refused target reached the BMC")
	}
}

// TestStreamSessionEnds: the BMC ending the session is an error (the hub
// opens the link again), not a quiet nil.
func TestStreamSessionEnds(t *testing.T) {
	srv := redfishtest.Start(t, "admin", "s3cret", &redfishtest.MemMachine{})
	tg := target(srv)
	tg.HostKey = srv.Console.HostKey()
	s := start(t, tg)
	waitFor(t, "login prompt", s.out.String, "login: ")
	srv.Console.DropSessions()
	if err := s.wait(t); err == nil || !strings.Contains(err.Error(), "ended the session") {
		t.Fatalf("session dropped: %v", err)
	}
}
