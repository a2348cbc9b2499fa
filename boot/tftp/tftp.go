// Package tftp serves the first-stage iPXE binaries of the image catalog
// over TFTP (github.com/pin/tftp/v3), read-only: any other name, a path, a
// traversal or a write request is refused with a TFTP error and a log
// line, and every transfer is recorded on the client's boot timeline.
// With the Secure Boot chain on (Config.Grub) it also serves the signed
// loaders (shim, GRUB), the kernels and initramfs GRUB loads, and
// grub/grub.cfg rendered for the MAC leased the client's address.
//
// The boot LAN is hostile (docs/security.md), so what clients can hold is
// bounded (Limits): transfers at once in total and per client address (a
// request over a cap is answered with a TFTP error, never dropped
// silently), each block's retransmissions (Timeout × Retries) and each
// transfer's duration. pin/tftp sends every handler error with code 1
// ("file not found"); the message says what happened.
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
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/corralhq/corral/images"
	"github.com/corralhq/corral/internal/lograte"
	"github.com/corralhq/corral/internal/termsafe"
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

// GrubConfigs renders the Secure Boot chain's GRUB configuration of mac
// for the client at client, which reached the server at host (boot/http's
// Server.GrubConfig). An error is the refusal the client is told.
type GrubConfigs interface {
	GrubConfig(ctx context.Context, mac string, client, host netip.Addr) ([]byte, error)
}

// GrubConfigName is the configuration Debian's signed network GRUB
// reads (its prefix is /grub on the server it came from).
const GrubConfigName = "grub/grub.cfg"

// maxGrubConfig bounds a rendered GRUB configuration.
const maxGrubConfig = 16 << 10

// Config configures a Server.
type Config struct {
	// Listen is the UDP address (default ":69").
	Listen string
	// Conn, when set, is used instead of listening on Listen.
	Conn net.PacketConn
	// Catalog supplies the files; only KindIPXE artifacts and GRUB's
	// arm64 network loader (images.GRUBARM64EFI) are served, plus the
	// Secure Boot chain's files when Grub is set.
	Catalog Catalog
	// Timeline and MACs are optional.
	Timeline Recorder
	MACs     MACResolver
	// Grub, when set, turns the Secure Boot chain on: the signed loaders
	// (images.KindLoader), the kernels and initramfs, and GrubConfigName
	// rendered by Grub for the MAC MACs gives the client's address (no
	// MAC: refused). ServerIP is the appliance's address a request came
	// to when the socket cannot tell (corral.endpoint's host).
	Grub     GrubConfigs
	ServerIP netip.Addr
	// Limits bound transfers; zero fields take DefaultLimits.
	Limits Limits
	// MaxBlockSize caps the negotiated blksize (default 1468, the largest
	// that fits an Ethernet frame without IP fragmentation).
	MaxBlockSize int
	Logger       *slog.Logger
	// Observer, when set, is told every request's outcome (corrald's
	// metrics).
	Observer Observer
}

// Observer is told the outcome of every read or write request (corrald
// counts them for /metrics). file is the catalog name when the request
// named a servable file, else "other": never a client's raw file name, MAC
// or address. outcome is one of the Outcome* values; bytes is what was
// sent. Transfer must be quick and safe for concurrent use.
type Observer interface {
	Transfer(file, outcome string, bytes int64)
}

// Transfer outcomes given to Observer.
const (
	OutcomeServed    = "served"     // the whole file was sent
	OutcomeSizeProbe = "size_probe" // the client read the size and closed (EDK2, normal)
	OutcomeAborted   = "aborted"    // the client stopped mid-transfer
	OutcomeTimeout   = "timeout"    // cut by TransferTimeout
	OutcomeBusy      = "busy"       // refused: a transfer cap
	OutcomeRefused   = "refused"    // refused: not a servable name, or a write
	OutcomeError     = "error"      // the catalog file could not be read
)

// Limits bound what TFTP clients can hold.
type Limits struct {
	// Timeout is how long a block waits for its ACK before it is sent
	// again, Retries how many times (a client gone silent is dropped after
	// Timeout × (Retries+1)).
	Timeout time.Duration
	Retries int
	// MaxTransfers caps the transfers running at once, MaxTransfersPerIP
	// those for one client address.
	MaxTransfers      int
	MaxTransfersPerIP int
	// TransferTimeout cuts a transfer still running after it (an iPXE
	// binary takes well under a second on a LAN; a client that ACKs just
	// before each timeout would otherwise hold its slot for an hour).
	TransferTimeout time.Duration
}

// DefaultLimits are the limits of a zero Limits. A PXE client runs one
// transfer at a time (EDK2: a size probe, then the file). 1,024 at once:
// a busy answer sends a firmware back through DHCP and its boot order, so
// under a row's power-on storm a low cap multiplies the load it sheds
// (the fleet simulator's 5,000-machine storm met 256 thousands of times
// and each refusal came back as a DORA and a new RRQ, bench/README.md);
// a transfer costs a goroutine, a socket and one block of memory.
func DefaultLimits() Limits {
	return Limits{Timeout: 2 * time.Second, Retries: 5, MaxTransfers: 1024, MaxTransfersPerIP: 8, TransferTimeout: 2 * time.Minute}
}

// WithDefaults fills zero or negative fields from DefaultLimits.
func (l Limits) WithDefaults() Limits {
	d := DefaultLimits()
	if l.Timeout <= 0 {
		l.Timeout = d.Timeout
	}
	if l.Retries <= 0 {
		l.Retries = d.Retries
	}
	if l.MaxTransfers <= 0 {
		l.MaxTransfers = d.MaxTransfers
	}
	if l.MaxTransfersPerIP <= 0 {
		l.MaxTransfersPerIP = d.MaxTransfersPerIP
	}
	if l.TransferTimeout <= 0 {
		l.TransferTimeout = d.TransferTimeout
	}
	return l
}

// Validate refuses negative limits and a per-address cap above the total,
// naming corrald's flags.
func (l Limits) Validate() error {
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"--tftp-timeout", l.Timeout}, {"--tftp-transfer-timeout", l.TransferTimeout}} {
		if d.v < 0 {
			return fmt.Errorf("%s %s: want a positive duration", d.flag, d.v)
		}
	}
	for _, n := range []struct {
		flag string
		v    int
	}{{"--tftp-retries", l.Retries}, {"--tftp-max-transfers", l.MaxTransfers}, {"--tftp-max-transfers-per-ip", l.MaxTransfersPerIP}} {
		if n.v < 0 {
			return fmt.Errorf("%s %d: want a positive number", n.flag, n.v)
		}
	}
	if l.MaxTransfers > 0 && l.MaxTransfersPerIP > l.MaxTransfers {
		return fmt.Errorf("--tftp-max-transfers-per-ip %d is above --tftp-max-transfers %d", l.MaxTransfersPerIP, l.MaxTransfers)
	}
	return nil
}

// Server is a read-only TFTP server.
type Server struct {
	cfg   Config
	log   *slog.Logger
	conn  net.PacketConn
	srv   *tftp.Server
	mu    sync.Mutex
	cache map[string][]byte // file contents by name, read once

	slotMu  sync.Mutex
	running int
	perIP   map[netip.Addr]int // only addresses with transfers running: at most MaxTransfers keys
	refused lograte.Counter
}

// New validates cfg and binds the socket.
func New(cfg Config) (*Server, error) {
	if cfg.Catalog == nil {
		return nil, errors.New("tftp: Config.Catalog is required")
	}
	if cfg.Listen == "" {
		cfg.Listen = ":69"
	}
	cfg.Limits = cfg.Limits.WithDefaults()
	if cfg.MaxBlockSize == 0 {
		cfg.MaxBlockSize = 1468
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, cache: map[string][]byte{}, perIP: map[netip.Addr]int{}}
	s.conn = cfg.Conn
	if s.conn == nil {
		c, err := net.ListenPacket("udp4", cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("tftp: listen %s: %w", cfg.Listen, err)
		}
		s.conn = c
	}
	s.srv = tftp.NewServer(s.read, s.write)
	s.srv.SetTimeout(cfg.Limits.Timeout)
	s.srv.SetRetries(cfg.Limits.Retries)
	s.srv.SetBlockSize(cfg.MaxBlockSize)
	// A fixed back-off instead of the library's random one: a lost ACK in
	// a lock-step transfer should be retried after the timeout, not later.
	s.srv.SetBackoff(func(int) time.Duration { return 0 })
	return s, nil
}

// Addr is the bound address.
func (s *Server) Addr() net.Addr { return s.conn.LocalAddr() }

// Run serves until ctx ends, then waits for transfers in flight (each
// bounded by TransferTimeout) and returns nil.
func (s *Server) Run(ctx context.Context) error {
	s.log.Info("serving TFTP", "addr", s.conn.LocalAddr().String())
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.conn) }()
	select {
	case <-ctx.Done():
		s.srv.Shutdown()
		if err := <-errc; err != nil {
			s.log.Warn("TFTP server ended badly during shutdown", "err", err)
		}
		return nil
	case err := <-errc:
		return fmt.Errorf("tftp: %w", err)
	}
}

// ErrRefused means the requested name is not a servable catalog file.
var ErrRefused = errors.New("tftp: refused")

// CheckName validates a requested file name and returns the catalog name
// to serve. Only bare names of iPXE binaries and GRUB's arm64 network
// loader are accepted: no directories,
// no absolute paths, no "..", no control bytes. It never touches the file
// system.
func CheckName(name string, c Catalog) (string, error) {
	return checkName(name, c, false)
}

// checkName is CheckName; chain also accepts the Secure Boot chain's
// files: the signed loaders, kernels and initramfs.
func checkName(name string, c Catalog, chain bool) (string, error) {
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
	if ok && a.Name == name && (a.Kind == images.KindIPXE || a.Name == images.GRUBARM64EFI) {
		return a.Name, nil
	}
	if ok && a.Name == name && chain && (a.Kind == images.KindLoader || a.Kind == images.KindKernel || a.Kind == images.KindInitrd) {
		return a.Name, nil
	}
	return "", fmt.Errorf("%w: %q is not an iPXE binary of the catalog", ErrRefused, name)
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
	// The name is the client's to choose and goes to the log and the
	// timeline: its control characters are escaped (internal/termsafe). A
	// catalog name has none, so what is served does not change.
	filename = termsafe.Escape(filename)
	start := time.Now()
	ot := rf.(tftp.OutgoingTransfer)
	peer := ot.RemoteAddr()
	mac := s.mac(peer.IP)
	ip, _ := netip.AddrFromSlice(peer.IP)
	ip = ip.Unmap()
	if reason := s.acquire(ip); reason != "" {
		s.observe("other", OutcomeBusy, 0)
		s.refusedLog(peer.String(), mac, filename, reason)
		s.event(mac, "tftp-refused", reason, map[string]string{"file": filename, "peer": peer.IP.String()})
		return errors.New(reason) // sent as a TFTP error packet
	}
	defer s.release(ip)
	chain := s.cfg.Grub != nil
	if chain {
		// GRUB names files from the root of its (tftp) device; shim
		// names grubx64.efi beside its own path.
		filename = strings.TrimPrefix(filename, "/")
		if filename == GrubConfigName {
			return s.grubConfig(rf, ot, peer, ip, mac, start)
		}
		if chainProbe(filename) {
			// Optional files the loaders look for and go on without:
			// not worth a warning on every boot.
			s.observe("other", OutcomeRefused, 0)
			s.log.Debug("tftp: optional loader file not served", "peer", peer.String(), "mac", mac, "file", filename)
			s.event(mac, "tftp-not-served", "optional file the Secure Boot loaders look for (they go on without it)", map[string]string{"file": filename, "peer": peer.IP.String()})
			return fmt.Errorf("%w: %q is not served", ErrRefused, filename)
		}
	}
	name, err := checkName(filename, s.cfg.Catalog, chain)
	if err != nil {
		s.observe("other", OutcomeRefused, 0)
		s.log.Warn("tftp request refused", "peer", peer.String(), "mac", mac, "file", filename, "err", err)
		s.event(mac, "tftp-refused", err.Error(), map[string]string{"file": filename, "peer": peer.IP.String()})
		return err // pin/tftp sends it as a TFTP error packet
	}
	body, size, err := s.open(name)
	if err != nil {
		s.observe(name, OutcomeError, 0)
		s.log.Error("tftp: catalog file unreadable", "file", name, "err", err)
		return fmt.Errorf("tftp: %s unreadable", name)
	}
	if c, ok := body.(io.Closer); ok {
		defer c.Close()
	}
	return s.send(rf, ot, peer, mac, name, body, size, start)
}

// chainProbe reports whether name is one of the optional files the Secure
// Boot loaders ask for and boot without: shim's revocation and
// certificate updates beside it, GRUB's module lists and per-platform
// configuration under its prefix.
func chainProbe(name string) bool {
	switch {
	case name == "revocations_sku.efi", name == "revocations_sbat.efi",
		strings.HasPrefix(name, "shim_certificate_") && strings.HasSuffix(name, ".efi") && len(name) <= 40:
		return true
	case strings.HasPrefix(name, "grub/x86_64-efi/") && (strings.HasSuffix(name, ".lst") || strings.HasSuffix(name, ".cfg")) && len(name) <= 48:
		return true
	}
	return false
}

// open returns a catalog file's content: the small first-stage binaries
// from memory (content), kernels and initramfs from their file.
func (s *Server) open(name string) (io.Reader, int64, error) {
	if a, _ := s.cfg.Catalog.Lookup(name); a.Kind == images.KindKernel || a.Kind == images.KindInitrd {
		f, err := os.Open(a.Path)
		if err != nil {
			return nil, 0, err
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, 0, err
		}
		return f, st.Size(), nil
	}
	b, err := s.content(name)
	if err != nil {
		return nil, 0, err
	}
	return bytes.NewReader(b), int64(len(b)), nil
}

// grubConfig answers GrubConfigName: the configuration rendered for the
// MAC leased the client's address, or the refusal as a TFTP error.
func (s *Server) grubConfig(rf io.ReaderFrom, ot tftp.OutgoingTransfer, peer net.UDPAddr, ip netip.Addr, mac string, start time.Time) error {
	refuse := func(reason string) error {
		s.observe("other", OutcomeRefused, 0)
		s.log.Warn("tftp request refused", "peer", peer.String(), "mac", mac, "file", GrubConfigName, "err", reason)
		s.event(mac, "tftp-refused", reason, map[string]string{"file": GrubConfigName, "peer": peer.IP.String()})
		return fmt.Errorf("%w: %s", ErrRefused, reason)
	}
	if mac == "" {
		return refuse(fmt.Sprintf("%s holds no DHCP lease: the GRUB configuration is rendered for the MAC leased the client's address", ip))
	}
	host := s.cfg.ServerIP
	if pi, ok := rf.(tftp.RequestPacketInfo); ok {
		if a, ok := netip.AddrFromSlice(pi.LocalIP()); ok && !a.IsUnspecified() {
			host = a.Unmap()
		}
	}
	if !host.IsValid() {
		return refuse("the server's own address is unknown")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := s.cfg.Grub.GrubConfig(ctx, mac, ip, host)
	if err != nil {
		return refuse(err.Error())
	}
	if len(b) > maxGrubConfig {
		return refuse(fmt.Sprintf("GRUB configuration is %d bytes, limit %d", len(b), maxGrubConfig))
	}
	return s.send(rf, ot, peer, mac, GrubConfigName, bytes.NewReader(b), int64(len(b)), start)
}

// send transfers body (size bytes) as file name and records the outcome.
func (s *Server) send(rf io.ReaderFrom, ot tftp.OutgoingTransfer, peer net.UDPAddr, mac, name string, body io.Reader, size int64, start time.Time) error {
	ot.SetSize(size)
	n, err := rf.ReadFrom(&deadlineReader{r: body, deadline: start.Add(s.cfg.Limits.TransferTimeout), timeout: s.cfg.Limits.TransferTimeout})
	dur := time.Since(start)
	attrs := map[string]string{"file": name, "bytes": strconv.FormatInt(n, 10), "size": strconv.FormatInt(size, 10),
		"duration_ms": strconv.FormatInt(dur.Milliseconds(), 10), "peer": peer.IP.String()}
	if err != nil && n == 0 && strings.Contains(err.Error(), "code=8") {
		// EDK2 asks for tsize first, then aborts (error 8, RFC 2347) and
		// asks again for the file: normal.
		s.observe(name, OutcomeSizeProbe, n)
		s.log.Debug("tftp size probe", "peer", peer.String(), "mac", mac, "file", name)
		s.event(mac, "tftp-size-probe", fmt.Sprintf("%s: client read the size (%d bytes) and closed, as EDK2 does before the download", name, size), attrs)
		return nil
	}
	if errors.Is(err, errTransferTimeout) {
		s.observe(name, OutcomeTimeout, n)
		s.log.Warn("tftp transfer cut: too slow", "peer", peer.String(), "mac", mac, "file", name, "bytes", n, "transfer_timeout", s.cfg.Limits.TransferTimeout.String())
		s.event(mac, "tftp-aborted", fmt.Sprintf("%s: %d of %d bytes: %v", name, n, size, err), attrs)
		return nil
	}
	if err != nil {
		s.observe(name, OutcomeAborted, n)
		s.log.Info("tftp transfer ended early", "peer", peer.String(), "mac", mac, "file", name, "bytes", n, "err", err)
		s.event(mac, "tftp-aborted", fmt.Sprintf("%s: %d of %d bytes: %v", name, n, size, err), attrs)
		return nil
	}
	s.observe(name, OutcomeServed, n)
	s.log.Info("tftp file served", "peer", peer.String(), "mac", mac, "file", name, "bytes", n, "duration", dur.String())
	s.event(mac, "tftp-file", fmt.Sprintf("served %s (%d bytes in %s)", name, n, dur.Round(time.Millisecond)), attrs)
	return nil
}

// acquire takes a transfer slot for ip, or says why not (the TFTP error
// message the client gets).
func (s *Server) acquire(ip netip.Addr) string {
	s.slotMu.Lock()
	defer s.slotMu.Unlock()
	l := s.cfg.Limits
	if s.running >= l.MaxTransfers {
		return fmt.Sprintf("server busy: %d transfers running (limit %d), retry later", s.running, l.MaxTransfers)
	}
	if s.perIP[ip] >= l.MaxTransfersPerIP {
		return fmt.Sprintf("too many transfers from %s (limit %d), retry later", ip, l.MaxTransfersPerIP)
	}
	s.running++
	s.perIP[ip]++
	return ""
}

func (s *Server) release(ip netip.Addr) {
	s.slotMu.Lock()
	defer s.slotMu.Unlock()
	s.running--
	if s.perIP[ip]--; s.perIP[ip] <= 0 {
		delete(s.perIP, ip)
	}
}

// refusedLog logs a refusal for a cap at most once per 10 s, with the
// count since the previous line.
func (s *Server) refusedLog(peer, mac, file, reason string) {
	s.refused.Add(1, func(n int64) {
		s.log.Warn("tftp transfer refused: limit reached", "peer", peer, "mac", mac, "file", file, "reason", reason, "refused_since_last_log", n)
	})
}

// errTransferTimeout ends a transfer that ran past TransferTimeout.
var errTransferTimeout = errors.New("transfer took too long")

// deadlineReader fails once deadline has passed; pin/tftp then aborts the
// transfer with a TFTP error carrying the message.
type deadlineReader struct {
	r        io.Reader
	deadline time.Time
	timeout  time.Duration
}

func (d *deadlineReader) Read(p []byte) (int, error) {
	if time.Now().After(d.deadline) {
		return 0, fmt.Errorf("%w (limit %s)", errTransferTimeout, d.timeout)
	}
	return d.r.Read(p)
}

func (s *Server) write(filename string, wt io.WriterTo) error {
	filename = termsafe.Escape(filename) // as in read
	peer := ""
	if ii, ok := wt.(tftp.IncomingTransfer); ok {
		a := ii.RemoteAddr()
		peer = a.String()
		s.event(s.mac(a.IP), "tftp-refused", "write request", map[string]string{"file": filename, "peer": a.IP.String()})
	}
	s.observe("other", OutcomeRefused, 0)
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

func (s *Server) observe(file, outcome string, n int64) {
	if s.cfg.Observer != nil {
		s.cfg.Observer.Transfer(file, outcome, n)
	}
}

// Close releases a Server that will not Run.
func (s *Server) Close() error { return s.conn.Close() }
