package http

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/corralhq/corral/boot/connlimit"
	"github.com/corralhq/corral/internal/lograte"
)

// Limits bound what clients of the boot HTTP server can hold: the LAN it
// serves is hostile (docs/security.md). Zero (or negative) fields take the
// defaults of DefaultLimits; corrald's flags are checked by Validate.
//
// No fixed write timeout: a 48 MB initramfs over an emulated UNDI link
// (~1.2 MB/s) takes 40 s, and a slower link longer. Instead every write
// runs under a progress deadline (WriteStall, boot/connlimit): a response
// that keeps moving is never cut, a client that stops reading is.
type Limits struct {
	// ReadHeaderTimeout bounds reading a request's line and headers
	// (slowloris); ReadTimeout the whole request including a body.
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	// WriteStall cuts a client that takes less than 256 KiB of a response
	// in this long.
	WriteStall time.Duration
	// IdleTimeout closes a keep-alive connection with no request for this
	// long.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds the request line and headers (net/http answers
	// 431 beyond it).
	MaxHeaderBytes int
	// MaxConns caps open connections; MaxConnsPerIP those from one source
	// address. A connection over a cap gets a 503 and is closed.
	MaxConns      int
	MaxConnsPerIP int
}

// DefaultLimits are the limits of a zero Limits: sized for the design
// load, a 5,000-machine row booting at once (iPXE holds one connection per
// machine, and a machine that has booted its kernel leaves it to the idle
// timeout: 83 power-ons a second hold ~5,000), with room to spare. At 8,192
// idle connections the server holds ~20 KB each (a goroutine and its
// buffers), ~160 MB; the per-address cap keeps one host to 32 of them. At
// 1,024 the fleet simulator's 5,000-machine storm had 156-595 scripts
// answered 503 (bench/README.md, Fleet storm).
func DefaultLimits() Limits {
	return Limits{
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteStall:        30 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    16 << 10,
		MaxConns:          8192,
		MaxConnsPerIP:     32,
	}
}

// WithDefaults fills zero or negative fields from DefaultLimits.
func (l Limits) WithDefaults() Limits {
	d := DefaultLimits()
	fill := func(v *time.Duration, def time.Duration) {
		if *v <= 0 {
			*v = def
		}
	}
	fill(&l.ReadHeaderTimeout, d.ReadHeaderTimeout)
	fill(&l.ReadTimeout, d.ReadTimeout)
	fill(&l.WriteStall, d.WriteStall)
	fill(&l.IdleTimeout, d.IdleTimeout)
	for _, f := range []struct {
		v   *int
		def int
	}{{&l.MaxHeaderBytes, d.MaxHeaderBytes}, {&l.MaxConns, d.MaxConns}, {&l.MaxConnsPerIP, d.MaxConnsPerIP}} {
		if *f.v <= 0 {
			*f.v = f.def
		}
	}
	return l
}

// Validate refuses negative limits and a per-address cap above the total,
// naming corrald's flags.
func (l Limits) Validate() error {
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"--http-read-header-timeout", l.ReadHeaderTimeout}, {"--http-read-timeout", l.ReadTimeout}, {"--http-write-stall-timeout", l.WriteStall}, {"--http-idle-timeout", l.IdleTimeout}} {
		if d.v < 0 {
			return fmt.Errorf("%s %s: want a positive duration", d.flag, d.v)
		}
	}
	for _, n := range []struct {
		flag string
		v    int
	}{{"--http-max-header-bytes", l.MaxHeaderBytes}, {"--http-max-conns", l.MaxConns}, {"--http-max-conns-per-ip", l.MaxConnsPerIP}} {
		if n.v < 0 {
			return fmt.Errorf("%s %d: want a positive number", n.flag, n.v)
		}
	}
	if l.MaxConns > 0 && l.MaxConnsPerIP > l.MaxConns {
		return fmt.Errorf("--http-max-conns-per-ip %d is above --http-max-conns %d", l.MaxConnsPerIP, l.MaxConns)
	}
	return nil
}

// listener caps l's connections and puts every write under the progress
// deadline; over a cap, the client reads a 503 saying which.
func (l Limits) listener(lis net.Listener, log *slog.Logger) net.Listener {
	l = l.WithDefaults()
	return connlimit.New(lis, connlimit.Config{
		MaxConns: l.MaxConns, MaxConnsPerIP: l.MaxConnsPerIP, WriteStall: l.WriteStall,
		Refuse: refuse503, Name: "boot-http", Logger: log,
	})
}

func refuse503(c net.Conn, reason string) {
	body := "corral: " + reason + ": retry later\n"
	// Best effort: the connection is closed right after, whatever the peer
	// read of it.
	_, _ = io.WriteString(c, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nRetry-After: 5\r\nConnection: close\r\n"+
		"Content-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
}

// server is the http.Server for h under l: header, request and idle
// timeouts, the header size cap, no fixed write timeout (see Limits), and
// a log line (rate-limited) when a client is cut before its request was
// read.
func (l Limits) server(h http.Handler, log *slog.Logger) *http.Server {
	l = l.WithDefaults()
	w := &connWatch{timeout: l.ReadHeaderTimeout, log: log, waiting: map[net.Conn]waitingConn{}}
	for _, c := range []*lograte.Counter{&w.slow, &w.bad} {
		c.Interval = connlimit.LogEvery
	}
	return &http.Server{
		Handler:           w.handler(h),
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
		ConnState:         w.track,
		ConnContext:       func(ctx context.Context, c net.Conn) context.Context { return context.WithValue(ctx, connKey{}, c) },
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

type connKey struct{}

// connWatch notices connections that close before a request reached the
// handler: a client cut by the read-header timeout (slowloris), or one
// net/http answered 400 or 431 (malformed, or headers over
// MaxHeaderBytes). Its map holds only connections waiting for a request
// (at most the connection cap).
type connWatch struct {
	timeout   time.Duration
	log       *slog.Logger
	mu        sync.Mutex
	waiting   map[net.Conn]waitingConn
	slow, bad lograte.Counter
}

type waitingConn struct {
	since   time.Time // connected, or idle since
	first   bool      // no request yet on this connection
	partial bool      // bytes of a request arrived, the handler has not run
}

func (w *connWatch) track(c net.Conn, st http.ConnState) {
	w.mu.Lock()
	e, ok := w.waiting[c]
	switch st {
	case http.StateNew, http.StateIdle:
		w.waiting[c] = waitingConn{since: time.Now(), first: st == http.StateNew}
	case http.StateActive:
		if ok {
			e.partial = true
			w.waiting[c] = e
		}
	case http.StateHijacked, http.StateClosed:
		delete(w.waiting, c)
	}
	w.mu.Unlock()
	took := time.Since(e.since)
	if st != http.StateClosed || !ok || !e.partial && !(e.first && took >= w.timeout) {
		// An idle connection closed by the idle timeout is no news.
		return
	}
	peer := c.RemoteAddr().String()
	if took >= w.timeout {
		w.slow.Add(1, func(n int64) {
			w.log.Warn("connection cut: request headers not received within the read-header timeout", "peer", peer,
				"read_header_timeout", w.timeout.String(), "cut_since_last_log", n)
		})
		return
	}
	w.bad.Add(1, func(n int64) {
		w.log.Warn("connection closed: malformed request or headers over the size limit (answered 400 or 431)", "peer", peer, "closed_since_last_log", n)
	})
}

// handler marks the request's connection served, and a GRUB client's
// connection to be reset when it closes (connlimit Conn.ResetOnClose:
// GRUB reuses its TCP source ports on every boot). (ReadTimeout needs no
// help: net/http lifts it once the request is read, so it never cancels a
// long download's context.)
func (w *connWatch) handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if c, ok := r.Context().Value(connKey{}).(net.Conn); ok {
			w.mu.Lock()
			delete(w.waiting, c)
			w.mu.Unlock()
			if rc, ok := c.(interface{ ResetOnClose() }); ok && strings.HasPrefix(r.UserAgent(), "GRUB ") {
				rc.ResetOnClose()
			}
		}
		h.ServeHTTP(rw, r)
	})
}
