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
	// ErrNotOffered: a REQUEST (SELECTING) for an address that was not
	// offered to the client and is not its lease.
	ErrNotOffered = errors.New("dhcp: address was not offered to this client")
	// ErrOtherAddress: the client holds a lease on another address.
	ErrOtherAddress = errors.New("dhcp: the client's lease is on another address")
	// ErrNotHolder: a DECLINE from a client that neither holds nor was
	// offered the address.
	ErrNotHolder = errors.New("dhcp: the client neither holds nor was offered this address")
)

type leaseEntry struct {
	l   *bootv1.Lease
	rev int64
	// cid is the client identifier (option 61) the lease was bound with
	// by this process; "" when unknown (the lease record has no field for
	// it, so leases loaded from the store have none).
	cid string
}

type offer struct {
	mac, cid string
	until    time.Time
}

// sameClient compares client identifiers leniently: an identifier that is
// unknown on either side does not contradict the MAC.
func sameClient(a, b string) bool { return a == "" || b == "" || a == b }

// Need says what a Bind requires of the client.
type Need int

const (
	// NeedOffer (SELECTING): the address was offered to the client, or is
	// its lease.
	NeedOffer Need = iota
	// NeedLease (INIT-REBOOT, RENEWING, REBINDING): the address is the
	// client's lease; nothing is allocated to a client that holds none.
	NeedLease
)

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

// Every map of leases is bounded by the configured ranges: byIP, offers
// and byMAC hold at most one entry per address of a range (byMAC one per
// bound address), next one per range.

func newLeases(st store.Store, now func() time.Time, quarantine time.Duration) *leases {
	return &leases{st: st, now: now, byIP: map[netip.Addr]*leaseEntry{}, byMAC: map[string]netip.Addr{},
		offers: map[netip.Addr]offer{}, next: map[netip.Prefix]netip.Addr{}, quarantine: quarantine}
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

// Offer picks an address for mac (client identifier cid, "" if none) in
// r and reserves it for 30 s: the client's current or last address in r
// (sticky), else the requested one when free, else the lowest never-used
// address, else the longest-expired lease of another client, else the
// oldest pending offer to another client, else the quarantined (declined)
// address whose quarantine ends first: a quarantine delays reuse, it never
// makes the range look exhausted.
func (p *leases) Offer(mac, cid string, r Range, requested netip.Addr) (netip.Addr, error) {
	now := p.now()
	p.mu.Lock()
	defer p.mu.Unlock()
	pick := func(ip netip.Addr) netip.Addr {
		p.offers[ip] = offer{mac: mac, cid: cid, until: now.Add(30 * time.Second)}
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
	// Then take the oldest pending offer of another client: an offer is
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
	// Last, the quarantined address released soonest.
	for a, e := range p.byIP {
		if !r.Contains(a) || e.l.GetState() != bootv1.Lease_STATE_DECLINED {
			continue
		}
		if !best.IsValid() || e.l.GetExpiresUnix() < bestAt {
			best, bestAt = a, e.l.GetExpiresUnix()
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

// offeredTo reports whether ip was last offered to the client (the offer
// may have lapsed: it counts until another client is offered ip). Caller
// holds mu.
func (p *leases) offeredTo(ip netip.Addr, mac, cid string) bool {
	o, ok := p.offers[ip]
	return ok && o.mac == mac && sameClient(o.cid, cid)
}

// holds reports whether the client's lease (any state but DECLINED, also
// expired or released: leases are sticky) is on ip. Caller holds mu.
func (p *leases) holds(ip netip.Addr, mac, cid string) bool {
	e, ok := p.byIP[ip]
	return ok && e.l.GetMac() == mac && e.l.GetState() != bootv1.Lease_STATE_DECLINED && sameClient(e.cid, cid)
}

// hasLease reports whether mac holds a lease (in any state) here.
func (p *leases) hasLease(mac string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.byMAC[mac]
	return ok
}

// check decides whether ip may be bound to the client now (caller holds
// mu); nil means yes.
func (p *leases) check(ip netip.Addr, mac, cid string, need Need, now time.Time) error {
	held := p.holds(ip, mac, cid)
	switch {
	case need == NeedLease && !held:
		if other, ok := p.byMAC[mac]; ok && other != ip {
			return fmt.Errorf("%w: %s", ErrOtherAddress, other)
		}
		return ErrNoLease
	case need == NeedOffer && !held && !p.offeredTo(ip, mac, cid):
		if e := p.byIP[ip]; e != nil && e.l.GetMac() != "" && e.l.GetMac() != mac && !reclaimable(e.l, now) {
			return fmt.Errorf("%w: %s", ErrTaken, ip)
		}
		return fmt.Errorf("%w: %s", ErrNotOffered, ip)
	}
	if p.freeFor(ip, mac, now) {
		return nil
	}
	// Not free, but offered to this client: an expired lease of another
	// client or a quarantined address that Offer handed out because
	// nothing else was left.
	if e := p.byIP[ip]; e != nil && p.offeredTo(ip, mac, cid) &&
		(reclaimable(e.l, now) || e.l.GetState() == bootv1.Lease_STATE_DECLINED) {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrTaken, ip)
}

// Bind makes (or renews) the client's lease on ip durable and returns it.
// need says what the client must have: an offer of ip (SELECTING) or its
// lease on ip (INIT-REBOOT, RENEWING, REBINDING). It fails, writing
// nothing, with ErrNoLease (the client holds no lease here),
// ErrOtherAddress (its lease is on another address), ErrNotOffered or
// ErrTaken (ip belongs to another client). When memory knows no lease of
// the client on ip the address is re-read from the store once, so a lease
// another writer made is found. Safe for concurrent use; concurrent binds
// are group-committed by the store.
func (p *leases) Bind(ctx context.Context, mac, cid string, need Need, ip netip.Addr, r Range, ttl time.Duration, hostname, relay string) (*bootv1.Lease, error) {
	reloaded := false
	for attempt := 0; attempt < 5; attempt++ {
		now := p.now()
		p.mu.Lock()
		err := p.check(ip, mac, cid, need, now)
		if err != nil && !reloaded && (errors.Is(err, ErrNoLease) || errors.Is(err, ErrOtherAddress)) {
			p.mu.Unlock()
			reloaded = true
			if err := p.reload(ctx, ip); err != nil {
				return nil, err
			}
			attempt--
			continue
		}
		if err != nil {
			p.mu.Unlock()
			return nil, err
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
			p.byIP[ip] = &leaseEntry{l: l, rev: newRev, cid: cid}
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
	cid := ""
	if e := p.byIP[ip]; e != nil && e.l.GetMac() == l.GetMac() {
		cid = e.cid
	}
	p.byIP[ip] = &leaseEntry{l: l, rev: rev, cid: cid}
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

// Decline quarantines ip (the client found it in use on the network) and
// unbinds the client from it. Only the client that holds ip or was offered
// it may decline it: anyone else gets ErrNotHolder and nothing is written,
// so a client that holds nothing cannot take addresses out of the pool.
func (p *leases) Decline(ctx context.Context, mac, cid string, ip netip.Addr, r Range) (*bootv1.Lease, error) {
	now := p.now()
	p.mu.Lock()
	ok := p.holds(ip, mac, cid) || p.offeredTo(ip, mac, cid)
	p.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrNotHolder, ip)
	}
	l := &bootv1.Lease{Ip: ip.String(), State: bootv1.Lease_STATE_DECLINED, ExpiresUnix: now.Add(p.quarantine).Unix(),
		UpdatedUnix: now.Unix(), Subnet: r.Subnet.String()}
	_, err := record.Update(ctx, p.st, leaseKey(ip), func() *bootv1.Lease { return &bootv1.Lease{} },
		func(cur *bootv1.Lease, exists bool) (bool, error) {
			// The store is the truth: someone else's live lease (another
			// writer bound it since) is not the decliner's to quarantine.
			if exists && cur.GetMac() != "" && cur.GetMac() != mac && now.Unix() < cur.GetExpiresUnix() {
				return false, fmt.Errorf("%w: %s", ErrTaken, ip)
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
