// Package ra answers IPv6 router solicitations on the boot interface with a
// router advertisement of lifetime 0 ("I am not a default router"), so
// that iPXE, which waits about 16 s for an RA before giving up on IPv6,
// moves on at once. It advertises no prefixes and never routes.
//
// It must not be imported from anything reachable by cmd/corral-node.
package ra

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
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
	r.log.Info("answering IPv6 router solicitations with lifetime 0", "interface", r.cfg.Interface)
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

// Advertisement is the RA sent: hop limit 64, no flags, router lifetime
// 0, no reachable/retrans timers, and our link-layer address.
func Advertisement(hw net.HardwareAddr) []byte {
	body := make([]byte, 12, 20)
	body[0] = 64 // cur hop limit; bytes 1-11 stay 0: flags, lifetime 0, timers
	if len(hw) == 6 {
		body = append(body, 1, 1)
		body = append(body, hw...)
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
	_, err := r.p.WriteTo(Advertisement(r.ifi.HardwareAddr), cm, &net.IPAddr{IP: allNodes, Zone: r.ifi.Name})
	if err != nil {
		r.log.Warn("router advertisement not sent", "err", err)
		return
	}
	r.log.Debug("answered router solicitation", "src", src.String(), "mac", mac)
	if mac != "" && r.cfg.Timeline != nil {
		r.cfg.Timeline.Event(mac, "ra", "router-solicitation", "answered with a lifetime-0 router advertisement (no IPv6 router here)", map[string]string{"src": src.String()})
	}
}
