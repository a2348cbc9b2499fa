// Package dhcp is corrald's DHCPv4 server for network boot, built on
// github.com/insomniacslk/dhcp server4 and bound to the boot interface.
//
// Modes: full (authoritative for configured ranges, leases durable in the
// store and sticky per MAC, relayed requests answered from the relay's
// subnet), proxy (boot options only, beside another DHCP server, on port 67
// and the PXE boot-server port 4011) and off. The boot file is chosen by
// ChooseBoot from options 93, 60, 77 and 175 (boot/README.md). Every decision
// is appended to the client MAC's boot timeline.
//
// The boot LAN is hostile (clients spoof MACs and addresses), so full mode
// follows RFC 2131 strictly where it matters for the pool:
//   - a lease is written only for an address offered to the client
//     (SELECTING) or for the client's own lease (INIT-REBOOT, RENEWING,
//     REBINDING); a SELECTING REQUEST for an address never offered to the
//     client is NAKed;
//   - INIT-REBOOT (option 50, no server identifier, no ciaddr): a client
//     with no lease here gets no answer (§4.3.2 "MUST remain silent"), one
//     whose lease is another address a NAK, one asking for an address
//     outside the serving subnet (the wrong network) a NAK;
//   - RENEWING/REBINDING (ciaddr) of an address that is not the client's
//     lease is NAKed, so the client restarts at DISCOVER;
//   - DECLINE is honoured only from the client (MAC, and client identifier
//     when both sides know one) that holds or was offered the address; the
//     address is then quarantined for Config.DeclineQuarantine, and a
//     quarantined address is still handed out when nothing else is left.
//
// Several appliances may serve one segment (or one relayed range) in full
// mode over a shared store (etcd): an address is bound only by a
// compare-and-swap at the revision the decision was made on, so no two
// clients are ever ACKed one address; each appliance follows the others'
// leases through a watch so its offers are good (a client is offered its
// lease by every appliance); and a client that two appliances bound at
// once keeps its newer binding, the older is released. Proxy mode hands
// out no addresses and writes no leases, so appliances in proxy mode on
// one segment need no coordination: each answers with boot options only.
//
// Clients are identified by their MAC; the client identifier (option 61)
// is compared where it is known (offers, and leases bound by this process:
// the lease record has no field for it). A network-booting MAC becomes a
// machine through Inventory.EnsureMachineForMAC; when inventory refuses
// (its cap on discovered machines, an error of class
// apierr.ErrExhausted), the client is answered like a plain DHCP client:
// an address, no boot file. Warnings a packet can trigger are rate-limited
// (one line per kind per Config.LogInterval, with the suppressed count).
//
// It must not be imported from anything reachable by cmd/corral-node.
package dhcp

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"
	"golang.org/x/sys/unix"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
)

// Mode is the DHCP mode.
type Mode string

const (
	ModeFull  Mode = "full"
	ModeProxy Mode = "proxy"
	ModeOff   Mode = "off"
)

// ParseMode parses --dhcp-mode.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeFull, ModeProxy, ModeOff:
		return m, nil
	}
	return "", fmt.Errorf("dhcp mode %q: want full, proxy or off", s)
}

// Inventory is what DHCP asks about machines. EnsureMachineForMAC fails
// with an error of class apierr.ErrExhausted when no new machine may be
// recorded (the discovered-machine cap).
type Inventory interface {
	EnsureMachineForMAC(ctx context.Context, mac string) (*inventoryv1.Machine, bool, error)
	BootIntent(ctx context.Context, mac string) (string, inventoryv1.BootIntent, error)
}

// Recorder appends to a MAC's boot timeline (inventory.Event).
type Recorder interface {
	Event(mac, source, event, detail string, attrs map[string]string)
}

// Catalog says which artifacts exist (images.Catalog).
type Catalog interface {
	Has(name string) bool
}

// PXEPort is the PXE boot-server (proxyDHCP) port.
const PXEPort = 4011

// Config configures a Server.
type Config struct {
	Mode Mode
	// Interface is the boot interface; sockets are bound to it, so
	// requests arriving on other interfaces are never seen.
	Interface string
	// ServerIP is our address on Interface (default: its first IPv4).
	ServerIP netip.Addr
	// Ranges: the first non-relayed one serves the boot interface; relayed
	// ones serve requests whose giaddr is inside their subnet. Full mode
	// needs at least one.
	Ranges []Range
	// LeaseTime is option 51 (default 1h).
	LeaseTime time.Duration
	// HTTPBase is http://host:port of boot/http (default
	// http://ServerIP:8080).
	HTTPBase string
	Catalog  Catalog
	// Store keeps leases (full mode).
	Store store.Store
	// Alone says no other appliance writes leases to Store (bbolt): full
	// mode then does not follow the lease records through a watch.
	Alone     bool
	Inventory Inventory
	Timeline  Recorder
	Logger    *slog.Logger
	// Conn and PXEConn replace the sockets bound to Interface on ports 67
	// and 4011 (tests).
	Conn, PXEConn net.PacketConn
	// MaxInFlight bounds concurrently handled packets; more are dropped
	// and counted, so a storm cannot pile up work (default 2048).
	MaxInFlight int
	// ReadBuffer is the socket receive buffer (default 8 MiB; set with
	// SO_RCVBUFFORCE when running as root).
	ReadBuffer int
	// DeclineQuarantine is how long an address a client DECLINEd is kept
	// out of offers (default 10 min); it is still offered when the range
	// has nothing else left.
	DeclineQuarantine time.Duration
	// LogInterval is the least time between two log lines of one kind of
	// per-packet warning (default 1 min); the lines in between are
	// counted and the next one says how many.
	LogInterval time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Observer, when set, is told every packet's outcome (corrald's
	// metrics).
	Observer Observer
}

// Observer is told the outcome of every packet received (corrald counts
// them for /metrics), and for each answer sent how long the server took:
// from the request's arrival (the kernel's receive stamp where the socket
// gives one, else its read) to the answer's write, the server's own share
// of a client's wait (its queue and its lease's flush included, the
// network and the client not). Its labels come from fixed sets — the
// request's message type (MessageTypeName) and one of the Outcome* values
// — never from a client's MAC or address. Its methods must be quick and
// safe for concurrent use.
type Observer interface {
	Packet(msgType, outcome string)
	Answered(msgType string, took time.Duration)
}

// Packet outcomes given to Observer.
const (
	OutcomeOffer     = "offer"            // an OFFER was sent
	OutcomeAck       = "ack"              // an ACK was sent
	OutcomeNak       = "nak"              // a NAK was sent
	OutcomeIgnored   = "ignored"          // no answer (not ours, RFC 2131 silence, not handled; the timeline says why)
	OutcomeNotSent   = "not_sent"         // the answer could not be sent
	OutcomeOverload  = "dropped_overload" // dropped: MaxInFlight handlers busy
	OutcomeMalformed = "malformed"        // did not parse
	OutcomeOther     = "other"            // an answer of another type
)

// MessageTypeName is the Observer label of a DHCP message type: its
// lower-case name, "none" for BOOTP, "other" for values RFC 2132 and its
// successors do not name.
func MessageTypeName(t dhcpv4.MessageType) string {
	switch t {
	case dhcpv4.MessageTypeNone:
		return "none"
	case dhcpv4.MessageTypeDiscover, dhcpv4.MessageTypeOffer, dhcpv4.MessageTypeRequest, dhcpv4.MessageTypeDecline,
		dhcpv4.MessageTypeAck, dhcpv4.MessageTypeNak, dhcpv4.MessageTypeRelease, dhcpv4.MessageTypeInform:
		return strings.ToLower(t.String())
	}
	return "other"
}

func (s *Server) observe(m *dhcpv4.DHCPv4, outcome string) {
	if s.cfg.Observer == nil {
		return
	}
	t := "unknown"
	if m != nil {
		t = MessageTypeName(messageType(m))
	}
	s.cfg.Observer.Packet(t, outcome)
}

// DefaultDeclineQuarantine is Config.DeclineQuarantine's default.
const DefaultDeclineQuarantine = 10 * time.Minute

// Server is the DHCP server.
type Server struct {
	cfg    Config
	log    *slog.Logger
	warn   *logLimiter
	leases *leases
	env    Env
	sem    chan struct{}
	work   chan job // to the workers (unbuffered: a send succeeds only to an idle worker)
	conn   net.PacketConn
	pxe    net.PacketConn
	// connIO and pxeIO read and write conn and pxe without entering the
	// scheduler's syscall state (rawio.go); nil for a socket that is not
	// UDP.
	connIO, pxeIO *udpIO

	dropped  atomic.Uint64
	bad      atomic.Uint64
	bound    atomic.Pointer[bound] // handle's deadlines (set by New, re-rooted by Run)
	seenMu   sync.Mutex
	seen     map[netip.Addr]string // IP → MAC learned from packets (proxy mode, TFTP)
	handlers sync.WaitGroup

	// Option bytes every reply shares (read-only): the server identifier,
	// the lease time, and each range's (by subnet) netmask, routers and
	// DNS servers.
	sid, leaseTime []byte
	netOpts        map[netip.Prefix]netOptions
}

// New validates cfg, loads the leases and binds the sockets.
func New(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Mode == ModeOff {
		return nil, errors.New("dhcp: mode off has no server")
	}
	if _, err := ParseMode(string(cfg.Mode)); err != nil {
		return nil, err
	}
	if cfg.Catalog == nil || cfg.Inventory == nil || cfg.Timeline == nil {
		return nil, errors.New("dhcp: Catalog, Inventory and Timeline are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.LeaseTime == 0 {
		cfg.LeaseTime = time.Hour
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = 2048
	}
	if cfg.ReadBuffer == 0 {
		cfg.ReadBuffer = 8 << 20
	}
	if cfg.DeclineQuarantine == 0 {
		cfg.DeclineQuarantine = DefaultDeclineQuarantine
	}
	if cfg.DeclineQuarantine < 0 {
		return nil, fmt.Errorf("dhcp: decline quarantine %s is negative", cfg.DeclineQuarantine)
	}
	if cfg.LogInterval <= 0 {
		cfg.LogInterval = time.Minute
	}
	if !cfg.ServerIP.IsValid() {
		if cfg.Interface == "" {
			return nil, errors.New("dhcp: Interface or ServerIP is required")
		}
		ip, err := InterfaceIPv4(cfg.Interface)
		if err != nil {
			return nil, err
		}
		cfg.ServerIP = ip
	}
	if cfg.HTTPBase == "" {
		cfg.HTTPBase = "http://" + cfg.ServerIP.String() + ":8080"
	}
	cfg.HTTPBase = strings.TrimSuffix(cfg.HTTPBase, "/")
	for _, r := range cfg.Ranges {
		if err := r.Validate(); err != nil {
			return nil, fmt.Errorf("dhcp: %w", err)
		}
	}
	if cfg.Mode == ModeFull {
		if cfg.Store == nil {
			return nil, errors.New("dhcp: full mode needs a Store for leases")
		}
		if len(cfg.Ranges) == 0 {
			return nil, errors.New("dhcp: full mode needs a range (--dhcp-range)")
		}
	}
	s := &Server{cfg: cfg, log: cfg.Logger, sem: make(chan struct{}, cfg.MaxInFlight), work: make(chan job), seen: map[netip.Addr]string{},
		warn: newLogLimiter(cfg.Logger, cfg.LogInterval, cfg.Now)}
	s.bound.Store(newBound(context.Background()))
	s.sid = ip4(cfg.ServerIP)
	s.leaseTime = binary.BigEndian.AppendUint32(nil, uint32(cfg.LeaseTime/time.Second))
	s.netOpts = make(map[netip.Prefix]netOptions, len(cfg.Ranges))
	for _, r := range cfg.Ranges {
		if _, ok := s.netOpts[r.Subnet]; !ok {
			s.netOpts[r.Subnet] = netOptionsOf(r)
		}
	}
	s.env = Env{
		ScriptURL: func(mac string) string { return cfg.HTTPBase + "/boot.ipxe?mac=" + mac },
		HTTPBase:  cfg.HTTPBase,
		Has:       cfg.Catalog.Has,
		Proxy:     cfg.Mode == ModeProxy,
	}
	if cfg.Store != nil {
		s.leases = newLeases(cfg.Store, cfg.Now, cfg.DeclineQuarantine, s.log)
		n, bad, err := s.leases.load(ctx)
		if err != nil {
			return nil, fmt.Errorf("dhcp: load leases: %w", err)
		}
		for _, k := range bad {
			s.log.Warn("skipping undecodable lease record", "key", k)
		}
		s.log.Info("leases loaded", "count", n)
	}
	s.conn, s.pxe = cfg.Conn, cfg.PXEConn
	var err error
	if s.conn == nil {
		if s.conn, err = s.listen(dhcpv4.ServerPort); err != nil {
			return nil, err
		}
	}
	// Port 4011 in both modes: iPXE takes an offer that echoes PXEClient
	// as its ProxyDHCP offer too and sends a ProxyDHCPREQUEST there before
	// it boots; unanswered, that costs it about 4 s (measured in boot/e2e).
	if s.pxe == nil {
		if s.pxe, err = s.listen(PXEPort); err != nil {
			s.conn.Close()
			return nil, err
		}
	}
	s.connIO, s.pxeIO = newUDPIO(s.conn), newUDPIO(s.pxe)
	return s, nil
}

// InterfaceIPv4 returns the first IPv4 address of an interface.
func InterfaceIPv4(name string) (netip.Addr, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("dhcp: interface %q: %w", name, err)
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("dhcp: interface %q: %w", name, err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP.To4()); ok && n.IP.To4() != nil {
				return ip, nil
			}
		}
	}
	return netip.Addr{}, fmt.Errorf("dhcp: interface %q has no IPv4 address", name)
}

// InterfacePrefix returns the IPv4 prefix of name that contains ip.
func InterfacePrefix(name string, ip netip.Addr) (netip.Prefix, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("interface %q: %w", name, err)
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return netip.Prefix{}, err
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil {
			ones, _ := n.Mask.Size()
			a4, _ := netip.AddrFromSlice(n.IP.To4())
			p := netip.PrefixFrom(a4, ones).Masked()
			if p.Contains(ip) {
				return p, nil
			}
		}
	}
	return netip.Prefix{}, fmt.Errorf("interface %q has no IPv4 network containing %s", name, ip)
}

// listen binds an interface-bound UDP socket with a large receive buffer.
func (s *Server) listen(port int) (net.PacketConn, error) {
	c, err := server4.NewIPv4UDPConn(s.cfg.Interface, &net.UDPAddr{Port: port})
	if err != nil {
		return nil, fmt.Errorf("dhcp: listen on %s port %d: %w", s.cfg.Interface, port, err)
	}
	SetReadBuffer(c, s.cfg.ReadBuffer, s.log)
	return c, nil
}

// SetReadBuffer raises a UDP socket's receive buffer to size: with
// SO_RCVBUFFORCE (root, past net.core.rmem_max) or else as far as
// rmem_max allows.
func SetReadBuffer(c *net.UDPConn, size int, log *slog.Logger) {
	rc, err := c.SyscallConn()
	if err == nil {
		var serr error
		rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, size) })
		if serr == nil {
			return
		}
	}
	if err := c.SetReadBuffer(size); err != nil {
		log.Warn("cannot raise the DHCP receive buffer", "bytes", size, "err", err)
	}
}

// Addr is the port-67 socket's address.
func (s *Server) Addr() net.Addr { return s.conn.LocalAddr() }

// Run serves until ctx ends, waits for handlers in flight and returns nil.
// In full mode it also follows the leases other appliances sharing the
// store write (see leases).
func (s *Server) Run(ctx context.Context) error {
	s.log.Info("serving DHCP", "mode", string(s.cfg.Mode), "interface", s.cfg.Interface, "server_ip", s.cfg.ServerIP.String(), "ranges", fmt.Sprint(s.cfg.Ranges))
	s.bound.Store(newBound(ctx)) // ctx's values, not its end
	var wg sync.WaitGroup
	errc := make(chan error, 2)
	serve := func(conn net.PacketConn, port int) {
		defer wg.Done()
		err := s.serve(ctx, conn, port)
		if ctx.Err() == nil {
			errc <- fmt.Errorf("dhcp: port %d: %w", port, err)
		}
	}
	wctx, stopWorkers := context.WithCancel(ctx) // also when a socket fails
	defer stopWorkers()
	for range min(workers, s.cfg.MaxInFlight) {
		wg.Add(1)
		go func() { defer wg.Done(); s.worker(wctx) }()
	}
	wg.Add(1)
	go serve(s.conn, dhcpv4.ServerPort)
	if s.cfg.Mode == ModeFull && !s.cfg.Alone {
		// Other appliances on the store may bind addresses of our ranges.
		wg.Add(1)
		go func() { defer wg.Done(); s.leases.follow(ctx) }()
	}
	if s.pxe != nil {
		wg.Add(1)
		go serve(s.pxe, PXEPort)
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	s.conn.Close()
	if s.pxe != nil {
		s.pxe.Close()
	}
	stopWorkers()
	wg.Wait()
	s.handlers.Wait()
	return err
}

// serve reads packets from conn until it fails (closed by Run) and hands
// each to a handler goroutine (dispatch bounds them). It replaces
// server4.Server.Serve, which allocated a 4 KiB buffer and formatted a
// debug line per packet: the buffer here is reused (dhcpv4.FromBytes
// copies what it keeps) and nothing is formatted for a good packet.
func (s *Server) serve(ctx context.Context, conn net.PacketConn, port int) error {
	buf := make([]byte, 4096)
	rio := s.rawIO(conn)
	isUDP := rio != nil
	var rd *udpReader
	if isUDP {
		rd = rio.reader(buf)
	}
	for {
		var n int
		var err error
		var peer net.Addr
		var from netip.AddrPort
		var read time.Time // the request's arrival, for the answer time
		if isUDP {
			n, from, read, err = rd.readFrom() // no *UDPAddr per packet
		} else {
			n, peer, err = conn.ReadFrom(buf)
			read = time.Now()
		}
		if err != nil {
			return err
		}
		m, err := dhcpv4.FromBytes(buf[:n])
		if err != nil {
			bad := s.bad.Add(1)
			s.observe(nil, OutcomeMalformed)
			s.warn.Warn(logMalformed, "ignoring malformed DHCP packet", "err", "Error parsing DHCPv4 request: "+err.Error(), "malformed_total", bad)
			continue
		}
		// The source is needed only on the PXE port (respondPXE answers
		// there); on port 67 the packet says where the answer goes.
		var up *net.UDPAddr
		if isUDP {
			if port == PXEPort {
				up = net.UDPAddrFromAddrPort(from)
			}
		} else {
			u, ok := peer.(*net.UDPAddr)
			if !ok {
				continue
			}
			if port == PXEPort {
				up = u
			}
		}
		if up != nil && (up.IP == nil || up.IP.To4().Equal(net.IPv4zero)) {
			// A client without an address: answer by broadcast.
			up = &net.UDPAddr{IP: net.IPv4bcast, Port: up.Port}
		}
		j := job{conn: conn, up: up, m: m, port: port, read: read}
		if s.quick(m, port) {
			s.handle(ctx, j)
			continue
		}
		// The in-flight bound is taken before the goroutine starts, so an
		// overload costs no goroutine per dropped packet.
		select {
		case s.sem <- struct{}{}:
		default:
			n := s.dropped.Add(1)
			s.observe(m, OutcomeOverload)
			s.warn.Warn(logOverloaded, "DHCP overloaded: dropping packets", "in_flight", s.cfg.MaxInFlight, "dropped_total", n)
			continue
		}
		s.handlers.Add(1)
		select {
		case s.work <- j:
		default: // every worker busy: a goroutine of its own
			go s.dispatch(ctx, j)
		}
	}
}

// rawIO is conn's raw reader/writer (nil: use conn's methods).
func (s *Server) rawIO(conn net.PacketConn) *udpIO {
	switch {
	case conn == s.conn:
		return s.connIO
	case conn == s.pxe:
		return s.pxeIO
	}
	return nil
}

// Dropped is how many packets were dropped because MaxInFlight handlers
// were busy; Malformed how many did not parse.
func (s *Server) Dropped() uint64   { return s.dropped.Load() }
func (s *Server) Malformed() uint64 { return s.bad.Load() }

// Superseded is how many older bindings were released because their
// client was bound again in the same subnet (two appliances each bound it
// before seeing the other's binding).
func (s *Server) Superseded() uint64 {
	if s.leases == nil {
		return 0
	}
	return s.leases.superseded.Load()
}

// job is one packet for a worker.
type job struct {
	conn net.PacketConn
	up   *net.UDPAddr
	m    *dhcpv4.DHCPv4
	port int
	read time.Time // when it arrived (the kernel's stamp) or was read
}

// workers is how many handler goroutines live as long as Run: they keep
// their grown stacks, where a goroutine per packet grew a new one for
// every REQUEST (runtime.morestack was ~5 % of the CPU under load).
// Packets beyond them get a goroutine each, up to MaxInFlight.
const workers = 64

func (s *Server) worker(ctx context.Context) {
	for {
		select {
		case j := <-s.work:
			s.dispatch(ctx, j)
		case <-ctx.Done():
			return
		}
	}
}

// quick reports whether m is answered from memory alone, without a store
// or inventory call that could block: a full-mode DISCOVER from a client
// that does not network-boot (the offer is an in-memory reservation and
// such clients get no timeline entry but for a problem, which is queued).
// serve answers those on its own goroutine: half of a plain client's
// packets then cost no goroutine hand-off.
func (s *Server) quick(m *dhcpv4.DHCPv4, port int) bool {
	return port == dhcpv4.ServerPort && s.cfg.Mode == ModeFull && m.OpCode == dhcpv4.OpcodeBootRequest &&
		messageType(m) == dhcpv4.MessageTypeDiscover && !netBoot(m)
}

// dispatch handles one packet: serve took its slot in s.sem and counted it
// in s.handlers; dispatch gives both back.
func (s *Server) dispatch(ctx context.Context, j job) {
	defer func() { <-s.sem; s.handlers.Done() }()
	s.handle(ctx, j)
}

// handleTimeout bounds a packet's store and inventory calls; boundStep is
// how long one shared deadline context serves new packets, so a packet's
// calls end between handleTimeout and handleTimeout+boundStep after it
// arrived.
const (
	handleTimeout = 3 * time.Second
	boundStep     = 100 * time.Millisecond
)

// bound hands out the context packets are handled under: a deadline
// context made once per boundStep and shared by the packets of that
// step, where a context.WithTimeout per packet (a context, a timer and
// its cancel) was ~1 KB of garbage per lease. It ignores the parent's
// cancellation (a packet being answered when Run ends is still answered),
// like WithoutCancel did. Safe for concurrent use.
type bound struct {
	parent context.Context
	cur    atomic.Pointer[boundCtx]
	mu     sync.Mutex // making a new one
}

type boundCtx struct {
	ctx    context.Context
	cancel context.CancelFunc // called by the deadline's own timer as well
	until  time.Time          // when packets stop being given ctx
}

func newBound(parent context.Context) *bound {
	// The store writes of a packet (its lease) may wait for the bbolt
	// store's commit window to share a flush with the packets arriving
	// meanwhile (store/bolt/window.go); an API write never waits for it.
	return &bound{parent: store.WithCommitWindow(context.WithoutCancel(parent))}
}

// ctx returns a context whose deadline is at least handleTimeout and at
// most handleTimeout+boundStep after now.
func (b *bound) ctx(now time.Time) context.Context {
	if c := b.cur.Load(); c != nil && now.Before(c.until) {
		return c.ctx
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if c := b.cur.Load(); c != nil && now.Before(c.until) {
		return c.ctx
	}
	ctx, cancel := context.WithDeadline(b.parent, now.Add(handleTimeout+boundStep))
	b.cur.Store(&boundCtx{ctx: ctx, cancel: cancel, until: now.Add(boundStep)})
	return ctx
}

// handle answers one packet and reports its outcome. Its store and
// inventory calls are bounded by handleTimeout (see bound).
func (s *Server) handle(ctx context.Context, j job) {
	m, conn := j.m, j.conn
	reply, dst := s.Respond(s.bound.Load().ctx(time.Now()), m, j.up, j.port)
	if reply == nil {
		s.observe(m, OutcomeIgnored)
		return
	}
	out := reply.ToBytes()
	mt := messageType(reply)
	recycle(reply) // serialised: nothing refers to it any more
	var err error
	if rio := s.rawIO(conn); rio != nil {
		err = rio.writeTo(out, dst)
	} else {
		_, err = conn.WriteTo(out, dst)
	}
	if err != nil {
		s.observe(m, OutcomeNotSent)
		s.warn.Warn(logNotSent, "DHCP reply not sent", "mac", m.ClientHWAddr.String(), "dst", dst.String(), "err", err)
		return
	}
	if s.cfg.Observer != nil && !j.read.IsZero() {
		// The kernel's stamp is wall-clock time: a clock stepped back
		// meanwhile would make the wait negative.
		s.cfg.Observer.Answered(MessageTypeName(messageType(m)), max(time.Since(j.read), 0))
	}
	switch mt {
	case dhcpv4.MessageTypeOffer:
		s.observe(m, OutcomeOffer)
	case dhcpv4.MessageTypeAck:
		s.observe(m, OutcomeAck)
	case dhcpv4.MessageTypeNak:
		s.observe(m, OutcomeNak)
	default:
		s.observe(m, OutcomeOther)
	}
}

// Respond decides the answer to one request: the reply and where to send
// it, or nil to stay silent. port is the port it arrived on (67 or 4011);
// peer its source. Every decision is recorded on the MAC's timeline.
// It is safe for concurrent use.
func (s *Server) Respond(ctx context.Context, m *dhcpv4.DHCPv4, peer *net.UDPAddr, port int) (*dhcpv4.DHCPv4, *net.UDPAddr) {
	if m.OpCode != dhcpv4.OpcodeBootRequest {
		return nil, nil
	}
	if len(m.ClientHWAddr) != 6 || [6]byte(m.ClientHWAddr) == [6]byte{} {
		s.log.Debug("ignoring DHCP request without an Ethernet MAC", "hwaddr", m.ClientHWAddr.String())
		return nil, nil
	}
	mac := m.ClientHWAddr.String() // formatted once per packet
	mt := messageType(m)
	if mt == dhcpv4.MessageTypeNone {
		s.event(mac, "ignored", "BOOTP request without a DHCP message type", nil)
		return nil, nil
	}
	s.learn(m, mac)
	if port == PXEPort {
		return s.respondPXE(ctx, m, mac, peer)
	}
	if s.cfg.Mode == ModeProxy {
		return s.respondProxy(ctx, m, mac)
	}
	return s.respondFull(ctx, m, mac)
}

// learn keeps IP→MAC pairs a packet reveals (for TFTP's timeline).
func (s *Server) learn(m *dhcpv4.DHCPv4, mac string) {
	s.learnAddr(addrOf(m.ClientIPAddr), mac)
	s.learnAddr(optAddr(m, dhcpv4.OptionRequestedIPAddress), mac)
}

func (s *Server) learnAddr(a netip.Addr, mac string) {
	if !a.IsValid() {
		return
	}
	s.seenMu.Lock()
	if len(s.seen) > 1<<16 {
		clear(s.seen)
	}
	s.seen[a] = mac
	s.seenMu.Unlock()
}

// MACForIP returns the MAC that holds or last asked for ip.
func (s *Server) MACForIP(ip net.IP) (string, bool) {
	a, ok := netip.AddrFromSlice(ip.To4())
	if !ok || ip.To4() == nil {
		return "", false
	}
	if s.leases != nil {
		if mac, ok := s.leases.Owner(a); ok {
			return mac, true
		}
	}
	s.seenMu.Lock()
	defer s.seenMu.Unlock()
	mac, ok := s.seen[a]
	return mac, ok
}

func (s *Server) event(mac, event, detail string, attrs map[string]string) {
	s.cfg.Timeline.Event(mac, "dhcp", event, detail, attrs)
}

// eventN records an entry whose attributes are n's (its map is built
// here, for the entry: most packets record none).
func (s *Server) eventN(mac, event, detail string, n *note) {
	s.event(mac, event, detail, n.attrs())
}

func ip4(a netip.Addr) net.IP {
	if !a.IsValid() {
		return net.IPv4zero.To4()
	}
	b := a.As4()
	return net.IP(b[:])
}

// messageType is m.MessageType() without its allocation (the library
// decodes the one byte through a new buffer on every call, and a packet
// asks ~4 times): option 53 of exactly one byte, else MessageTypeNone.
func messageType(m *dhcpv4.DHCPv4) dhcpv4.MessageType {
	if v := m.Options.Get(dhcpv4.OptionDHCPMessageType); len(v) == 1 {
		return dhcpv4.MessageType(v[0])
	}
	return dhcpv4.MessageTypeNone
}

// optAddr is addrOf(dhcpv4.GetIP(code, m.Options)) without its
// allocations: an option of exactly four bytes, not 0.0.0.0.
func optAddr(m *dhcpv4.DHCPv4, code dhcpv4.OptionCode) netip.Addr {
	v := m.Options.Get(code)
	if len(v) != 4 {
		return netip.Addr{}
	}
	if a := netip.AddrFrom4([4]byte(v)); !a.IsUnspecified() {
		return a
	}
	return netip.Addr{}
}

func addrOf(ip net.IP) netip.Addr {
	a, ok := netip.AddrFromSlice(ip.To4())
	if !ok || ip.To4() == nil || a.IsUnspecified() {
		return netip.Addr{}
	}
	return a
}

// note collects what a packet's timeline entries say about the client.
// Its attribute map is built only when an entry is written: most packets
// (a plain client's DISCOVER and REQUEST) write none, and then nothing is
// formatted for them. set keeps at most len(kv) keys (the call sites set
// at most six).
type note struct {
	c     *Client
	m     *dhcpv4.DHCPv4
	rng   Range
	hasR  bool
	ip    netip.Addr
	hasIP bool
	kv    [8]struct{ k, v string }
	n     int
}

func newNote(c *Client, m *dhcpv4.DHCPv4) *note { return &note{c: c, m: m} }

// set sets attribute k to v.
func (n *note) set(k, v string) {
	for i := range n.n {
		if n.kv[i].k == k {
			n.kv[i].v = v
			return
		}
	}
	if n.n < len(n.kv) {
		n.kv[n.n].k, n.kv[n.n].v = k, v
		n.n++
	}
}

// get returns attribute k as set ("" if not).
func (n *note) get(k string) string {
	for i := range n.n {
		if n.kv[i].k == k {
			return n.kv[i].v
		}
	}
	return ""
}

// setRange and setIP set "range" and "ip", formatted only for an entry.
func (n *note) setRange(r Range)    { n.rng, n.hasR = r, true }
func (n *note) setIP(ip netip.Addr) { n.ip, n.hasIP = ip, true }

// attrs is the attribute map of an entry: the client's, then what was set.
func (n *note) attrs() map[string]string {
	a := clientAttrs(*n.c, n.m)
	if n.hasR {
		a["range"] = n.rng.String()
	}
	if n.hasIP {
		a["ip"] = n.ip.String()
	}
	for _, e := range n.kv[:n.n] {
		a[e.k] = e.v
	}
	return a
}

// clientAttrs describes the client for the timeline.
func clientAttrs(c Client, m *dhcpv4.DHCPv4) map[string]string {
	a := map[string]string{"xid": m.TransactionID.String()}
	if c.HasArch {
		a["arch"] = strconv.Itoa(int(c.Arch))
		a["arch_name"] = c.Arch.String()
	}
	if c.VendorClass != "" {
		a["vendor_class"] = c.VendorClass
	}
	if c.IPXE {
		a["ipxe"] = "true"
	}
	if uc := m.UserClass(); len(uc) > 0 {
		a["user_class"] = strings.Join(uc, ",")
	}
	if g := addrOf(m.GatewayIPAddr); g.IsValid() {
		a["relay"] = g.String()
	}
	return a
}

// relayOf is the relay's address (giaddr) as the lease records it, "" for
// a request that was not relayed.
func relayOf(m *dhcpv4.DHCPv4) string {
	if g := addrOf(m.GatewayIPAddr); g.IsValid() {
		return g.String()
	}
	return ""
}

// identify makes sure a network-booting client has a machine and puts
// its name and boot intent in attrs for the timeline. It returns false
// when inventory refused to record a new machine (the discovered-machine
// cap): the client then gets no boot file.
func (s *Server) identify(ctx context.Context, c Client, attrs *note) bool {
	if !c.NetBoot() {
		return true
	}
	m, created, err := s.cfg.Inventory.EnsureMachineForMAC(ctx, c.MAC)
	if errors.Is(err, apierr.ErrExhausted) {
		s.warn.Warn(logDiscoveredCap, "unknown network-booting MAC not recorded: no boot file for it", "mac", c.MAC, "err", err)
		attrs.set("inventory_error", err.Error())
		return false
	}
	if err != nil {
		s.warn.Warn(logInventory, "inventory: cannot ensure machine", "mac", c.MAC, "err", err)
		attrs.set("inventory_error", err.Error())
		return true
	}
	attrs.set("machine", m.GetName())
	if created {
		attrs.set("new_machine", "true")
	}
	if _, intent, err := s.cfg.Inventory.BootIntent(ctx, c.MAC); err == nil {
		attrs.set("intent", strings.ToLower(strings.TrimPrefix(intent.String(), "BOOT_INTENT_")))
	}
	return true
}

// unrecorded is the boot choice for a network-booting client inventory
// would not record.
func unrecorded(attrs *note) Boot {
	return Boot{Kind: BootNone, Reason: "not booted: " + attrs.get("inventory_error")}
}

// clientID is the client identifier (option 61) as a string, "" if none.
func clientID(m *dhcpv4.DHCPv4) string {
	return string(m.Options.Get(dhcpv4.OptionClientIdentifier))
}

// setBoot applies a boot choice to a reply.
func (s *Server) setBoot(d *dhcpv4.DHCPv4, b Boot, c Client, proxy bool) {
	if b.Kind == BootNone {
		return
	}
	if b.Kind == BootTFTP {
		d.ServerIPAddr = ip4(s.cfg.ServerIP)
	}
	d.BootFileName = b.File
	if b.Echo60 != "" {
		d.Options[dhcpv4.OptionClassIdentifier.Code()] = []byte(b.Echo60)
	}
	if proxy && b.Echo60 == "PXEClient" {
		// PXE_DISCOVERY_CONTROL = 8: take the boot file from this answer,
		// no boot-server discovery.
		d.Options[dhcpv4.OptionVendorSpecificInformation.Code()] = []byte{6, 1, 8, 255}
	}
	if len(c.UUID) > 0 && (c.PXE || c.HTTP) {
		d.Options[dhcpv4.OptionClientMachineIdentifier.Code()] = c.UUID
	}
}

func bootAttrs(attrs map[string]string, b Boot) map[string]string {
	attrs["boot"] = string(b.Kind)
	if b.File != "" {
		attrs["file"] = b.File
	}
	if b.Echo60 != "" {
		attrs["echo_vendor_class"] = b.Echo60
	}
	return attrs
}

// destination is where a reply goes: to the relay (giaddr:67), to the
// client's address for renewals/informs (ciaddr:68), else broadcast.
func destination(req *dhcpv4.DHCPv4) *net.UDPAddr {
	if g := addrOf(req.GatewayIPAddr); g.IsValid() {
		return &net.UDPAddr{IP: ip4(g), Port: dhcpv4.ServerPort}
	}
	if c := addrOf(req.ClientIPAddr); c.IsValid() {
		return &net.UDPAddr{IP: ip4(c), Port: dhcpv4.ClientPort}
	}
	return broadcast
}

// broadcast is where answers to clients without an address go; shared by
// the replies (never modified).
var broadcast = &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpv4.ClientPort}

// rangeFor picks the range serving a request: the relay's subnet for
// relayed requests, the local range otherwise.
func (s *Server) rangeFor(req *dhcpv4.DHCPv4) (Range, bool) {
	if g := addrOf(req.GatewayIPAddr); g.IsValid() {
		for _, r := range s.cfg.Ranges {
			if r.Subnet.Contains(g) {
				return r, true
			}
		}
		return Range{}, false
	}
	for _, r := range s.cfg.Ranges {
		if !r.Relayed {
			return r, true
		}
	}
	return Range{}, false
}

// reply starts the answer to req: what dhcpv4.NewReplyFromRequest with
// the message type and our server identifier makes (the request's xid,
// flags, chaddr and giaddr, its options 61 and 82 copied), built directly:
// without New's random transaction ID (a getrandom per reply, overwritten
// at once), a modifier closure per field, or a copy of the MAC. Options
// are set as the library's encoders would write them.
func (s *Server) reply(req *dhcpv4.DHCPv4, mt dhcpv4.MessageType) *dhcpv4.DHCPv4 {
	op := dhcpv4.OpcodeBootRequest
	if req.OpCode == dhcpv4.OpcodeBootRequest {
		op = dhcpv4.OpcodeBootReply
	}
	d := replies.Get().(*dhcpv4.DHCPv4)
	*d = dhcpv4.DHCPv4{OpCode: op, HWType: req.HWType, ClientHWAddr: req.ClientHWAddr, TransactionID: req.TransactionID,
		Flags: req.Flags, ClientIPAddr: net.IPv4zero, YourIPAddr: net.IPv4zero, ServerIPAddr: net.IPv4zero,
		GatewayIPAddr: req.GatewayIPAddr, Options: d.Options}
	for _, c := range []dhcpv4.OptionCode{dhcpv4.OptionRelayAgentInformation, dhcpv4.OptionClientIdentifier} {
		if v := req.Options.Get(c); v != nil {
			d.Options[c.Code()] = v
		}
	}
	d.Options[dhcpv4.OptionDHCPMessageType.Code()] = msgTypes[mt][:]
	d.Options[dhcpv4.OptionServerIdentifier.Code()] = s.sid
	return d
}

// replies are reply structs handle has written and given back (recycle),
// each with its emptied options map: a reply and its map were ~0.5 KB per
// packet. Replies Respond returns to other callers are never given back.
var replies = sync.Pool{New: func() any { return &dhcpv4.DHCPv4{Options: make(dhcpv4.Options, 8)} }}

// recycle gives a reply handle has written back to replies. Its fields
// refer to the request's memory and to shared option bytes: they are
// dropped, never written to.
func recycle(d *dhcpv4.DHCPv4) {
	o := d.Options
	clear(o)
	*d = dhcpv4.DHCPv4{Options: o}
	replies.Put(d)
}

// msgTypes are option 53's values, shared by the replies (read-only).
var msgTypes = func() (t [256][1]byte) {
	for i := range t {
		t[i][0] = byte(i)
	}
	return t
}()

// netOptions are a range's options 1, 3 and 6 as sent (nil: none).
type netOptions struct{ mask, routers, dns []byte }

func netOptionsOf(r Range) netOptions {
	o := netOptions{mask: net.CIDRMask(r.Subnet.Bits(), 32)}
	if len(r.Router) > 0 {
		o.routers = ipList(r.Router)
	}
	if len(r.DNS) > 0 {
		o.dns = ipList(r.DNS)
	}
	return o
}

// setNet sets the range's options: netmask, routers, DNS servers.
func (s *Server) setNet(d *dhcpv4.DHCPv4, r Range) {
	o, ok := s.netOpts[r.Subnet]
	if !ok {
		o = netOptionsOf(r)
	}
	d.Options[dhcpv4.OptionSubnetMask.Code()] = o.mask
	if o.routers != nil {
		d.Options[dhcpv4.OptionRouter.Code()] = o.routers
	}
	if o.dns != nil {
		d.Options[dhcpv4.OptionDomainNameServer.Code()] = o.dns
	}
}

// setLease sets the lease of ip in r: yiaddr, lease time and setNet's.
func (s *Server) setLease(d *dhcpv4.DHCPv4, r Range, ip netip.Addr) {
	d.YourIPAddr = ip4(ip)
	s.setNet(d, r)
	d.Options[dhcpv4.OptionIPAddressLeaseTime.Code()] = s.leaseTime
}

// ipList is addresses as options 3 and 6 carry them.
func ipList(as []netip.Addr) []byte {
	out := make([]byte, 0, 4*len(as))
	for _, a := range as {
		out = append(out, ip4(a)...)
	}
	return out
}

func (s *Server) respondFull(ctx context.Context, m *dhcpv4.DHCPv4, mac string) (*dhcpv4.DHCPv4, *net.UDPAddr) {
	c := classify(m, mac)
	attrs := newNote(&c, m)
	r, ok := s.rangeFor(m)
	if !ok {
		detail := "no range serves this request"
		if g := addrOf(m.GatewayIPAddr); g.IsValid() {
			detail = "no range for relay " + g.String() + ": configure one with --dhcp-relay-range"
		}
		s.warn.Info(logIgnoredRelay, "DHCP request ignored", "mac", mac, "reason", detail)
		s.eventN(mac, "ignored", detail, attrs)
		return nil, nil
	}
	attrs.setRange(r)
	cid := clientID(m)
	dst := destination(m)
	switch messageType(m) {
	case dhcpv4.MessageTypeDiscover:
		recorded := s.identify(ctx, c, attrs)
		// Clients that do not network-boot (no option 60/77/93/175: BMCs,
		// switches, load generators) get only their problems on the
		// timeline (nak, decline, no-offer, ignored), not every DISCOVER,
		// OFFER and ACK: the timeline is about booting, each entry is a
		// store write, and their lease is in the store anyway.
		if c.NetBoot() {
			s.eventN(mac, "discover", describe("DISCOVER", c), attrs)
		}
		ip, err := s.leases.Offer(mac, cid, r, optAddr(m, dhcpv4.OptionRequestedIPAddress))
		if err != nil {
			s.warn.Warn(logNoOffer, "no address to offer", "mac", mac, "range", r.String(), "err", err)
			s.eventN(mac, "no-offer", err.Error(), attrs)
			return nil, nil
		}
		b := ChooseBoot(c, s.env)
		if !recorded {
			b = unrecorded(attrs)
		}
		rep := s.reply(m, dhcpv4.MessageTypeOffer)
		s.setLease(rep, r, ip)
		s.setBoot(rep, b, c, false)
		if c.NetBoot() {
			a := bootAttrs(map[string]string{"ip": ip.String(), "range": r.String(), "reason": b.Reason}, b)
			s.event(mac, "offer", fmt.Sprintf("OFFER %s, boot %s %s (%s)", ip, b.Kind, b.File, b.Reason), a)
		}
		return rep, dst
	case dhcpv4.MessageTypeRequest:
		return s.request(ctx, m, mac, cid, c, r, attrs, dst)
	case dhcpv4.MessageTypeDecline:
		return s.decline(ctx, m, mac, cid, r, attrs)
	case dhcpv4.MessageTypeRelease:
		ip := addrOf(m.ClientIPAddr)
		attrs.setIP(ip)
		if !ip.IsValid() {
			s.eventN(mac, "ignored", "RELEASE without ciaddr", attrs)
			return nil, nil
		}
		if _, err := s.leases.Release(ctx, mac, ip); err != nil {
			s.eventN(mac, "ignored", "RELEASE "+ip.String()+": "+err.Error(), attrs)
			return nil, nil
		}
		s.eventN(mac, "release", "RELEASE "+ip.String(), attrs)
		return nil, nil
	case dhcpv4.MessageTypeInform:
		b := ChooseBoot(c, s.env)
		rep := s.reply(m, dhcpv4.MessageTypeAck)
		s.setNet(rep, r)
		s.setBoot(rep, b, c, false)
		s.event(mac, "inform", "INFORM answered", bootAttrs(attrs.attrs(), b))
		return rep, dst
	}
	s.eventN(mac, "ignored", "message type "+messageType(m).String()+" is not handled", attrs)
	return nil, nil
}

func describe(what string, c Client) string {
	var parts []string
	if c.HasArch {
		parts = append(parts, fmt.Sprintf("arch %d (%s)", uint16(c.Arch), c.Arch.String()))
	}
	if c.VendorClass != "" {
		parts = append(parts, "vendor class "+strconv.Quote(c.VendorClass))
	}
	if c.IPXE {
		parts = append(parts, "iPXE")
	}
	if len(parts) == 0 {
		parts = append(parts, "no PXE options")
	}
	return what + ": " + strings.Join(parts, ", ")
}

func (s *Server) nak(m *dhcpv4.DHCPv4, mac, why string, attrs *note) (*dhcpv4.DHCPv4, *net.UDPAddr) {
	rep := s.reply(m, dhcpv4.MessageTypeNak)
	rep.UpdateOption(dhcpv4.OptMessage(why))
	rep.YourIPAddr = net.IPv4zero.To4()
	rep.ClientIPAddr = net.IPv4zero.To4()
	if addrOf(m.GatewayIPAddr).IsValid() {
		rep.SetBroadcast()
	}
	s.warn.Info(logNak, "DHCP NAK", "mac", mac, "reason", why)
	s.eventN(mac, "nak", "NAK: "+why, attrs)
	dst := destination(m)
	if !addrOf(m.GatewayIPAddr).IsValid() {
		dst = broadcast
	}
	return rep, dst
}

// request answers a REQUEST in full mode. Its state (RFC 2131 §4.3.2)
// decides what the client must have for an ACK: SELECTING (server
// identifier) an offer of the address or its lease; INIT-REBOOT (option
// 50, no ciaddr) and RENEWING/REBINDING (ciaddr) its lease. Nothing is
// written for a client that has neither.
func (s *Server) request(ctx context.Context, m *dhcpv4.DHCPv4, mac, cid string, c Client, r Range, attrs *note, dst *net.UDPAddr) (*dhcpv4.DHCPv4, *net.UDPAddr) {
	sid := optAddr(m, dhcpv4.OptionServerIdentifier)
	ip := optAddr(m, dhcpv4.OptionRequestedIPAddress)
	state, need := "init-reboot", NeedLease
	switch {
	case sid.IsValid():
		state, need = "selecting", NeedOffer
		if sid != s.cfg.ServerIP {
			// Another server's (on a segment appliances share, for
			// every client another appliance's): not a problem, so a
			// client that does not network-boot gets no entry.
			if c.NetBoot() {
				s.eventN(mac, "ignored", "REQUEST for server "+sid.String()+": the client chose another server", attrs)
			}
			return nil, nil
		}
	case addrOf(m.ClientIPAddr).IsValid():
		state = "renewing"
		ip = addrOf(m.ClientIPAddr)
	}
	attrs.set("state", state)
	if !ip.IsValid() {
		s.eventN(mac, "ignored", "REQUEST ("+state+") without an address", attrs)
		return nil, nil
	}
	attrs.setIP(ip)
	if !r.Contains(ip) {
		if state == "init-reboot" && r.Subnet.Contains(ip) && !s.leases.hasLease(mac) {
			// The right network, an address that is not ours, a client we
			// have no record of: another server's client (§4.3.2).
			s.warn.Info(logUnknownReboot, "INIT-REBOOT REQUEST from a client with no lease: not answered", "mac", mac, "ip", ip.String())
			s.eventN(mac, "ignored", "REQUEST (init-reboot) for "+ip.String()+" (outside "+r.String()+") from a client with no lease here: not answered (RFC 2131 4.3.2)", attrs)
			return nil, nil
		}
		if state == "selecting" || r.Subnet.Contains(ip) || !s.inAnyRange(ip) {
			return s.nak(m, mac, fmt.Sprintf("%s is not in range %s", ip, r), attrs)
		}
		return s.nak(m, mac, fmt.Sprintf("%s belongs to another subnet than %s", ip, r.Subnet), attrs)
	}
	l, err := s.leases.Bind(ctx, mac, cid, need, ip, r, s.cfg.LeaseTime, hostnameOK(m.HostName()), relayOf(m))
	switch {
	case errors.Is(err, ErrNoLease) && state == "init-reboot":
		// RFC 2131 §4.3.2: "If the DHCP server has no record of this
		// client, then it MUST remain silent".
		s.warn.Info(logUnknownReboot, "INIT-REBOOT REQUEST from a client with no lease: not answered", "mac", mac, "ip", ip.String())
		s.eventN(mac, "ignored", "REQUEST (init-reboot) for "+ip.String()+" from a client with no lease here: not answered (RFC 2131 4.3.2)", attrs)
		return nil, nil
	case errors.Is(err, ErrNoLease):
		return s.nak(m, mac, ip.String()+" is not leased to this client", attrs)
	case errors.Is(err, ErrOtherAddress):
		return s.nak(m, mac, fmt.Sprintf("%s is not this client's address (%v)", ip, err), attrs)
	case errors.Is(err, ErrNotOffered):
		return s.nak(m, mac, ip.String()+" was not offered to this client", attrs)
	case errors.Is(err, ErrTaken):
		return s.nak(m, mac, ip.String()+" is leased to another client", attrs)
	case err != nil:
		s.warn.Log(slog.LevelError, logLeaseNotStored, "lease not stored: no ACK", "mac", mac, "ip", ip.String(), "err", err)
		s.eventN(mac, "ack-failed", "lease for "+ip.String()+" not stored: "+err.Error(), attrs)
		return nil, nil
	}
	b := ChooseBoot(c, s.env)
	if !s.identify(ctx, c, attrs) {
		b = unrecorded(attrs)
	}
	rep := s.reply(m, dhcpv4.MessageTypeAck)
	s.setLease(rep, r, ip)
	s.setBoot(rep, b, c, false)
	if c.NetBoot() {
		a := bootAttrs(attrs.attrs(), b)
		a["expires"] = time.Unix(l.GetExpiresUnix(), 0).UTC().Format(time.RFC3339)
		s.event(mac, "ack", fmt.Sprintf("ACK %s (%s) until %s, boot %s %s", ip, state, a["expires"], b.Kind, b.File), a)
	}
	return rep, dst
}

// decline handles a DECLINE in full mode: honoured (the address is
// quarantined) only from the client that holds or was offered the
// address; otherwise ignored, logged (rate-limited) and recorded on the
// sender's timeline. A DECLINE naming another server is not ours.
func (s *Server) decline(ctx context.Context, m *dhcpv4.DHCPv4, mac, cid string, r Range, attrs *note) (*dhcpv4.DHCPv4, *net.UDPAddr) {
	ip := optAddr(m, dhcpv4.OptionRequestedIPAddress)
	if sid := optAddr(m, dhcpv4.OptionServerIdentifier); sid.IsValid() && sid != s.cfg.ServerIP {
		s.eventN(mac, "ignored", "DECLINE for server "+sid.String()+": not ours", attrs)
		return nil, nil
	}
	if !ip.IsValid() || !r.Contains(ip) {
		s.eventN(mac, "ignored", "DECLINE without an address of ours", attrs)
		return nil, nil
	}
	attrs.setIP(ip)
	_, err := s.leases.Decline(ctx, mac, cid, ip, r)
	switch {
	case errors.Is(err, ErrNotHolder), errors.Is(err, ErrTaken):
		s.warn.Warn(logDeclineIgnored, "DECLINE from a client that neither holds nor was offered the address: ignored", "mac", mac, "ip", ip.String())
		s.eventN(mac, "ignored", "DECLINE "+ip.String()+" ignored: this client neither holds nor was offered it", attrs)
		return nil, nil
	case err != nil:
		s.warn.Log(slog.LevelError, logLeaseNotStored, "DECLINE not stored", "mac", mac, "ip", ip.String(), "err", err)
		s.eventN(mac, "ignored", "DECLINE "+ip.String()+": "+err.Error(), attrs)
		return nil, nil
	}
	s.warn.Warn(logDecline, "address declined by client: quarantined", "mac", mac, "ip", ip.String(), "quarantine", s.cfg.DeclineQuarantine.String())
	s.eventN(mac, "decline", fmt.Sprintf("DECLINE %s: address in use on the network, quarantined for %s", ip, s.cfg.DeclineQuarantine), attrs)
	return nil, nil
}

func (s *Server) inAnyRange(ip netip.Addr) bool {
	for _, r := range s.cfg.Ranges {
		if r.Subnet.Contains(ip) {
			return true
		}
	}
	return false
}

// respondProxy answers PXE clients' DISCOVERs with boot options only.
func (s *Server) respondProxy(ctx context.Context, m *dhcpv4.DHCPv4, mac string) (*dhcpv4.DHCPv4, *net.UDPAddr) {
	c := classify(m, mac)
	attrs := newNote(&c, m)
	if messageType(m) != dhcpv4.MessageTypeDiscover {
		if messageType(m) == dhcpv4.MessageTypeRequest && c.NetBoot() {
			if ip := optAddr(m, dhcpv4.OptionRequestedIPAddress); ip.IsValid() {
				attrs.setIP(ip)
			}
			s.eventN(mac, "request-seen", "REQUEST to the network's DHCP server (proxy mode: not ours to answer)", attrs)
		}
		return nil, nil
	}
	if !c.NetBoot() {
		return nil, nil // not a PXE client: the other server's business
	}
	recorded := s.identify(ctx, c, attrs)
	s.eventN(mac, "discover", describe("DISCOVER (proxy)", c), attrs)
	b := ChooseBoot(c, s.env)
	if !recorded {
		b = unrecorded(attrs)
	}
	if b.Kind == BootNone {
		s.eventN(mac, "no-offer", "proxy: "+b.Reason, attrs)
		return nil, nil
	}
	if b.Echo60 == "" {
		b.Echo60 = "PXEClient" // a proxy offer is only recognised with it
	}
	rep := s.reply(m, dhcpv4.MessageTypeOffer)
	s.setBoot(rep, b, c, true)
	rep.YourIPAddr = net.IPv4zero.To4()
	rep.ServerIPAddr = ip4(s.cfg.ServerIP)
	s.event(mac, "offer", fmt.Sprintf("proxy OFFER (no address), boot %s %s (%s)", b.Kind, b.File, b.Reason), bootAttrs(map[string]string{"reason": b.Reason, "proxy": "true"}, b))
	return rep, destination(m)
}

// respondPXE answers the PXE boot-server request on port 4011 (proxy
// mode, and iPXE's ProxyDHCPREQUEST in full mode): an ACK with the boot
// file, sent back to the asking port.
func (s *Server) respondPXE(ctx context.Context, m *dhcpv4.DHCPv4, mac string, peer *net.UDPAddr) (*dhcpv4.DHCPv4, *net.UDPAddr) {
	c := classify(m, mac)
	attrs := newNote(&c, m)
	if messageType(m) != dhcpv4.MessageTypeRequest && messageType(m) != dhcpv4.MessageTypeInform {
		s.eventN(mac, "ignored", "port 4011: "+messageType(m).String()+" is not a boot-server request", attrs)
		return nil, nil
	}
	b := ChooseBoot(c, s.env)
	if b.Kind == BootNone {
		s.eventN(mac, "no-offer", "boot server: "+b.Reason, attrs)
		return nil, nil
	}
	if b.Echo60 == "" {
		b.Echo60 = "PXEClient"
	}
	rep := s.reply(m, dhcpv4.MessageTypeAck)
	s.setBoot(rep, b, c, true)
	rep.YourIPAddr = net.IPv4zero.To4()
	rep.ServerIPAddr = ip4(s.cfg.ServerIP)
	dst := peer
	if dst == nil || dst.IP.Equal(net.IPv4bcast) || dst.IP.IsUnspecified() {
		if ci := addrOf(m.ClientIPAddr); ci.IsValid() {
			dst = &net.UDPAddr{IP: ip4(ci), Port: dhcpv4.ClientPort}
		} else {
			dst = &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpv4.ClientPort}
		}
	}
	s.event(mac, "pxe-ack", fmt.Sprintf("boot-server ACK (port 4011), boot %s %s", b.Kind, b.File), bootAttrs(attrs.attrs(), b))
	return rep, dst
}

// Close releases a Server that will not Run.
func (s *Server) Close() error {
	if s.pxe != nil {
		s.pxe.Close()
	}
	return s.conn.Close()
}
