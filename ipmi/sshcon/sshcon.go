// Package sshcon streams a machine's serial console from a BMC that
// serves it over SSH (a Redfish ComputerSystem's SerialConsole.SSH, or a
// manager's SSH CLI): an SSH session with a pty and a shell, the BMC's
// console entry command typed when it has one, then console bytes both
// ways until the context ends. The protocol is golang.org/x/crypto/ssh.
//
// The BMC's host key is checked in the key exchange, before any
// credential is sent: only the pinned key is accepted, and with none
// pinned, Target.Pin must store the key presented (trust on first use)
// before the password goes out. What the BMC says outside the console
// stream (its pre-login banner, its disconnect reasons inside errors) is
// bounded and escaped here. It imports nothing of ours but the
// control-character escaping, and must not be imported from anything
// reachable by cmd/corral-node.
package sshcon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/corralhq/corral/internal/termsafe"
)

// Bounds of what the BMC says outside the console stream.
const (
	// MaxBanner bounds the BMC's pre-login banner copied to the console.
	MaxBanner = 2048
	// MaxEntryCommand bounds the console entry command typed at the BMC.
	MaxEntryCommand = 256
	// maxErrText bounds a BMC's words inside an error.
	maxErrText = 512
)

// Target is one BMC's SSH serial console. Password is cleartext only in
// memory.
type Target struct {
	Host     string
	Port     int // default 22
	Username string
	Password string
	// HostKey is the pinned host key: "SHA256:" and the unpadded base64
	// of the key's SHA-256 (ssh.FingerprintSHA256). Empty: Pin decides.
	HostKey string
	// Pin is called, when HostKey is empty, with the fingerprint the BMC
	// presents, during the key exchange and before authentication: nil
	// stores it and goes on, an error ends the stream with nothing sent.
	// Nil Pin with no HostKey refuses every key.
	Pin func(fingerprint string) error
	// EntryCommand, when set, is typed (with a carriage return) at the
	// BMC's shell to reach the machine's console (Redfish
	// SerialConsole.SSH.ConsoleEntryCommand). Printable ASCII, at most
	// MaxEntryCommand bytes.
	EntryCommand string
	// ConnectTimeout bounds the TCP connect, the key exchange, the login
	// and the session's start (default 10s).
	ConnectTimeout time.Duration
	// Keepalive is how often the BMC is asked whether it is there while
	// the machine is quiet (default 30s; a BMC that does not answer
	// within it ends the stream).
	Keepalive time.Duration
	// Ready, when set, is called once the console carries bytes.
	Ready func()
}

// Errors of Stream. A refused host key is a *HostKeyError.
var (
	// ErrAuth: the BMC refused the credentials.
	ErrAuth = errors.New("SSH console: BMC refused the credentials")
	// ErrHostKey: the BMC presented a host key other than the pinned one
	// (or none is pinned and Pin refused it); no credential was sent.
	ErrHostKey = errors.New("SSH console: BMC host key not trusted")
	// ErrInvalid: the target cannot be used as it is.
	ErrInvalid = errors.New("SSH console: invalid target")
)

// HostKeyError is a refused BMC host key.
type HostKeyError struct {
	// Pinned is the pinned fingerprint ("" when none is).
	Pinned string
	// Presented is the fingerprint of the key the BMC presented.
	Presented string
}

func (e *HostKeyError) Error() string {
	return fmt.Sprintf("BMC SSH host key changed: pinned %s, presented %s", e.Pinned, e.Presented)
}

// Unwrap makes errors.Is(err, ErrHostKey) hold.
func (e *HostKeyError) Unwrap() error { return ErrHostKey }

// CheckEntryCommand accepts a console entry command as it may be typed:
// printable ASCII, at most MaxEntryCommand bytes ("" is none).
func CheckEntryCommand(s string) error {
	if len(s) > MaxEntryCommand {
		return fmt.Errorf("%w: console entry command of %d bytes: at most %d", ErrInvalid, len(s), MaxEntryCommand)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return fmt.Errorf("%w: console entry command %s holds a byte that is not printable ASCII", ErrInvalid, clip(s))
		}
	}
	return nil
}

// Stream opens an SSH session on t, types the entry command, and copies
// in to the machine's console and the console's output to out until ctx
// ends (nil), in ends (nil) or the session fails or the BMC ends it (an
// error). The BMC's banner, at most MaxBanner bytes with control
// characters other than CR, LF and tab escaped, goes to out first. out is
// written from one goroutine at a time; in is read from a goroutine that
// may still be blocked in in.Read after Stream returns, so the caller
// should close in (an io.Pipe).
func Stream(ctx context.Context, t Target, in io.Reader, out io.Writer) error {
	if err := CheckEntryCommand(t.EntryCommand); err != nil {
		return err
	}
	if t.Host == "" || t.Username == "" {
		return fmt.Errorf("%w: a host and a user name are required", ErrInvalid)
	}
	port := t.Port
	if port == 0 {
		port = 22
	}
	if port < 1 || port > 65535 {
		return fmt.Errorf("%w: port %d", ErrInvalid, port)
	}
	connect := t.ConnectTimeout
	if connect <= 0 {
		connect = 10 * time.Second
	}
	keepalive := t.Keepalive
	if keepalive <= 0 {
		keepalive = 30 * time.Second
	}
	addr := net.JoinHostPort(t.Host, strconv.Itoa(port))

	var mu sync.Mutex // out
	write := func(p []byte) error {
		mu.Lock()
		defer mu.Unlock()
		_, err := out.Write(p)
		return err
	}
	var (
		kmu     sync.Mutex // the key exchange's goroutine and this one
		refused error
		pinned  = t.HostKey
	)
	prompts := 0
	cfg := &ssh.ClientConfig{
		User: t.Username,
		Auth: []ssh.AuthMethod{
			ssh.Password(t.Password),
			// Many BMCs ask for the password by keyboard-interactive;
			// it is answered to one hidden prompt, twice at most.
			ssh.KeyboardInteractive(func(_, _ string, questions []string, echos []bool) ([]string, error) {
				prompts++
				if prompts > 2 || len(questions) > 1 {
					return nil, errors.New("unexpected prompts")
				}
				answers := make([]string, len(questions))
				for i := range questions {
					if !echos[i] {
						answers[i] = t.Password
					}
				}
				return answers, nil
			}),
		},
		// Every key exchange (a re-key too) checks the key; the first
		// one runs before the password is sent.
		HostKeyCallback: func(_ string, _ net.Addr, key ssh.PublicKey) error {
			got := ssh.FingerprintSHA256(key)
			kmu.Lock()
			defer kmu.Unlock()
			switch {
			case pinned != "" && got == pinned:
				return nil
			case pinned != "":
				refused = &HostKeyError{Pinned: pinned, Presented: got}
			case t.Pin == nil:
				refused = &HostKeyError{Presented: got}
			default:
				if err := t.Pin(got); err != nil {
					refused = err
				} else {
					pinned = got
				}
			}
			return refused
		},
		BannerCallback: func(msg string) error {
			return write([]byte(banner(msg)))
		},
		Timeout: connect,
	}
	cctx, cancel := context.WithTimeout(ctx, connect)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(cctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("SSH console %s: %w", addr, err)
	}
	// The handshake, the login and the session's start are bounded by
	// the connect timeout, and by ctx.
	_ = conn.SetDeadline(time.Now().Add(connect))
	stopWatch := context.AfterFunc(cctx, func() { _ = conn.Close() })
	sc, chans, reqs, err := ssh.NewClientConn(conn, addr, cfg)
	if err != nil {
		stopWatch()
		_ = conn.Close()
		kmu.Lock()
		r := refused
		kmu.Unlock()
		switch {
		case r != nil:
			return r
		case strings.Contains(err.Error(), "unable to authenticate"):
			return fmt.Errorf("%w (%s as %s)", ErrAuth, addr, clip(t.Username))
		case ctx.Err() != nil:
			return nil
		}
		return fmt.Errorf("SSH console %s: %s", addr, clip(err.Error()))
	}
	client := ssh.NewClient(sc, chans, reqs)
	defer client.Close()
	sess, err := client.NewSession()
	if err != nil {
		stopWatch()
		return fmt.Errorf("SSH console %s: session: %s", addr, clip(err.Error()))
	}
	defer sess.Close()
	stdin, err := sess.StdinPipe()
	if err != nil {
		stopWatch()
		return fmt.Errorf("SSH console %s: %w", addr, err)
	}
	sink := writerFunc(write)
	sess.Stdout, sess.Stderr = sink, sink
	modes := ssh.TerminalModes{ssh.ECHO: 1, ssh.TTY_OP_ISPEED: 115200, ssh.TTY_OP_OSPEED: 115200}
	if err := sess.RequestPty("vt100", 24, 80, modes); err != nil {
		stopWatch()
		return fmt.Errorf("SSH console %s: pty: %s", addr, clip(err.Error()))
	}
	if err := sess.Shell(); err != nil {
		stopWatch()
		return fmt.Errorf("SSH console %s: shell: %s", addr, clip(err.Error()))
	}
	if t.EntryCommand != "" {
		if _, err := io.WriteString(stdin, t.EntryCommand+"\r"); err != nil {
			stopWatch()
			return fmt.Errorf("SSH console %s: entry command: %w", addr, err)
		}
	}
	if !stopWatch() {
		return nil // ctx ended during the start
	}
	_ = conn.SetDeadline(time.Time{})
	if t.Ready != nil {
		t.Ready()
	}

	done := make(chan error, 1)
	go func() { done <- sess.Wait() }()
	go func() {
		_, _ = io.Copy(stdin, in)
		_ = stdin.Close()
	}()
	tick := time.NewTicker(keepalive)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-done:
			if ctx.Err() != nil {
				return nil
			}
			if err != nil {
				return fmt.Errorf("SSH console %s: the BMC ended the session: %s", addr, clip(err.Error()))
			}
			return fmt.Errorf("SSH console %s: the BMC ended the session", addr)
		case <-tick.C:
			if err := ping(ctx, client, keepalive); err != nil {
				return fmt.Errorf("SSH console %s: the BMC stopped answering: %s", addr, clip(err.Error()))
			}
		}
	}
}

// ping sends one keepalive and waits up to within for the answer (any
// answer, a refusal too, says the BMC is there).
func ping(ctx context.Context, c *ssh.Client, within time.Duration) error {
	errc := make(chan error, 1)
	go func() {
		_, _, err := c.SendRequest("keepalive@openssh.com", true, nil)
		errc <- err
	}()
	t := time.NewTimer(within)
	defer t.Stop()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		return nil
	case <-t.C:
		_ = c.Close()
		return errors.New("no answer to a keepalive")
	}
}

type writerFunc func([]byte) error

func (f writerFunc) Write(p []byte) (int, error) {
	if err := f(p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// banner is the BMC's pre-login banner as the console shows it: at most
// MaxBanner bytes, control characters other than CR, LF and tab escaped
// (an escape sequence in a banner would reach every viewer's terminal
// before any machine output).
func banner(msg string) string {
	if len(msg) > MaxBanner {
		msg = msg[:MaxBanner] // a rune cut in two is escaped as bytes
	}
	var b strings.Builder
	start := 0
	for i := 0; i < len(msg); i++ {
		if c := msg[i]; c == '\r' || c == '\n' || c == '\t' {
			b.WriteString(termsafe.Escape(msg[start:i]))
			b.WriteByte(c)
			start = i + 1
		}
	}
	b.WriteString(termsafe.Escape(msg[start:]))
	return b.String()
}

// clip makes a BMC's words safe to print and store: escaped, at most
// maxErrText bytes.
func clip(s string) string {
	s = termsafe.Escape(s)
	if len(s) > maxErrText {
		s = s[:maxErrText] + "…"
	}
	return s
}
