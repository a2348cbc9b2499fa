// Package dhcp6 is corrald's stateful DHCPv6 server for network boot
// (RFC 8415), bound to the boot interface. Packets are decoded and encoded
// with github.com/insomniacslk/dhcp's dhcpv6 (server6 only opens the
// interface-bound socket); the read loop is this package's own (serve.go).
//
// Files, one concern each: serve.go (the socket, the read loop, the
// bounded handler pool), respond.go (the RFC 8415 answers: SOLICIT,
// REQUEST, RENEW, REBIND, RELEASE, DECLINE, CONFIRM and
// INFORMATION-REQUEST; Rapid Commit; Relay-Forward and Relay-Reply, the
// interface-id echoed, the hop count bounded), observe.go (the metrics'
// outcomes, the range gauges, the allowed relay sources), boot.go
// (the boot file URL: option 59, a pure function of the request),
// leases.go (the IA_NA pool, durable in the store), limit.go (per-client
// packet budgets and rate-limited log lines).
//
// Clients are identified by DUID and IAID (one lease per IA_NA); the
// client's MAC, which makes it a machine (Inventory.EnsureMachineForMAC)
// and labels its timeline, is read from a DUID-LL or DUID-LLT of an
// Ethernet address, else from the innermost relay's client link-layer
// address option (79, RFC 6939), else from the EUI-64 of a link-local
// source address. A client with no MAC gets an address and no boot file.
//
// The boot LAN is hostile, so the pool follows RFC 8415 strictly where it
// matters: a lease is written only by compare-and-swap on its address's
// record for the DUID and IAID that asked; RENEW, REBIND, RELEASE and
// DECLINE act only on the asking client's own binding (another client's
// address gets NoBinding, or lifetimes 0 when it is not on the link);
// REQUEST, RENEW, RELEASE and DECLINE must name our server DUID, SOLICIT,
// REBIND and CONFIRM must not name any. Every table is bounded (leases,
// offers, per-client budgets), every packet is bounded in size and relay
// depth, and a packet that does not parse is counted and dropped with a
// rate-limited log line.
//
// Leases live under store.Leases6Prefix, one bootv1.Lease per address
// with its DUID and IAID. One appliance serves a segment: the pool does
// not follow other appliances' writes (a conflicting write is refused by
// the compare-and-swap and the client is answered NoAddrsAvail).
//
// It must not be imported from anything reachable by cmd/corral-node.
package dhcp6

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv6"
	"github.com/insomniacslk/dhcp/iana"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/store"
)

// Inventory is what DHCPv6 asks about machines: the machine owning a MAC
// (created DISCOVERED when none does). It fails with an error of class
// apierr.ErrExhausted when no new machine may be recorded.
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

// Range is a pool of addresses on one link.
type Range struct {
	// Prefix is the link's prefix (on-link check for CONFIRM and REBIND).
	Prefix     netip.Prefix
	Start, End netip.Addr
	// DNS servers (option 23).
	DNS []netip.Addr
	// Relayed ranges serve Relay-Forward messages whose innermost
	// link-address is inside Prefix; the local range (Relayed false)
	// serves clients on the boot interface.
	Relayed bool
}

// Contains reports whether a is inside [Start, End].
func (r Range) Contains(a netip.Addr) bool {
	return a.Is6() && !a.Is4In6() && a.Compare(r.Start) >= 0 && a.Compare(r.End) <= 0
}

// Validate checks the range is IPv6 and inside its prefix.
func (r Range) Validate() error {
	if !r.Prefix.IsValid() || !r.Prefix.Addr().Is6() || r.Prefix.Addr().Is4In6() {
		return fmt.Errorf("dhcp6 range: prefix %s is not an IPv6 prefix", r.Prefix)
	}
	if !r.Start.Is6() || !r.End.Is6() || r.Start.Compare(r.End) > 0 {
		return fmt.Errorf("dhcp6 range %s-%s: want IPv6 START-END with START <= END", r.Start, r.End)
	}
	if !r.Prefix.Contains(r.Start) || !r.Prefix.Contains(r.End) {
		return fmt.Errorf("dhcp6 range %s-%s is not inside %s", r.Start, r.End, r.Prefix)
	}
	for _, d := range r.DNS {
		if !d.Is6() {
			return fmt.Errorf("dhcp6 range: DNS server %s is not IPv6", d)
		}
	}
	return nil
}

// Config configures a Server.
type Config struct {
	// Interface is the boot interface; the socket is bound to it.
	Interface string
	// ServerIP is our address clients fetch boot files from (default: the
	// interface's first global or unique-local IPv6 address).
	ServerIP netip.Addr
	// Ranges: the first non-relayed one serves the boot interface; relayed
	// ones serve relayed requests by link-address. At least one.
	Ranges []Range
	// LeaseTime is the valid and preferred lifetime (default 1h); T1 and
	// T2 are 1/2 and 4/5 of it.
	LeaseTime time.Duration
	// HTTPBase is http://[addr]:port of boot/http (default
	// http://[ServerIP]:8080).
	HTTPBase string
	// TFTPHost is the host of tftp:// boot file URLs (default
	// [ServerIP]).
	TFTPHost  string
	Catalog   Catalog
	Store     store.Store
	Inventory Inventory
	Timeline  Recorder
	Logger    *slog.Logger
	// DUID is the server's DUID (default DUID-LL of the interface's MAC).
	DUID dhcpv6.DUID
	// RapidCommit honours SOLICITs with option 14 (two-message exchange);
	// default on (NoRapidCommit turns it off).
	NoRapidCommit bool
	// Conn replaces the socket bound to Interface on port 547 (tests).
	Conn net.PacketConn
	// MaxInFlight bounds concurrently handled packets (default 1024).
	MaxInFlight int
	// MaxLeases caps the stored leases (live, released or declined) this
	// server keeps (default 65536); past it new clients get NoAddrsAvail.
	MaxLeases int
	// ClientRate and ClientBurst bound each client's (DUID's) packets per
	// second (default 10, burst 20); the budget table holds at most
	// MaxTracked clients (default 65536).
	ClientRate, ClientBurst float64
	MaxTracked              int
	// DeclineQuarantine is how long a DECLINEd address is kept out
	// (default 10 min).
	DeclineQuarantine time.Duration
	// LogInterval is the least time between two log lines of one kind of
	// per-packet warning (default 1 min).
	LogInterval time.Duration
	// RelayFrom, when set, are the prefixes Relay-Forward messages may
	// come from (the relays' addresses); one from elsewhere is dropped
	// and counted. Empty: from anywhere (a relayed range must still serve
	// its link-address).
	RelayFrom []netip.Prefix
	// Observer, when set, is told every datagram's outcome (corrald's
	// metrics).
	Observer Observer
	Now      func() time.Time
}

// MaxPacket bounds a DHCPv6 datagram (the IPv6 minimum MTU's payload is
// 1232 bytes; relays add their headers): larger ones are dropped.
const MaxPacket = 4096

// MaxHops is RFC 8415's HOP_COUNT_LIMIT: deeper relay chains are dropped.
const MaxHops = 8

// Server is the DHCPv6 server.
type Server struct {
	cfg    Config
	log    *slog.Logger
	warn   *logLimiter
	rates  *budgets
	leases *leases
	duid   dhcpv6.DUID
	conn   net.PacketConn
	sem    chan struct{}

	bad, dropped, limited, relayRefused atomic.Uint64
}

// New validates cfg, loads the leases and binds the socket.
func New(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Catalog == nil || cfg.Inventory == nil || cfg.Timeline == nil || cfg.Store == nil {
		return nil, errors.New("dhcp6: Catalog, Inventory, Timeline and Store are required")
	}
	if len(cfg.Ranges) == 0 {
		return nil, errors.New("dhcp6: at least one range is required (--dhcp6-range)")
	}
	for _, r := range cfg.Ranges {
		if err := r.Validate(); err != nil {
			return nil, err
		}
	}
	for _, p := range cfg.RelayFrom {
		if !p.IsValid() || !p.Addr().Is6() || p.Addr().Is4In6() {
			return nil, fmt.Errorf("dhcp6: relay source %s is not an IPv6 prefix", p)
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.LeaseTime <= 0 {
		cfg.LeaseTime = time.Hour
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 1024
	}
	if cfg.MaxLeases <= 0 {
		cfg.MaxLeases = 1 << 16
	}
	if cfg.ClientRate <= 0 {
		cfg.ClientRate = 10
	}
	if cfg.ClientBurst < 1 {
		cfg.ClientBurst = 2 * cfg.ClientRate
	}
	if cfg.MaxTracked <= 0 {
		cfg.MaxTracked = 1 << 16
	}
	if cfg.DeclineQuarantine <= 0 {
		cfg.DeclineQuarantine = 10 * time.Minute
	}
	if cfg.LogInterval <= 0 {
		cfg.LogInterval = time.Minute
	}
	var ifi *net.Interface
	if cfg.Interface != "" {
		var err error
		if ifi, err = net.InterfaceByName(cfg.Interface); err != nil {
			return nil, fmt.Errorf("dhcp6: %w", err)
		}
	}
	if !cfg.ServerIP.IsValid() {
		if cfg.Interface == "" {
			return nil, errors.New("dhcp6: Interface or ServerIP is required")
		}
		ip, err := InterfaceIPv6(cfg.Interface)
		if err != nil {
			return nil, err
		}
		cfg.ServerIP = ip
	}
	host := "[" + cfg.ServerIP.String() + "]"
	if cfg.HTTPBase == "" {
		cfg.HTTPBase = "http://" + host + ":8080"
	}
	cfg.HTTPBase = strings.TrimSuffix(cfg.HTTPBase, "/")
	if cfg.TFTPHost == "" {
		cfg.TFTPHost = host
	}
	if cfg.DUID == nil {
		hw := net.HardwareAddr{0x02, 0, 0, 0, 0, 1}
		if ifi != nil && len(ifi.HardwareAddr) == 6 {
			hw = ifi.HardwareAddr
		}
		cfg.DUID = &dhcpv6.DUIDLL{HWType: iana.HWTypeEthernet, LinkLayerAddr: hw}
	}
	s := &Server{cfg: cfg, log: cfg.Logger, duid: cfg.DUID, sem: make(chan struct{}, cfg.MaxInFlight),
		warn:  newLogLimiter(cfg.Logger, cfg.LogInterval, cfg.Now),
		rates: newBudgets(cfg.ClientRate, cfg.ClientBurst, cfg.MaxTracked, cfg.Now)}
	s.leases = newLeases(cfg.Store, cfg.Now, cfg.MaxLeases, cfg.DeclineQuarantine)
	n, bad, err := s.leases.load(ctx)
	if err != nil {
		return nil, fmt.Errorf("dhcp6: load leases: %w", err)
	}
	for _, k := range bad {
		s.log.Warn("skipping undecodable DHCPv6 lease record", "key", k)
	}
	s.log.Info("DHCPv6 leases loaded", "count", n)
	s.conn = cfg.Conn
	if s.conn == nil {
		if s.conn, err = listen(cfg.Interface, ifi); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// InterfaceIPv6 is ifname's first global unicast (or unique-local) IPv6
// address.
func InterfaceIPv6(ifname string) (netip.Addr, error) {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("dhcp6: %w", err)
	}
	as, err := ifi.Addrs()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("dhcp6: %s: %w", ifname, err)
	}
	for _, a := range as {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Is6() && !ip.Is4In6() && ip.IsGlobalUnicast() {
				return ip, nil
			}
		}
	}
	return netip.Addr{}, fmt.Errorf("dhcp6: %s has no global or unique-local IPv6 address", ifname)
}

// Addr is the socket's address.
func (s *Server) Addr() net.Addr { return s.conn.LocalAddr() }

// Close releases a Server that will not Run.
func (s *Server) Close() error { return s.conn.Close() }

// Counters are the server's drop counters.
type Counters struct {
	// Malformed: packets that did not parse or broke a rule of the
	// protocol (oversized, too many relay hops, a server message).
	Malformed uint64
	// Overloaded: packets dropped because MaxInFlight were being handled.
	Overloaded uint64
	// Limited: packets over their client's budget.
	Limited uint64
	// RelayRefused: Relay-Forward messages from a source outside
	// Config.RelayFrom.
	RelayRefused uint64
}

// Counters returns the drop counters so far.
func (s *Server) Counters() Counters {
	return Counters{Malformed: s.bad.Load(), Overloaded: s.dropped.Load(), Limited: s.limited.Load(), RelayRefused: s.relayRefused.Load()}
}

// LeaseHolder returns the MAC holding a live lease on addr (boot/http's
// script rule: a lease's script only to its address).
func (s *Server) LeaseHolder(_ context.Context, addr netip.Addr) (string, bool, error) {
	mac, ok := s.leases.holder(addr)
	return mac, ok, nil
}

// MACForIP returns the MAC holding a live lease on ip (boot/tftp's
// timeline).
func (s *Server) MACForIP(ip net.IP) (string, bool) {
	a, ok := netip.AddrFromSlice(ip)
	if !ok || ip.To4() != nil {
		return "", false
	}
	return s.leases.holder(a)
}
