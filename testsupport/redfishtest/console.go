package redfishtest

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"

	"golang.org/x/crypto/ssh"
)

// The serial console: the ComputerSystem's SerialConsole (schema v1.13:
// SSH with ServiceEnabled, Port, SharedWithManagerCLI,
// ConsoleEntryCommand, HotKeySequenceDisplay), the manager's older
// SerialConsole (ConnectTypesSupported) and its NetworkProtocol's SSH
// port, and a real SSH server on loopback (golang.org/x/crypto/ssh) that
// checks passwords against the BMC's accounts and bridges each session to
// a console emulator: a login prompt, the keys echoed, and what the test
// prints as the machine (Console.Print). With an entry command the
// session starts at a BMC CLI prompt, and typing the command enters the
// console, as BMCs whose console is shared with their CLI do.

const (
	networkProtocolURI = "/redfish/v1/Managers/1/NetworkProtocol"
	// ConsoleBanner is what the emulator prints when a session enters the
	// console.
	ConsoleBanner = "\r\nCorral test machine ttyS0\r\n\r\nlogin: "
	// CLIPrompt is the BMC CLI's prompt (an entry command set).
	CLIPrompt = "corral-bmc> "
)

// SerialConsoleConfig is how the BMC describes and serves its console.
type SerialConsoleConfig struct {
	// Enabled is SerialConsole.SSH.ServiceEnabled.
	Enabled bool
	// EntryCommand, when set, is the ConsoleEntryCommand: sessions start
	// at the CLI prompt and the command enters the console
	// (SharedWithManagerCLI true).
	EntryCommand string
	// HotKey is HotKeySequenceDisplay.
	HotKey string
	// ManagerOnly describes the console only as an older BMC does: no
	// SerialConsole on the system, the manager's SerialConsole with SSH,
	// the port in its NetworkProtocol.
	ManagerOnly bool
	// Banner is the SSH pre-login banner ("" for none).
	Banner string
	// ReportPort, when not 0, is the port the BMC reports instead of the
	// SSH server's.
	ReportPort int
}

// Console is the BMC's SSH serial console.
type Console struct {
	ln   net.Listener
	Port int

	s  *Server
	mu sync.Mutex
	// guarded by mu
	cfg       SerialConsoleConfig
	signer    ssh.Signer
	passwords int // password and keyboard-interactive attempts
	logins    int
	live      map[io.Writer]struct{} // sessions at the console
	received  bytes.Buffer
}

func newConsole(t testing.TB, s *Server) *Console {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &Console{ln: ln, s: s, cfg: SerialConsoleConfig{Enabled: true, HotKey: "~."}, live: map[io.Writer]struct{}{}}
	if err := c.RotateHostKey(); err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	c.Port, _ = strconv.Atoi(port)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.serveConn(conn)
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); c.closeAll(); wg.Wait() })
	return c
}

// Configure changes how the BMC describes and serves its console.
func (c *Console) Configure(cfg SerialConsoleConfig) {
	c.mu.Lock()
	c.cfg = cfg
	c.mu.Unlock()
}

// RotateHostKey gives the SSH server a new host key, as a BMC reset to
// factory defaults or an impostor would present.
func (c *Console) RotateHostKey() error {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	signer, err := ssh.NewSignerFromKey(key)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.signer = signer
	c.mu.Unlock()
	return nil
}

// HostKey is the fingerprint of the current host key (as
// ssh.FingerprintSHA256 prints it).
func (c *Console) HostKey() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return ssh.FingerprintSHA256(c.signer.PublicKey())
}

// PasswordAttempts counts the credentials the SSH server was offered
// (passwords and keyboard-interactive answers), right or wrong.
func (c *Console) PasswordAttempts() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.passwords
}

// Logins counts successful logins.
func (c *Console) Logins() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.logins
}

// Received is every byte typed at the console (not at the CLI).
func (c *Console) Received() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.received.String()
}

// Print writes p to every session at the console, as the machine's
// serial port output.
func (c *Console) Print(p []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for w := range c.live {
		_, _ = w.Write(p)
	}
}

// Sessions counts the sessions at the console now.
func (c *Console) Sessions() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.live)
}

func (c *Console) closeAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for w := range c.live {
		if ch, ok := w.(ssh.Channel); ok {
			_ = ch.Close()
		}
	}
}

func (c *Console) serveConn(conn net.Conn) {
	defer conn.Close()
	c.mu.Lock()
	signer, banner := c.signer, c.cfg.Banner
	c.mu.Unlock()
	check := func(user, pass string) (*ssh.Permissions, error) {
		c.mu.Lock()
		c.passwords++
		c.mu.Unlock()
		if c.s.login(user, pass) == nil {
			return nil, errors.New("invalid credentials")
		}
		c.mu.Lock()
		c.logins++
		c.mu.Unlock()
		return &ssh.Permissions{}, nil
	}
	cfg := &ssh.ServerConfig{
		PasswordCallback: func(m ssh.ConnMetadata, pw []byte) (*ssh.Permissions, error) { return check(m.User(), string(pw)) },
		KeyboardInteractiveCallback: func(m ssh.ConnMetadata, ask ssh.KeyboardInteractiveChallenge) (*ssh.Permissions, error) {
			ans, err := ask("", "", []string{"Password: "}, []bool{false})
			if err != nil || len(ans) != 1 {
				return nil, errors.New("no answer")
			}
			return check(m.User(), ans[0])
		},
		MaxAuthTries: 3,
	}
	if banner != "" {
		cfg.BannerCallback = func(ssh.ConnMetadata) string { return banner }
	}
	cfg.AddHostKey(signer)
	sc, chans, reqs, err := ssh.NewServerConn(conn, cfg)
	if err != nil {
		return
	}
	defer sc.Close()
	go ssh.DiscardRequests(reqs)
	for nc := range chans {
		if nc.ChannelType() != "session" {
			_ = nc.Reject(ssh.UnknownChannelType, "session channels only")
			continue
		}
		ch, chReqs, err := nc.Accept()
		if err != nil {
			return
		}
		go c.serveSession(ch, chReqs)
	}
}

// serveSession answers pty-req and shell, then runs the CLI (with an
// entry command) and the console emulator on the channel.
func (c *Console) serveSession(ch ssh.Channel, reqs <-chan *ssh.Request) {
	defer ch.Close()
	shell := make(chan struct{})
	go func() {
		started := false
		for r := range reqs {
			ok := r.Type == "pty-req" || r.Type == "shell" && !started || r.Type == "window-change"
			if r.WantReply {
				_ = r.Reply(ok, nil)
			}
			if r.Type == "shell" && !started {
				started = true
				close(shell)
			}
		}
	}()
	<-shell
	c.mu.Lock()
	entry := c.cfg.EntryCommand
	c.mu.Unlock()
	buf := make([]byte, 1024)
	if entry != "" {
		// The BMC's CLI: a line at a time, echoed; the entry command
		// enters the console.
		_, _ = io.WriteString(ch, CLIPrompt)
		var line []byte
	cli:
		for {
			n, err := ch.Read(buf)
			if err != nil {
				return
			}
			for _, b := range buf[:n] {
				if b != '\r' && b != '\n' {
					line = append(line, b)
					_, _ = ch.Write([]byte{b})
					continue
				}
				_, _ = io.WriteString(ch, "\r\n")
				if string(line) == entry {
					break cli
				}
				if len(line) > 0 {
					_, _ = io.WriteString(ch, "unknown command: "+strconv.Quote(string(line))+"\r\n")
				}
				line = line[:0]
				_, _ = io.WriteString(ch, CLIPrompt)
			}
		}
	}
	c.mu.Lock()
	c.live[ch] = struct{}{}
	_, _ = io.WriteString(ch, ConsoleBanner)
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.live, ch)
		c.mu.Unlock()
	}()
	for {
		n, err := ch.Read(buf)
		if err != nil {
			return
		}
		c.mu.Lock()
		c.received.Write(buf[:n])
		// A terminal echoes what is typed.
		_, _ = ch.Write(buf[:n])
		c.mu.Unlock()
	}
}

// serialConsoleJSON is the system's SerialConsole property.
func (c *Console) serialConsoleJSON() (map[string]any, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cfg.ManagerOnly {
		return nil, false
	}
	return map[string]any{
		"MaxConcurrentSessions": 4,
		"SSH": map[string]any{"ServiceEnabled": c.cfg.Enabled, "Port": c.reportPortLocked(), "SharedWithManagerCLI": c.cfg.EntryCommand != "",
			"ConsoleEntryCommand": c.cfg.EntryCommand, "HotKeySequenceDisplay": c.cfg.HotKey},
		"IPMI": map[string]any{"ServiceEnabled": false}, "Telnet": map[string]any{"ServiceEnabled": false},
	}, true
}

func (c *Console) reportPortLocked() int {
	if c.cfg.ReportPort != 0 {
		return c.cfg.ReportPort
	}
	return c.Port
}

// managerSerialConsoleJSON is the manager's (older) SerialConsole.
func (c *Console) managerSerialConsoleJSON() map[string]any {
	c.mu.Lock()
	defer c.mu.Unlock()
	types := []string{"IPMI"}
	if c.cfg.ManagerOnly {
		types = append(types, "SSH")
	}
	return map[string]any{"ServiceEnabled": c.cfg.Enabled, "MaxConcurrentSessions": 4, "ConnectTypesSupported": types}
}

func (c *Console) networkProtocolJSON() map[string]any {
	c.mu.Lock()
	defer c.mu.Unlock()
	return map[string]any{"@odata.id": networkProtocolURI, "@odata.type": "#ManagerNetworkProtocol.v1_5_0.ManagerNetworkProtocol",
		"Id": "NetworkProtocol", "Name": "Manager Network Protocol",
		"SSH":   map[string]any{"ProtocolEnabled": true, "Port": c.reportPortLocked()},
		"HTTPS": map[string]any{"ProtocolEnabled": true, "Port": 443},
		"IPMI":  map[string]any{"ProtocolEnabled": true, "Port": 623}}
}

// DropSessions ends every SSH session at the console (a BMC reset): the
// clients see the session end.
func (c *Console) DropSessions() { c.closeAll() }
