// Package ra answers IPv6 router solicitations on the boot interface. By
// default the advertisement has router lifetime 0 ("I am not a default
// router") and no flags, so that iPXE, which waits about 16 s for an RA
// before giving up on IPv6, moves on at once. Where corrald serves
// DHCPv6 (boot/dhcp6), Config.Params sets the managed (M) and other (O)
// flags, a real router lifetime and on-link prefixes (L=1, A=0: addresses
// come from DHCPv6 only), so that clients start stateful DHCPv6 and reach
// the appliance's global address. It never forwards packets.
//
// It must not be imported from anything reachable by cmd/corral-node.
package ra

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv6"
)

// Recorder appends to a MAC's boot timeline (inventory.Event).
type Recorder interface {
	Event(mac, source, event, detail string, attrs map[string]string)
}

// Config configures a Responder.
type Config struct {
	// Interface is the boot interface (required).
	Interface string
	Timeline  Recorder
	Logger    *slog.Logger
	// MinInterval spaces answers (default 100ms): a storm of solicitations
	// gets at most one RA per interval.
	MinInterval time.Duration
	// Params are the advertisement's flags, lifetime and prefixes (zero:
	// lifetime 0, no flags, no prefixes).
	Params Params
}

// Params are what an advertisement says beyond the defaults.
type Params struct {
	// Managed (M): addresses are available through DHCPv6; Other (O):
	// other configuration is.
	Managed, Other bool
	// RouterLifetime is how long clients may use us as their default
	// router (0: not a router; at most MaxRouterLifetime).
	RouterLifetime time.Duration
	// OnLink are prefixes advertised on-link (L=1) and not for SLAAC
	// (A=0), valid and preferred for PrefixLifetime (default 1 day).
	OnLink         []netip.Prefix
	PrefixLifetime time.Duration
}

// MaxRouterLifetime is RFC 4861's bound on the router lifetime.
const MaxRouterLifetime = 9000 * time.Second

// Validate checks the lifetimes and prefixes.
func (p Params) Validate() error {
	if p.RouterLifetime < 0 || p.RouterLifetime > MaxRouterLifetime {
		return fmt.Errorf("ra: router lifetime %s: want 0 to %s", p.RouterLifetime, MaxRouterLifetime)
	}
	for _, pf := range p.OnLink {
		if !pf.IsValid() || !pf.Addr().Is6() || pf.Addr().Is4In6() {
			return fmt.Errorf("ra: on-link prefix %s is not IPv6", pf)
		}
	}
	if len(p.OnLink) > 8 {
		return errors.New("ra: at most 8 on-link prefixes")
	}
	return nil
}

// Responder answers router solicitations.
type Responder struct {
	cfg  Config
	log  *slog.Logger
	ifi  *net.Interface
	conn *icmp.PacketConn
	p    *ipv6.PacketConn
	mu   sync.Mutex
	last time.Time
}

var allRouters = net.ParseIP("ff02::2")
var allNodes = net.ParseIP("ff02::1")

// New opens a raw ICMPv6 socket and joins ff02::2 on the interface.
func New(cfg Config) (*Responder, error) {
	if cfg.Interface == "" {
		return nil, errors.New("ra: Config.Interface is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MinInterval == 0 {
		cfg.MinInterval = 100 * time.Millisecond
	}
	if err := cfg.Params.Validate(); err != nil {
		return nil, err
	}
	ifi, err := net.InterfaceByName(cfg.Interface)
	if err != nil {
		return nil, fmt.Errorf("ra: %w", err)
	}
	c, err := icmp.ListenPacket("ip6:ipv6-icmp", "::")
	if err != nil {
		return nil, fmt.Errorf("ra: %w", err)
	}
	p := c.IPv6PacketConn()
	fail := func(err error) (*Responder, error) {
		c.Close()
		return nil, fmt.Errorf("ra: %s: %w", cfg.Interface, err)
	}
	if err := p.JoinGroup(ifi, &net.IPAddr{IP: allRouters}); err != nil {
		return fail(err)
	}
	var f ipv6.ICMPFilter
	f.SetAll(true)
	f.Accept(ipv6.ICMPTypeRouterSolicitation)
	if err := p.SetICMPFilter(&f); err != nil {
		return fail(err)
	}
	if err := p.SetControlMessage(ipv6.FlagInterface|ipv6.FlagSrc, true); err != nil {
		return fail(err)
	}
	if err := p.SetMulticastHopLimit(255); err != nil {
		return fail(err)
	}
	if err := p.SetMulticastInterface(ifi); err != nil {
		return fail(err)
	}
	return &Responder{cfg: cfg, log: cfg.Logger, ifi: ifi, conn: c, p: p}, nil
}

// Run answers until ctx ends and returns nil.
func (r *Responder) Run(ctx context.Context) error {
	r.log.Info("answering IPv6 router solicitations", "interface", r.cfg.Interface, "router_lifetime", r.cfg.Params.RouterLifetime.String(),
		"managed", r.cfg.Params.Managed, "other", r.cfg.Params.Other)
	go func() { <-ctx.Done(); r.conn.Close() }()
	buf := make([]byte, 1500)
	for {
		n, cm, src, err := r.p.ReadFrom(buf)
		if err != nil {
			select {
			case <-ctx.Done():
				return nil // ctx ended: the goroutine above closed the socket
			default:
				return fmt.Errorf("ra: %w", err)
			}
		}
		if cm == nil || cm.IfIndex != r.ifi.Index {
			continue // another interface
		}
		mac, ok := ParseRS(buf[:n])
		if !ok {
			continue
		}
		r.answer(src, mac)
	}
}

// ParseRS checks b is a router solicitation and returns the MAC from its
// source link-layer address option, if any.
func ParseRS(b []byte) (mac string, ok bool) {
	m, err := icmp.ParseMessage(58, b)
	if err != nil || m.Type != ipv6.ICMPTypeRouterSolicitation || m.Code != 0 {
		return "", false
	}
	body, _ := m.Body.(*icmp.RawBody)
	if body == nil || len(body.Data) < 4 {
		return "", true
	}
	opts := body.Data[4:]
	for len(opts) >= 8 {
		l := int(opts[1]) * 8
		if l == 0 || l > len(opts) {
			break
		}
		if opts[0] == 1 && l >= 8 {
			return net.HardwareAddr(opts[2:8]).String(), true
		}
		opts = opts[l:]
	}
	return "", true
}

// Advertisement is the default RA: hop limit 64, no flags, router
// lifetime 0, no reachable/retrans timers, and our link-layer address.
func Advertisement(hw net.HardwareAddr) []byte { return AdvertisementWith(hw, Params{}) }

// AdvertisementWith is the RA for p: the M and O flags, the router
// lifetime, our link-layer address and a prefix information option per
// on-link prefix (L=1, A=0).
func AdvertisementWith(hw net.HardwareAddr, p Params) []byte {
	body := make([]byte, 12, 20+32*len(p.OnLink))
	body[0] = 64 // cur hop limit; reachable and retrans timers stay 0
	if p.Managed {
		body[1] |= 0x80
	}
	if p.Other {
		body[1] |= 0x40
	}
	binary.BigEndian.PutUint16(body[2:4], uint16(p.RouterLifetime/time.Second))
	if len(hw) == 6 {
		body = append(body, 1, 1)
		body = append(body, hw...)
	}
	life := uint32(cmp.Or(p.PrefixLifetime, 24*time.Hour) / time.Second)
	for _, pf := range p.OnLink {
		pf = pf.Masked()
		opt := make([]byte, 16, 32)
		opt[0], opt[1], opt[2], opt[3] = 3, 4, byte(pf.Bits()), 0x80 // type, length 4 (32 bytes), prefix length, L=1 A=0
		binary.BigEndian.PutUint32(opt[4:8], life)
		binary.BigEndian.PutUint32(opt[8:12], life)
		a := pf.Addr().As16()
		body = append(body, append(opt, a[:]...)...)
	}
	b, _ := (&icmp.Message{Type: ipv6.ICMPTypeRouterAdvertisement, Body: &icmp.RawBody{Data: body}}).Marshal(nil)
	return b // the kernel fills in the ICMPv6 checksum
}

func (r *Responder) answer(src net.Addr, mac string) {
	r.mu.Lock()
	now := time.Now()
	limited := now.Sub(r.last) < r.cfg.MinInterval
	if !limited {
		r.last = now
	}
	r.mu.Unlock()
	if limited {
		return
	}
	cm := &ipv6.ControlMessage{HopLimit: 255, IfIndex: r.ifi.Index}
	_, err := r.p.WriteTo(AdvertisementWith(r.ifi.HardwareAddr, r.cfg.Params), cm, &net.IPAddr{IP: allNodes, Zone: r.ifi.Name})
	if err != nil {
		r.log.Warn("router advertisement not sent", "err", err)
		return
	}
	r.log.Debug("answered router solicitation", "src", src.String(), "mac", mac)
	if mac != "" && r.cfg.Timeline != nil {
		r.cfg.Timeline.Event(mac, "ra", "router-solicitation", r.note(), map[string]string{"src": src.String()})
	}
}

// note is the timeline's words for the answer.
func (r *Responder) note() string {
	p := r.cfg.Params
	if p.RouterLifetime == 0 && !p.Managed && !p.Other {
		return "answered with a lifetime-0 router advertisement (no IPv6 router here)"
	}
	return fmt.Sprintf("answered with a router advertisement: managed %v, other %v, router lifetime %s", p.Managed, p.Other, p.RouterLifetime)
}
