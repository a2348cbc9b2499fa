// Package dhcp is corrald's DHCPv4 server for network boot, bound to the
// boot interface. Packets are decoded and encoded with
// github.com/insomniacslk/dhcp's dhcpv4 (server4 only opens the
// interface-bound sockets); the read loop is this package's own: recvmsg
// and sendto straight on the socket through the runtime's poller
// (rawio.go), a fixed pool of handler goroutines behind it (serve.go).
//
// Files, one concern each: serve.go (sockets, the read loop, handler
// deadlines), full.go (full mode's RFC 2131 answers), decide.go (the boot
// file, a pure function of the request), proxy.go (proxy mode and the
// PXE boot-server port), reply.go (building replies), leases.go,
// follow.go and range.go (the lease pool, other appliances' leases, the
// ranges), release.go (RELEASE and DECLINE), pin.go (leases pinned for a
// deployed OS configured statically with its address: Pin and Unpin),
// notes.go (timeline entries), observe.go and lograte.go (the
// Observer, counters, rate-limited log lines).
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
// machine through Inventory.EnsureMachineForMAC, called once per packet:
// the record it returns also labels the packet's timeline entries
// (machine, intent), so a known machine's packet reads its record once.
// When inventory refuses
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
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/store"
)

// Mode is the DHCP mode.
type Mode string

// The DHCP modes: full leases addresses, proxy only adds PXE options, off
// serves nothing.
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

// Inventory is what DHCP asks about machines: once per network-booting
// client's packet, the machine owning a MAC (created DISCOVERED when none
// does; the bool says it was made now), whose record labels the packet's
// timeline entries. It fails with an error of class apierr.ErrExhausted
// when no new machine may be recorded (the discovered-machine cap).
type Inventory interface {
	EnsureMachineForMAC(ctx context.Context, mac string) (*inventoryv1.Machine, bool, error)
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
	// HTTPBootBase is the http:// or https:// base (scheme, host, port,
	// no path) UEFI HTTP boot clients get the iPXE binary's URL on
	// (default HTTPBase): an https:// front whose certificate the
	// firmware trusts. It must leave room in the 128-byte file field.
	HTTPBootBase string
	// SecureBoot serves x64 UEFI firmware the signed chain (Env.SecureBoot).
	SecureBoot bool
	Catalog    Catalog
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
	// Balance, when set in full mode, says whether this appliance answers
	// a DISCOVER from mac on subnet whose secs field is secs; one it does
	// not answer is left to the appliance of the fleet that does
	// (fleet.Balance; docs/architecture.md, "DHCP load balancing in a
	// fleet"), untouched: no inventory read, no timeline entry, no offer.
	Balance func(mac string, subnet netip.Prefix, secs uint16) bool
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

	dropped atomic.Uint64
	bad     atomic.Uint64
	// busySilent counts DISCOVERs left unanswered because the store was
	// busy when the client's machine was to be recorded (full.go).
	busySilent atomic.Uint64
	bound      atomic.Pointer[bound] // handle's deadlines (set by New, re-rooted by Run)
	seenMu     sync.Mutex
	seen       map[netip.Addr]string // IP → MAC learned from packets (proxy mode, TFTP)
	handlers   sync.WaitGroup

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
	if cfg.HTTPBootBase != "" {
		b, err := checkBootBase(cfg.HTTPBootBase)
		if err != nil {
			return nil, err
		}
		cfg.HTTPBootBase = b
	}
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
		ScriptURL:  func(mac string) string { return cfg.HTTPBase + "/boot.ipxe?mac=" + mac },
		HTTPBase:   cfg.HTTPBase,
		BootBase:   cfg.HTTPBootBase,
		Has:        cfg.Catalog.Has,
		Proxy:      cfg.Mode == ModeProxy,
		SecureBoot: cfg.SecureBoot,
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

// Addr is the port-67 socket's address.
func (s *Server) Addr() net.Addr { return s.conn.LocalAddr() }

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
		return s.respondPXE(m, mac, peer)
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

// Close releases a Server that will not Run.
func (s *Server) Close() error {
	if s.pxe != nil {
		s.pxe.Close()
	}
	return s.conn.Close()
}
