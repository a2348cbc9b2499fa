package fleet

import (
	"context"
	"hash/fnv"
	"log/slog"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"github.com/corralhq/corral/store"
)

// Balance splits the DISCOVERs of a segment that several appliances serve
// in full DHCP mode, so that each is answered by one of them instead of
// all (docs/architecture.md, "DHCP load balancing in a fleet"). Every
// appliance hears every broadcast DISCOVER; answering them all made each
// machine's first exchange cost the fleet one inventory read and one
// timeline write per appliance, and sent the client one OFFER per
// appliance to choose from.
//
// The appliance that answers a MAC is the live appliance serving the
// segment that ranks first for the MAC by rendezvous hashing (each
// appliance's score is a hash of its name and the MAC; the highest wins):
// every appliance computes the same answer from the same list, and an
// appliance joining or leaving moves only its own share of the MACs. (Not
// the machine's runner: assignments reach each appliance's Owner at a
// different moment, and for that moment two appliances would each leave
// the DISCOVER to the other.)
//
// A client whose DISCOVER says it has waited MaxSecs seconds or more
// (the secs field) is answered by every appliance, as RFC 3074's load
// balancing lets a backup answer: an appliance that died, or that is
// alive but not answering, costs a machine MaxSecs, not its boot. A
// client that never counts its seconds waits for the dead appliance's
// record to expire (Expiry) instead. The appliance list is refreshed in
// the background every Refresh; Answers never touches the store.
type Balance struct {
	Store store.Store
	// Self is this appliance's name.
	Self string
	// MaxSecs: a DISCOVER with secs at or over it is answered by every
	// appliance (0: the balance is off and every DISCOVER is answered).
	MaxSecs uint16
	// Expiry is how long a runner stays live after its heartbeat (default
	// DefaultExpiry).
	Expiry time.Duration
	// Refresh is how often the appliance list is read (default 1 s).
	Refresh time.Duration
	Logger  *slog.Logger

	peers atomic.Pointer[balancePeers]
	left  atomic.Int64
}

// balancePeers is the live appliances serving each DHCP segment, as last
// read.
type balancePeers struct {
	bySegment map[netip.Prefix][]string // sorted names
}

// Run reads the appliance records every Refresh until ctx ends. Until its
// first read, Answers answers everything.
func (b *Balance) Run(ctx context.Context) error {
	refresh := b.Refresh
	if refresh <= 0 {
		refresh = time.Second
	}
	log := b.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := time.NewTicker(refresh)
	defer t.Stop()
	failing := false
	for {
		if err := b.read(ctx); err != nil && ctx.Err() == nil {
			if !failing {
				log.Warn("DHCP balance: appliance records not read; the last list is kept", "err", err)
			}
			failing = true
		} else {
			failing = false
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// read lists the appliance records once.
func (b *Balance) read(ctx context.Context) error {
	apps, err := listAppliances(ctx, b.Store)
	if err != nil {
		return err
	}
	expiry := b.Expiry
	if expiry <= 0 {
		expiry = DefaultExpiry
	}
	now := time.Now()
	p := &balancePeers{bySegment: map[netip.Prefix][]string{}}
	for _, a := range apps {
		if !Live(a, now, expiry) {
			continue
		}
		for _, s := range a.GetDhcpSegments() {
			pre, err := netip.ParsePrefix(s)
			if err != nil {
				continue // CheckAppliance refuses these; a foreign record may hold one
			}
			pre = pre.Masked()
			p.bySegment[pre] = append(p.bySegment[pre], a.GetName())
		}
	}
	for _, names := range p.bySegment {
		slices.Sort(names)
	}
	b.peers.Store(p)
	return nil
}

// Answers reports whether this appliance answers a DISCOVER from mac
// (canonical lower-case text) on the segment subnet, whose secs field is
// secs. It is true when the balance is off, before the first read, when
// no live appliance publishes the segment, and when this appliance is the
// one chosen above. Safe for concurrent use; it never blocks.
func (b *Balance) Answers(mac string, subnet netip.Prefix, secs uint16) bool {
	if b == nil || b.MaxSecs == 0 || secs >= b.MaxSecs {
		return true
	}
	p := b.peers.Load()
	if p == nil {
		return true
	}
	names := p.bySegment[subnet.Masked()]
	if len(names) == 0 || !slices.Contains(names, b.Self) {
		// Nobody (or not this appliance, whose own record is not read
		// yet) is known to serve the segment: answer rather than leave
		// the client unanswered.
		return true
	}
	if len(names) == 1 {
		return true
	}
	return b.keep(rendezvous(mac, names) == b.Self)
}

// keep counts the DISCOVERs left to another appliance.
func (b *Balance) keep(mine bool) bool {
	if !mine {
		b.left.Add(1)
	}
	return mine
}

// LeftToPeers is how many DISCOVERs this appliance left to another.
func (b *Balance) LeftToPeers() int64 { return b.left.Load() }

// rendezvous returns the name scoring highest for mac (names non-empty).
func rendezvous(mac string, names []string) string {
	best, bestScore := "", uint64(0)
	for _, n := range names {
		h := fnv.New64a()
		_, _ = h.Write([]byte(n))
		_, _ = h.Write([]byte{0})
		_, _ = h.Write([]byte(mac))
		if s := mix(h.Sum64()); best == "" || s > bestScore {
			best, bestScore = n, s
		}
	}
	return best
}

// mix is a 64-bit finaliser (splitmix64's): FNV's low bits alone spread
// names differing only in their last character poorly.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
