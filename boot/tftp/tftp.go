// Package tftp serves the first-stage iPXE binaries of the image catalog
// over TFTP (github.com/pin/tftp/v3), read-only: any other name, a path, a
// traversal or a write request is refused with a TFTP error and a log
// line, and every transfer is recorded on the client's boot timeline.
//
// It must not be imported from anything reachable by cmd/corral-node.
package tftp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/corralhq/corral/images"
	"github.com/pin/tftp/v3"
)

// Catalog is what the server needs of images.Catalog.
type Catalog interface {
	Lookup(name string) (images.Artifact, bool)
}

// Recorder appends to a MAC's boot timeline (inventory.Event).
type Recorder interface {
	Event(mac, source, event, detail string, attrs map[string]string)
}

// MACResolver maps a client IP to the MAC that last leased or asked for
// it (boot/dhcp keeps that map); TFTP itself never sees MACs.
type MACResolver interface {
	MACForIP(ip net.IP) (string, bool)
}

// Config configures a Server.
type Config struct {
	// Listen is the UDP address (default ":69").
	Listen string
	// Conn, when set, is used instead of listening on Listen.
	Conn net.PacketConn
	// Catalog supplies the files; only KindIPXE artifacts are served.
	Catalog Catalog
	// Timeline and MACs are optional.
	Timeline Recorder
	MACs     MACResolver
	// Timeout per block (default 2s) and Retries (default 5).
	Timeout time.Duration
	Retries int
	// MaxBlockSize caps the negotiated blksize (default 1468, the largest
	// that fits an Ethernet frame without IP fragmentation).
	MaxBlockSize int
	Logger       *slog.Logger
}

// Server is a read-only TFTP server.
type Server struct {
	cfg   Config
	log   *slog.Logger
	conn  net.PacketConn
	srv   *tftp.Server
	mu    sync.Mutex
	cache map[string][]byte // file contents by name, read once
}

// New validates cfg and binds the socket.
func New(cfg Config) (*Server, error) {
	if cfg.Catalog == nil {
		return nil, errors.New("tftp: Config.Catalog is required")
	}
	if cfg.Listen == "" {
		cfg.Listen = ":69"
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 2 * time.Second
	}
	if cfg.Retries == 0 {
		cfg.Retries = 5
	}
	if cfg.MaxBlockSize == 0 {
		cfg.MaxBlockSize = 1468
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, cache: map[string][]byte{}}
	s.conn = cfg.Conn
	if s.conn == nil {
		c, err := net.ListenPacket("udp4", cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("tftp: listen %s: %w", cfg.Listen, err)
		}
		s.conn = c
	}
	s.srv = tftp.NewServer(s.read, s.write)
	s.srv.SetTimeout(cfg.Timeout)
	s.srv.SetRetries(cfg.Retries)
	s.srv.SetBlockSize(cfg.MaxBlockSize)
	// A fixed back-off instead of the library's random one: a lost ACK in
	// a lock-step transfer should be retried after the timeout, not later.
	s.srv.SetBackoff(func(int) time.Duration { return 0 })
	return s, nil
}

// Addr is the bound address.
func (s *Server) Addr() net.Addr { return s.conn.LocalAddr() }

// Run serves until ctx ends, then waits for transfers in flight (each
// bounded by Timeout×Retries) and returns nil.
func (s *Server) Run(ctx context.Context) error {
	s.log.Info("serving TFTP", "addr", s.conn.LocalAddr().String())
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.conn) }()
	select {
	case <-ctx.Done():
		s.srv.Shutdown()
		<-errc
		return nil
	case err := <-errc:
		return fmt.Errorf("tftp: %w", err)
	}
}

// ErrRefused: the requested name is not a servable catalog file.
var ErrRefused = errors.New("tftp: refused")

// CheckName validates a requested file name and returns the catalog name
// to serve. Only bare names of iPXE binaries are accepted: no directories,
// no absolute paths, no "..", no control bytes. It never touches the file
// system.
func CheckName(name string, c Catalog) (string, error) {
	switch {
	case name == "":
		return "", fmt.Errorf("%w: empty file name", ErrRefused)
	case len(name) > 128:
		return "", fmt.Errorf("%w: file name longer than 128 bytes", ErrRefused)
	case strings.ContainsAny(name, "/\\"):
		return "", fmt.Errorf("%w: %q: paths are not served", ErrRefused, name)
	case strings.Contains(name, ".."):
		return "", fmt.Errorf("%w: %q: traversal", ErrRefused, name)
	}
	for _, r := range name {
		if r < 0x21 || r > 0x7e {
			return "", fmt.Errorf("%w: %q: unprintable byte", ErrRefused, name)
		}
	}
	a, ok := c.Lookup(name)
	if !ok || a.Kind != images.KindIPXE || a.Name != name {
		return "", fmt.Errorf("%w: %q is not an iPXE binary of the catalog", ErrRefused, name)
	}
	return a.Name, nil
}

// content returns the file's bytes, read once and kept: the iPXE binaries
// are small and fixed, and a memory reader saves one read syscall per
// block (see bench/README.md).
func (s *Server) content(name string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b, ok := s.cache[name]; ok {
		return b, nil
	}
	a, _ := s.cfg.Catalog.Lookup(name)
	b, err := os.ReadFile(a.Path)
	if err != nil {
		return nil, err
	}
	s.cache[name] = b
	return b, nil
}

func (s *Server) read(filename string, rf io.ReaderFrom) error {
	start := time.Now()
	ot := rf.(tftp.OutgoingTransfer)
	peer := ot.RemoteAddr()
	mac := s.mac(peer.IP)
	name, err := CheckName(filename, s.cfg.Catalog)
	if err != nil {
		s.log.Warn("tftp request refused", "peer", peer.String(), "mac", mac, "file", filename, "err", err)
		s.event(mac, "tftp-refused", err.Error(), map[string]string{"file": filename, "peer": peer.IP.String()})
		return err // pin/tftp sends it as a TFTP error packet
	}
	b, err := s.content(name)
	if err != nil {
		s.log.Error("tftp: catalog file unreadable", "file", name, "err", err)
		return fmt.Errorf("tftp: %s unreadable", name)
	}
	ot.SetSize(int64(len(b)))
	n, err := rf.ReadFrom(bytes.NewReader(b))
	dur := time.Since(start)
	attrs := map[string]string{"file": name, "bytes": strconv.FormatInt(n, 10), "size": strconv.Itoa(len(b)),
		"duration_ms": strconv.FormatInt(dur.Milliseconds(), 10), "peer": peer.IP.String()}
	if err != nil && n == 0 && strings.Contains(err.Error(), "code=8") {
		// EDK2 asks for tsize first, then aborts (error 8, RFC 2347) and
		// asks again for the file: normal.
		s.log.Debug("tftp size probe", "peer", peer.String(), "mac", mac, "file", name)
		s.event(mac, "tftp-size-probe", fmt.Sprintf("%s: client read the size (%d bytes) and closed, as EDK2 does before the download", name, len(b)), attrs)
		return nil
	}
	if err != nil {
		s.log.Info("tftp transfer ended early", "peer", peer.String(), "mac", mac, "file", name, "bytes", n, "err", err)
		s.event(mac, "tftp-aborted", fmt.Sprintf("%s: %d of %d bytes: %v", name, n, len(b), err), attrs)
		return nil
	}
	s.log.Info("tftp file served", "peer", peer.String(), "mac", mac, "file", name, "bytes", n, "duration", dur.String())
	s.event(mac, "tftp-file", fmt.Sprintf("served %s (%d bytes in %s)", name, n, dur.Round(time.Millisecond)), attrs)
	return nil
}

func (s *Server) write(filename string, wt io.WriterTo) error {
	peer := ""
	if ii, ok := wt.(tftp.IncomingTransfer); ok {
		a := ii.RemoteAddr()
		peer = a.String()
		s.event(s.mac(a.IP), "tftp-refused", "write request", map[string]string{"file": filename, "peer": a.IP.String()})
	}
	s.log.Warn("tftp write request refused", "peer", peer, "file", filename)
	return fmt.Errorf("%w: the server is read-only", ErrRefused)
}

func (s *Server) mac(ip net.IP) string {
	if s.cfg.MACs == nil {
		return ""
	}
	m, _ := s.cfg.MACs.MACForIP(ip)
	return m
}

func (s *Server) event(mac, event, detail string, attrs map[string]string) {
	if s.cfg.Timeline == nil || mac == "" {
		return
	}
	s.cfg.Timeline.Event(mac, "tftp", event, detail, attrs)
}

// Close releases a Server that will not Run.
func (s *Server) Close() error { return s.conn.Close() }
