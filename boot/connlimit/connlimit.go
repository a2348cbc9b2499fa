// Package connlimit bounds what clients can hold of a TCP server: how many
// connections in total and from one source address, and how long a write
// to one client may make no progress. boot/http wraps its listener with it
// (the boot LAN is hostile: docs/security.md), and so does the
// appliance's gRPC API listener (appliance).
//
// A connection over a cap is accepted and closed at once (after an
// optional refusal message), never queued: accepting is how the source
// address becomes known, and a queue would let a flood delay the
// legitimate clients behind it. Refusals and stalled writes are logged at
// most once per LogEvery with the count since the previous line.
//
// It imports nothing of Corral's; it lives under boot/ because boot may
// import only its own folder besides api, images and internal/apierr
// (imports_test.go).
package connlimit

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/corralhq/corral/internal/lograte"
)

// LogEvery is the shortest interval between two log lines about the same
// kind of refusal.
const LogEvery = 10 * time.Second

// progressChunk is the most a single write may carry under one write
// deadline: a client must take at least this many bytes every WriteStall
// (256 KiB per 30 s is 8.7 KB/s, far below any boot link).
const progressChunk = 256 << 10

// Config configures a Listener.
type Config struct {
	// MaxConns caps the connections open at once; MaxConnsPerIP caps those
	// from one source address. Zero or less is no cap.
	MaxConns      int
	MaxConnsPerIP int
	// WriteStall, when positive, cuts a connection whose write moves no
	// more than progressChunk bytes in that long: each write (and each
	// sendfile chunk) runs under a fresh deadline, so a transfer that
	// keeps flowing is never cut however long it takes.
	WriteStall time.Duration
	// Refuse, when set, is called with a connection about to be closed for
	// a cap (reason says which) and may write a short answer. The write
	// runs under a 100 ms deadline in the accept loop.
	Refuse func(c net.Conn, reason string)
	// Name says which server in log lines ("boot-http", "grpc").
	Name   string
	Logger *slog.Logger
}

// Listener is a net.Listener that enforces Config. Its methods are safe
// for concurrent use.
type Listener struct {
	net.Listener
	cfg Config
	log *slog.Logger

	mu    sync.Mutex
	open  int
	perIP map[netip.Addr]int // only addresses with open connections: at most MaxConns keys

	refusedTotal, refusedPerIP, stalled lograte.Counter
}

// New wraps l. Closing the Listener closes l; connections it handed out
// stay open until their own Close.
func New(l net.Listener, cfg Config) *Listener {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ln := &Listener{Listener: l, cfg: cfg, log: cfg.Logger, perIP: map[netip.Addr]int{}}
	for _, c := range []*lograte.Counter{&ln.refusedTotal, &ln.refusedPerIP, &ln.stalled} {
		c.Interval = LogEvery
	}
	return ln
}

// Accept returns the next connection within the caps. Connections over a
// cap are refused (Config.Refuse, then closed) without returning; errors
// of the wrapped listener are returned as they are.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := addrOf(c.RemoteAddr())
		if ctr, limit, reason := l.admit(ip); ctr != nil {
			l.refuse(c, ip, ctr, limit, reason)
			continue
		}
		return &Conn{Conn: c, l: l, ip: ip}, nil
	}
}

// admit takes a slot for ip, or says which cap refuses it (its counter,
// its name in logs and a reason for the client).
func (l *Listener) admit(ip netip.Addr) (ctr *lograte.Counter, limit, reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cfg.MaxConns > 0 && l.open >= l.cfg.MaxConns {
		return &l.refusedTotal, "total", "too many connections (limit " + strconv.Itoa(l.cfg.MaxConns) + ")"
	}
	if l.cfg.MaxConnsPerIP > 0 && l.perIP[ip] >= l.cfg.MaxConnsPerIP {
		return &l.refusedPerIP, "per_ip", "too many connections from " + ip.String() + " (limit " + strconv.Itoa(l.cfg.MaxConnsPerIP) + ")"
	}
	l.open++
	l.perIP[ip]++
	return nil, "", ""
}

func (l *Listener) release(ip netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if l.perIP[ip]--; l.perIP[ip] <= 0 {
		delete(l.perIP, ip)
	}
}

func (l *Listener) refuse(c net.Conn, ip netip.Addr, ctr *lograte.Counter, limit, reason string) {
	ctr.Add(1, func(n int64) {
		l.log.Warn("connection refused: limit reached", "server", l.cfg.Name, "peer", ip.String(), "limit", limit, "reason", reason, "refused_since_last_log", n)
	})
	if l.cfg.Refuse != nil {
		// Best effort: the refusal is a courtesy on a connection about to be
		// closed, and a write that cannot be bounded is cut by the Close.
		_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		l.cfg.Refuse(c, reason)
	}
	c.Close()
}

// Open is the number of connections open now.
func (l *Listener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// OpenFrom is the number of connections open now from ip.
func (l *Listener) OpenFrom(ip netip.Addr) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.perIP[ip]
}

func addrOf(a net.Addr) netip.Addr {
	if ta, ok := a.(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(ta.IP); ok {
			return ip.Unmap()
		}
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{} // one bucket for addresses that do not parse
	}
	return ap.Addr().Unmap()
}

// Conn is a connection handed out by a Listener: Close gives its slot
// back (once), and with Config.WriteStall every write runs under a
// progress deadline. ReadFrom keeps sendfile for *os.File sources.
type Conn struct {
	net.Conn
	l      *Listener
	ip     netip.Addr
	closed atomic.Bool

	// resetOnClose and halfClosed: see ResetOnClose.
	resetOnClose, halfClosed atomic.Bool
}

// Close closes the connection and releases its slot; later calls return
// the wrapped connection's error and release nothing. Marked by
// ResetOnClose, it may end the connection with a reset.
func (c *Conn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.l.release(c.ip)
		if c.resetOnClose.Load() && !c.halfClosed.Load() {
			c.reset()
		}
	}
	return c.Conn.Close()
}

// ResetOnClose marks the connection of a client that reuses its TCP
// source ports across reboots (GRUB numbers them from the same value on
// every boot): its Close then ends the connection with a reset (SO_LINGER
// 0) instead of a FIN, provided every byte written was acknowledged and no
// CloseWrite already sent a FIN. A FIN close leaves this side in LAST-ACK,
// FIN-WAIT or TIME-WAIT for up to minutes, GRUB never answers those
// states, and a rebooted GRUB that opens the same 4-tuple meanwhile is
// answered with the old connection's ACK and fails; after a reset nothing
// of the 4-tuple remains. A server closes such a connection only once its
// conversation is over (the peer closed, or it idled out), so what the
// reset could discard is nothing the peer still waits for.
func (c *Conn) ResetOnClose() { c.resetOnClose.Store(true) }

// reset sets SO_LINGER 0 on a TCP connection whose writes are all
// acknowledged (Close then sends a reset); otherwise it leaves the close
// as it is.
func (c *Conn) reset() {
	tc, ok := c.Conn.(*net.TCPConn)
	if !ok {
		return
	}
	if n, err := unacked(tc); err != nil || n != 0 {
		return
	}
	_ = tc.SetLinger(0) // best effort: a failure leaves the ordinary close
}

// CloseWrite half-closes a TCP connection (net/http uses it to finish a
// response before closing).
func (c *Conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		c.halfClosed.Store(true)
		return cw.CloseWrite()
	}
	return nil
}

// Write writes b in chunks of at most progressChunk, each under a fresh
// write deadline when WriteStall is set.
func (c *Conn) Write(b []byte) (int, error) {
	if c.l.cfg.WriteStall <= 0 {
		return c.Conn.Write(b)
	}
	n := 0
	for len(b) > 0 {
		chunk := b[:min(len(b), progressChunk)]
		if err := c.Conn.SetWriteDeadline(time.Now().Add(c.l.cfg.WriteStall)); err != nil {
			return n, err
		}
		m, err := c.Conn.Write(chunk)
		n += m
		b = b[m:]
		if err != nil {
			return n, c.stallErr(err)
		}
	}
	return n, nil
}

// ReadFrom copies r to the connection. On a *net.TCPConn with an
// *os.File source (alone or in one *io.LimitedReader, as http.ServeContent
// passes it) the kernel's sendfile does the copy, in progressChunk pieces
// each under a fresh write deadline when WriteStall is set.
func (c *Conn) ReadFrom(r io.Reader) (int64, error) {
	rf, ok := c.Conn.(io.ReaderFrom)
	if !ok {
		return io.Copy(writerOnly{c}, r)
	}
	if c.l.cfg.WriteStall <= 0 {
		return rf.ReadFrom(r)
	}
	// Unwrap one LimitedReader so that each chunk is a LimitedReader over
	// the file itself, which is what net's sendfile recognises.
	src, remain := r, int64(-1)
	lr, limited := r.(*io.LimitedReader)
	if limited {
		src, remain = lr.R, lr.N
	}
	var total int64
	var err error
	for remain != 0 {
		want := int64(progressChunk)
		if remain > 0 {
			want = min(want, remain)
		}
		if err := c.Conn.SetWriteDeadline(time.Now().Add(c.l.cfg.WriteStall)); err != nil {
			return total, err
		}
		var n int64
		n, err = rf.ReadFrom(&io.LimitedReader{R: src, N: want})
		total += n
		if remain > 0 {
			remain -= n
		}
		if err != nil || n < want {
			break // error, or the source ended
		}
	}
	if limited {
		lr.N = remain
	}
	if err != nil {
		return total, c.stallErr(err)
	}
	return total, nil
}

// stallErr logs a write that hit its progress deadline and returns err.
func (c *Conn) stallErr(err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		c.l.stalled.Add(1, func(n int64) {
			c.l.log.Warn("connection cut: client stopped reading", "server", c.l.cfg.Name, "peer", c.ip.String(),
				"write_stall", c.l.cfg.WriteStall.String(), "cut_since_last_log", n)
		})
	}
	return err
}

// writerOnly hides Conn's ReadFrom from io.Copy (no recursion).
type writerOnly struct{ io.Writer }
