// Package sol streams a machine's serial console over IPMI 2.0
// Serial-over-LAN: an RMCP+ session, the SOL payload activated, console
// bytes both ways until the context ends, the payload deactivated. The
// protocol is github.com/bougou/go-ipmi's (SOLStream, which passes input
// through unchanged and interprets no escape sequence), the library the
// native power provider already uses, so the password stays in this
// process: no ipmitool, no command line or file to keep it in. It imports
// nothing of ours and must not be imported from anything reachable by
// cmd/corral-node.
package sol

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	ipmiclient "github.com/bougou/go-ipmi/pkg/client"
	"github.com/bougou/go-ipmi/pkg/command/transport"
	"github.com/bougou/go-ipmi/pkg/types"
)

// Target is one BMC's SOL endpoint. Password is cleartext only in memory.
type Target struct {
	Host     string
	Port     int // default 623
	Username string
	Password string
	// CipherSuite, when not 0, is the only RMCP+ cipher suite tried;
	// otherwise 17, then 3.
	CipherSuite int
	// ConnectTimeout bounds the session and the payload activation
	// (default 10s).
	ConnectTimeout time.Duration
	// Poll is how often the BMC is asked for output when the machine is
	// quiet (default 50ms).
	Poll time.Duration
	// Ready, when set, is called once the payload is active: bytes flow
	// from here on.
	Ready func()
}

// ErrAuth means the BMC refused the credentials.
var ErrAuth = errors.New("SOL: BMC refused the credentials")

// Stream opens a SOL session on t and copies in to the machine's serial
// port and the machine's output to out until ctx ends (nil), in ends
// (nil) or the session fails (an error). It deactivates the payload and
// closes the session before it returns. out is written from one
// goroutine; in is read from one goroutine that Stream starts and that
// may still be blocked in in.Read after Stream returns, so in should be
// closed by the caller (an io.Pipe).
func Stream(ctx context.Context, t Target, in io.Reader, out io.Writer) error {
	port := t.Port
	if port == 0 {
		port = 623
	}
	connect := t.ConnectTimeout
	if connect <= 0 {
		connect = 10 * time.Second
	}
	poll := t.Poll
	if poll <= 0 {
		poll = 50 * time.Millisecond
	}
	c, err := ipmiclient.NewClient(t.Host, port, t.Username, t.Password)
	if err != nil {
		return fmt.Errorf("SOL: %w", err)
	}
	ciphers := []types.CipherSuiteID{types.CipherSuiteID17, types.CipherSuiteID3}
	if t.CipherSuite != 0 {
		ciphers = []types.CipherSuiteID{types.CipherSuiteID(t.CipherSuite)}
	}
	c.WithInterface(ipmiclient.InterfaceLanplus)
	c.WithCipherSuiteID(ciphers...)
	c.WithMaxPrivilegeLevel(types.PrivilegeLevelAdministrator)
	c.WithTimeout(time.Second).WithRetry(max(1, int(connect/time.Second)))
	cctx, cancel := context.WithTimeout(ctx, connect)
	defer cancel()
	if err := c.Connect(cctx); err != nil {
		dead, stop := context.WithCancel(context.Background())
		stop()
		_ = c.Close(dead)
		if isAuth(err) {
			return fmt.Errorf("%w: %v", ErrAuth, err)
		}
		return fmt.Errorf("SOL session to %s:%d: %w", t.Host, port, err)
	}
	connected := time.Now()
	defer func() {
		closeAwayFromKeepalive(connected)
		bctx, stop := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer stop()
		_ = c.Close(bctx)
	}()
	if _, err := c.ActivatePayload(cctx, &transport.ActivatePayloadRequest{PayloadType: types.PayloadTypeSOL, PayloadInstance: 1}); err != nil {
		// A payload left active by a session that died (ours or another
		// tool's) is taken over: deactivate it and try once more.
		_, _ = c.DeactivatePayload(cctx, &transport.DeactivatePayloadRequest{PayloadType: types.PayloadTypeSOL, PayloadInstance: 1})
		if _, err2 := c.ActivatePayload(cctx, &transport.ActivatePayloadRequest{PayloadType: types.PayloadTypeSOL, PayloadInstance: 1}); err2 != nil {
			return fmt.Errorf("SOL activate on %s:%d: %w", t.Host, port, err)
		}
	}
	defer func() {
		bctx, stop := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer stop()
		_, _ = c.DeactivatePayload(bctx, &transport.DeactivatePayloadRequest{PayloadType: types.PayloadTypeSOL, PayloadInstance: 1})
	}()
	if t.Ready != nil {
		t.Ready()
	}
	// The session's own per-packet timeout and retries stay as set; a BMC
	// that stops answering ends the stream with an error.
	err = c.SOLStream(ctx, in, out, &ipmiclient.SOLStreamOptions{PollInterval: poll})
	if err != nil && ctx.Err() != nil {
		return nil
	}
	return err
}

func isAuth(err error) bool {
	s := strings.ToLower(err.Error())
	for _, w := range []string{"rakp", "unauthorized", "invalid user", "password", "authentication"} {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}

// go-ipmi v0.9.1 keeps a session alive every 30 s from Connect on a
// context that is never cancelled; a keepalive exchange that starts while
// Close tears the session down can find the connection gone and write to
// nil (a panic in the library's goroutine, which would stop corrald). A
// console session outlives 30 s, so Close waits until it is at least
// keepaliveGuard away from a tick.
const (
	keepalivePeriod = 30 * time.Second
	keepaliveGuard  = 2 * time.Second
)

func closeAwayFromKeepalive(connected time.Time) {
	if d := keepaliveWait(time.Since(connected)); d > 0 {
		time.Sleep(d)
	}
}

// keepaliveWait is how long to wait, elapsed after Connect, to be
// keepaliveGuard away from a keepalive tick.
func keepaliveWait(elapsed time.Duration) time.Duration {
	if elapsed < keepalivePeriod-keepaliveGuard {
		return 0
	}
	phase := elapsed % keepalivePeriod
	switch {
	case phase > keepalivePeriod-keepaliveGuard:
		return keepalivePeriod - phase + keepaliveGuard
	case phase < keepaliveGuard:
		return keepaliveGuard - phase
	}
	return 0
}
