package dhcp

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"

	bootv1 "github.com/corralhq/corral/api/boot/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/protobuf/proto"
)

// LeasePrefix is the store prefix of leases, one record per address.
const LeasePrefix = "/boot/leases/"

// Range is one pool of addresses.
type Range struct {
	// Subnet is the network the addresses live on (mask and relay match).
	Subnet netip.Prefix
	// Start and End bound the pool (inclusive).
	Start, End netip.Addr
	// Router and DNS are options 3 and 6.
	Router []netip.Addr
	DNS    []netip.Addr
	// Relayed ranges are served only to requests relayed from Subnet
	// (giaddr inside it); the local range serves the boot interface.
	Relayed bool
}

func (r Range) String() string { return fmt.Sprintf("%s-%s (%s)", r.Start, r.End, r.Subnet) }

// Contains reports whether a is inside the pool bounds.
func (r Range) Contains(a netip.Addr) bool {
	return a.Is4() && r.Start.Compare(a) <= 0 && a.Compare(r.End) <= 0
}

// Validate checks the range is well formed.
func (r Range) Validate() error {
	switch {
	case !r.Subnet.IsValid() || !r.Subnet.Addr().Is4():
		return fmt.Errorf("range %s: subnet must be an IPv4 CIDR", r)
	case !r.Start.Is4() || !r.End.Is4() || r.End.Less(r.Start):
		return fmt.Errorf("range %s: start and end must be IPv4 with start <= end", r)
	case !r.Subnet.Contains(r.Start) || !r.Subnet.Contains(r.End):
		return fmt.Errorf("range %s: start and end must be inside the subnet", r)
	}
	return nil
}

// Errors of the lease pool.
var (
	ErrExhausted = errors.New("dhcp: range exhausted")
	ErrTaken     = errors.New("dhcp: address belongs to another client")
	ErrNoLease   = errors.New("dhcp: no lease for this client")
)

type leaseEntry struct {
	l   *bootv1.Lease
	rev int64
}

type offer struct {
	mac   string
	until time.Time
}

// leases is the in-memory view of the stored leases plus short-lived
// offer reservations. The store is the truth: every binding is written by
// compare-and-swap on the address's key before it is acknowledged, so two
// appliances sharing a store cannot hand out one address twice. Writes
// happen outside the mutex, so concurrent ACKs reach the store together
// and are group-committed.
type leases struct {
	st     store.Store
	now    func() time.Time
	mu     sync.Mutex
	byIP   map[netip.Addr]*leaseEntry
	byMAC  map[string]netip.Addr
	offers map[netip.Addr]offer
	next   map[netip.Prefix]netip.Addr // allocation cursor per range
	// quarantine is how long a declined address is kept out.
	quarantine time.Duration
}

func newLeases(st store.Store, now func() time.Time) *leases {
	return &leases{st: st, now: now, byIP: map[netip.Addr]*leaseEntry{}, byMAC: map[string]netip.Addr{},
		offers: map[netip.Addr]offer{}, next: map[netip.Prefix]netip.Addr{}, quarantine: 10 * time.Minute}
}

func leaseKey(ip netip.Addr) string { return LeasePrefix + ip.String() }

// load reads every stored lease. Undecodable records are skipped with
// their key returned, so one corrupt record cannot stop DHCP.
func (p *leases) load(ctx context.Context) (n int, bad []string, err error) {
	kvs, err := p.st.List(ctx, LeasePrefix)
	if err != nil {
		return 0, nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, kv := range kvs {
		l := &bootv1.Lease{}
		if err := record.Unmarshal(kv.Value, l); err != nil {
			bad = append(bad, kv.Key)
			continue
		}
		ip, err := netip.ParseAddr(l.GetIp())
		if err != nil || leaseKey(ip) != kv.Key {
			bad = append(bad, kv.Key)
			continue
		}
		p.byIP[ip] = &leaseEntry{l: l, rev: kv.Revision}
		if l.GetMac() != "" {
			if old, ok := p.byMAC[l.GetMac()]; !ok || p.byIP[old].l.GetUpdatedUnix() < l.GetUpdatedUnix() {
				p.byMAC[l.GetMac()] = ip
			}
		}
		n++
	}
	return n, bad, nil
}

// free reports whether ip can go to mac now (caller holds mu).
func (p *leases) freeFor(ip netip.Addr, mac string, now time.Time) bool {
	if o, ok := p.offers[ip]; ok && o.mac != mac && now.Before(o.until) {
		return false
	}
	e, ok := p.byIP[ip]
	if !ok {
		return true
	}
	l := e.l
	switch {
	case l.GetMac() == mac && l.GetState() != bootv1.Lease_STATE_DECLINED:
		return true
	case l.GetState() == bootv1.Lease_STATE_DECLINED:
		return now.Unix() >= l.GetExpiresUnix()
	}
	return false // another client's, active or sticky
}

// reclaimable reports whether another client's expired or released lease
// may be taken when the range has no never-used address left.
func reclaimable(l *bootv1.Lease, now time.Time) bool {
	return now.Unix() >= l.GetExpiresUnix()
}

// Offer picks an address for mac in r and reserves it for 30 s: the
// client's current or last address in r (sticky), else the requested one
// when free, else the lowest never-used address, else the longest-expired
// lease of another client, else the oldest pending offer to another client.
func (p *leases) Offer(mac string, r Range, requested netip.Addr) (netip.Addr, error) {
	now := p.now()
	p.mu.Lock()
	defer p.mu.Unlock()
	pick := func(ip netip.Addr) netip.Addr {
		p.offers[ip] = offer{mac: mac, until: now.Add(30 * time.Second)}
		return ip
	}
	if ip, ok := p.byMAC[mac]; ok && r.Contains(ip) && p.freeFor(ip, mac, now) {
		return pick(ip), nil
	}
	if requested.IsValid() && r.Contains(requested) && p.freeFor(requested, mac, now) {
		return pick(requested), nil
	}
	// Never-used addresses from the cursor on, wrapping once.
	start := p.next[r.Subnet]
	if !r.Contains(start) {
		start = r.Start
	}
	ip := start
	for {
		if _, used := p.byIP[ip]; !used && p.freeFor(ip, mac, now) {
			p.next[r.Subnet] = ip.Next()
			return pick(ip), nil
		}
		ip = ip.Next()
		if !r.Contains(ip) {
			ip = r.Start
		}
		if ip == start {
			break
		}
	}
	// Reclaim the oldest expired lease of another client.
	var best netip.Addr
	var bestAt int64
	for a, e := range p.byIP {
		if !r.Contains(a) || !p.freeForReclaim(a, e, mac, now) {
			continue
		}
		if !best.IsValid() || e.l.GetExpiresUnix() < bestAt {
			best, bestAt = a, e.l.GetExpiresUnix()
		}
	}
	if best.IsValid() {
		return pick(best), nil
	}
	// Last, take the oldest pending offer of another client: an offer is
	// not a commitment, and a flood of DISCOVERs from random MACs that
	// never REQUEST must not lock real clients out.
	var oldest time.Time
	for a, o := range p.offers {
		if !r.Contains(a) || o.mac == mac {
			continue
		}
		if e, used := p.byIP[a]; used && !reclaimable(e.l, now) && e.l.GetMac() != "" {
			continue
		}
		if !best.IsValid() || o.until.Before(oldest) {
			best, oldest = a, o.until
		}
	}
	if best.IsValid() {
		return pick(best), nil
	}
	return netip.Addr{}, fmt.Errorf("%w: %s", ErrExhausted, r)
}

func (p *leases) freeForReclaim(a netip.Addr, e *leaseEntry, mac string, now time.Time) bool {
	if o, ok := p.offers[a]; ok && o.mac != mac && now.Before(o.until) {
		return false
	}
	return reclaimable(e.l, now)
}

// Bind makes (or renews) mac's lease on ip durable and returns it. It
// fails with ErrTaken when ip belongs to another client. Safe for
// concurrent use; concurrent binds are group-committed by the store.
func (p *leases) Bind(ctx context.Context, mac string, ip netip.Addr, r Range, ttl time.Duration, hostname, relay string) (*bootv1.Lease, error) {
	for attempt := 0; attempt < 5; attempt++ {
		now := p.now()
		p.mu.Lock()
		if !p.freeFor(ip, mac, now) {
			e := p.byIP[ip]
			if e == nil || !(reclaimable(e.l, now) && p.offers[ip].mac == mac) {
				p.mu.Unlock()
				return nil, fmt.Errorf("%w: %s", ErrTaken, ip)
			}
		}
		var rev int64
		if e := p.byIP[ip]; e != nil {
			rev = e.rev
		}
		p.mu.Unlock()
		l := &bootv1.Lease{Ip: ip.String(), Mac: mac, State: bootv1.Lease_STATE_ACTIVE,
			ExpiresUnix: now.Add(ttl).Unix(), UpdatedUnix: now.Unix(), Subnet: r.Subnet.String(),
			Hostname: hostname, Relay: relay}
		newRev, err := record.Put(ctx, p.st, leaseKey(ip), l, rev)
		if errors.Is(err, store.ErrConflict) {
			if err := p.reload(ctx, ip); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		p.mu.Lock()
		if e := p.byIP[ip]; e == nil || e.rev < newRev {
			if e != nil && e.l.GetMac() != mac && p.byMAC[e.l.GetMac()] == ip {
				delete(p.byMAC, e.l.GetMac())
			}
			p.byIP[ip] = &leaseEntry{l: l, rev: newRev}
			p.byMAC[mac] = ip
		}
		delete(p.offers, ip)
		p.mu.Unlock()
		return l, nil
	}
	return nil, fmt.Errorf("dhcp: bind %s: too many conflicting writers", ip)
}

// reload refreshes one address from the store after a CAS conflict.
func (p *leases) reload(ctx context.Context, ip netip.Addr) error {
	l := &bootv1.Lease{}
	rev, err := record.Get(ctx, p.st, leaseKey(ip), l)
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case errors.Is(err, store.ErrNotFound):
		delete(p.byIP, ip)
		return nil
	case err != nil:
		return err
	}
	p.byIP[ip] = &leaseEntry{l: l, rev: rev}
	if l.GetMac() != "" {
		p.byMAC[l.GetMac()] = ip
	}
	return nil
}

// Lookup returns mac's current lease if it holds ip (any state).
func (p *leases) Lookup(mac string, ip netip.Addr) (*bootv1.Lease, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.byIP[ip]
	if !ok || e.l.GetMac() != mac {
		return nil, false
	}
	return e.l, true
}

// Owner returns the MAC holding ip, if any.
func (p *leases) Owner(ip netip.Addr) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.byIP[ip]
	if !ok || e.l.GetMac() == "" {
		return "", false
	}
	return e.l.GetMac(), true
}

// update applies change to the stored lease of ip by CAS (re-reading on
// conflict); change may return an error to abort.
func (p *leases) update(ctx context.Context, ip netip.Addr, change func(l *bootv1.Lease) error) (*bootv1.Lease, error) {
	l, err := record.Update(ctx, p.st, leaseKey(ip), func() *bootv1.Lease { return &bootv1.Lease{} },
		func(l *bootv1.Lease, exists bool) (bool, error) {
			if !exists {
				return false, ErrNoLease
			}
			return false, change(l)
		})
	if err != nil {
		return nil, err
	}
	if err := p.reload(ctx, ip); err != nil {
		return nil, err
	}
	return l, nil
}

// Release ends mac's lease on ip now; the binding stays sticky.
func (p *leases) Release(ctx context.Context, mac string, ip netip.Addr) (*bootv1.Lease, error) {
	now := p.now()
	return p.update(ctx, ip, func(l *bootv1.Lease) error {
		if l.GetMac() != mac {
			return ErrTaken
		}
		l.State, l.ExpiresUnix, l.UpdatedUnix = bootv1.Lease_STATE_RELEASED, now.Unix(), now.Unix()
		return nil
	})
}

// Decline quarantines ip (a client saw it in use) and unbinds mac from it.
func (p *leases) Decline(ctx context.Context, mac string, ip netip.Addr, r Range) (*bootv1.Lease, error) {
	now := p.now()
	l := &bootv1.Lease{Ip: ip.String(), State: bootv1.Lease_STATE_DECLINED, ExpiresUnix: now.Add(p.quarantine).Unix(),
		UpdatedUnix: now.Unix(), Subnet: r.Subnet.String()}
	_, err := record.Update(ctx, p.st, leaseKey(ip), func() *bootv1.Lease { return &bootv1.Lease{} },
		func(cur *bootv1.Lease, exists bool) (bool, error) {
			if exists && cur.GetMac() != "" && cur.GetMac() != mac && now.Unix() < cur.GetExpiresUnix() {
				return false, ErrTaken // someone else's active lease: not the decliner's to quarantine
			}
			proto.Reset(cur)
			proto.Merge(cur, l)
			return false, nil
		})
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	if p.byMAC[mac] == ip {
		delete(p.byMAC, mac)
	}
	delete(p.offers, ip)
	p.mu.Unlock()
	return l, p.reload(ctx, ip)
}

// macForIP is the reverse lookup used by TFTP.
func (p *leases) macForIP(ip netip.Addr) (string, bool) { return p.Owner(ip) }

// Snapshot returns every lease (for tests and diagnostics).
func (p *leases) Snapshot() []*bootv1.Lease {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*bootv1.Lease, 0, len(p.byIP))
	for _, e := range p.byIP {
		out = append(out, e.l)
	}
	return out
}

func hostnameOK(s string) string {
	if len(s) > 63 {
		s = s[:63]
	}
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' {
			return r
		}
		return -1
	}, s)
}
