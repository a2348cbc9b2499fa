package dhcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unique"

	bootv1 "github.com/corralhq/corral/api/boot/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
)

// LeasePrefix is the store prefix of leases, one record per address.
const LeasePrefix = store.LeasesPrefix

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
	// ErrPinned: the lease is pinned (Lease.pinned_by): it is not
	// released, declined, or pinned by another holder.
	ErrPinned = errors.New("dhcp: the lease is pinned")
)

// leaseEntry is what memory keeps of a stored lease: the fields the
// decisions read, held by value in leases.byIP (no record, no pointer but
// the MAC's and client identifier's bytes and the interned subnet), so
// that the garbage collector, which marks every lease at every cycle, has
// one small object per lease to mark instead of a record and its strings.
type leaseEntry struct {
	mac    string
	subnet unique.Handle[string]
	// cid is the client identifier (option 61) the lease was bound with
	// by this process; "" when unknown (the lease record has no field for
	// it, so leases loaded from the store have none).
	cid     string
	rev     int64
	expires int64 // the record's expires_unix
	state   bootv1.Lease_State
	// pinned is the record's pinned_by: a pinned lease is live whatever
	// its expiry, and never reclaimed.
	pinned string
}

func entryOf(l *bootv1.Lease, rev int64, cid string) leaseEntry {
	return leaseEntry{mac: l.GetMac(), subnet: unique.Make(l.GetSubnet()), cid: cid, rev: rev, expires: l.GetExpiresUnix(), state: l.GetState(),
		pinned: l.GetPinnedBy()}
}

// live reports whether e is an active binding, unexpired or pinned.
func (e leaseEntry) live(now time.Time) bool {
	return e.state == bootv1.Lease_STATE_ACTIVE && e.mac != "" && (e.pinned != "" || now.Unix() < e.expires)
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
// compare-and-swap on the address's key, at the revision the decision was
// made on, before it is acknowledged, so two appliances sharing a store
// cannot hand out one address twice. Memory is a hint that makes offers
// good and spares store reads: follow keeps it current with the other
// appliances' writes, and a stale entry costs a conflict and a re-read,
// never a wrong binding. Writes happen outside the mutex, so concurrent
// ACKs reach the store together and are group-committed.
//
// Several appliances may bind one MAC in one subnet at once (each offered
// it an address before either saw the other's binding): whoever learns of
// two active bindings of one MAC in one subnet releases the older one (by
// store revision), re-checked by compare-and-swap, so a client holds one
// address per subnet.
type leases struct {
	st     store.Store
	now    func() time.Time
	log    *slog.Logger
	mu     sync.Mutex
	byIP   map[netip.Addr]leaseEntry
	byMAC  map[string]netip.Addr // each MAC's live binding, else its newest (see setLocked)
	offers map[netip.Addr]offer
	// offerOf is each client's pending offer (the address of its entry
	// in offers), so that a client DISCOVERing again is offered the same
	// address, and an offer is withdrawn when another appliance binds the
	// client elsewhere.
	offerOf map[string]netip.Addr
	next    map[netip.Prefix]netip.Addr // allocation cursor per range
	// quarantine is how long a declined address is kept out.
	quarantine time.Duration
	// superseded counts older bindings released because the MAC was bound
	// again in the same subnet (by another appliance, as a rule).
	superseded atomic.Uint64
	// contended counts bindings refused because the fleet had bound the
	// MAC to another live address (holder.go).
	contended atomic.Uint64
	// holders caches the holder records this appliance wrote or read
	// (holder.go): key → address and revision, one per MAC and subnet,
	// at most holderCacheMax (then cleared: a forgotten one is read again).
	holders map[string]holderSeen
}

// Every map of leases is bounded by the leases in the store (written only
// for addresses of the fleet's configured ranges) and this appliance's
// ranges: byIP holds one entry per stored lease, byMAC one per MAC with a
// lease, offers at most one per address of a range, offerOf at most one
// per entry of offers, next one per range.

func newLeases(st store.Store, now func() time.Time, quarantine time.Duration, log *slog.Logger) *leases {
	return &leases{st: st, now: now, log: log, byIP: map[netip.Addr]leaseEntry{}, byMAC: map[string]netip.Addr{}, holders: map[string]holderSeen{},
		offers: map[netip.Addr]offer{}, offerOf: map[string]netip.Addr{}, next: map[netip.Prefix]netip.Addr{}, quarantine: quarantine}
}

func leaseKey(ip netip.Addr) string { return LeasePrefix + ip.String() }

// load reads every stored lease. Undecodable records are skipped with
// their key returned, so one corrupt record cannot stop DHCP.
func (p *leases) load(ctx context.Context) (n int, bad []string, err error) {
	kvs, err := p.st.List(ctx, LeasePrefix)
	if err != nil {
		return 0, nil, err
	}
	var older []stale
	p.mu.Lock()
	for _, kv := range kvs {
		ip, l, err := decodeLease(kv)
		if err != nil {
			bad = append(bad, kv.Key)
			continue
		}
		if o, ok := p.setLocked(ip, l, kv.Revision, "", p.now()); ok {
			older = append(older, o)
		}
		n++
	}
	p.mu.Unlock()
	p.supersede(ctx, older...)
	return n, bad, nil
}

// decodeLease decodes a lease record and checks that it is stored under
// its own address's key.
func decodeLease(kv store.KV) (netip.Addr, *bootv1.Lease, error) {
	l := &bootv1.Lease{}
	if err := record.Unmarshal(kv.Value, l); err != nil {
		return netip.Addr{}, nil, err
	}
	ip, err := netip.ParseAddr(l.GetIp())
	if err != nil || leaseKey(ip) != kv.Key {
		return netip.Addr{}, nil, fmt.Errorf("%s: %w: lease for %q stored under another key", kv.Key, store.ErrCorrupt, l.GetIp())
	}
	return ip, l, nil
}

// stale is an older active binding of a MAC that also holds a newer one
// in the same subnet: it is to be released, if it is still at rev and
// newer is still above it.
type stale struct {
	ip, newer netip.Addr
	mac       string
	rev       int64 // the older binding's revision
	newerRev  int64
}

// live reports whether l is an active binding, unexpired or pinned.
func live(l *bootv1.Lease, now time.Time) bool {
	return l.GetState() == bootv1.Lease_STATE_ACTIVE && l.GetMac() != "" && (l.GetPinnedBy() != "" || now.Unix() < l.GetExpiresUnix())
}

// setLocked records l, stored at rev, as ip's lease unless memory already
// holds that revision or a newer one (caller holds mu). It keeps byMAC on
// each MAC's live binding (the newest by revision when it has several),
// else on its newest binding; when the MAC now has two live bindings in
// one subnet it returns the older one to release (ok true).
func (p *leases) setLocked(ip netip.Addr, l *bootv1.Lease, rev int64, cid string, now time.Time) (older stale, ok bool) {
	old, hadOld := p.byIP[ip]
	if hadOld && old.rev >= rev {
		if old.rev == rev && old.cid == "" && old.mac == l.GetMac() {
			old.cid = cid // our own write, whose watch event came first
			p.byIP[ip] = old
		}
		return stale{}, false
	}
	if hadOld {
		if om := old.mac; om != l.GetMac() {
			if p.byMAC[om] == ip {
				delete(p.byMAC, om)
			}
		} else if cid == "" {
			cid = old.cid
		}
	}
	cur := entryOf(l, rev, cid)
	p.byIP[ip] = cur
	mac := cur.mac
	if cur.live(now) {
		if o, ok := p.offers[ip]; ok && o.mac != mac {
			// Our offer of ip lost: another appliance bound it.
			p.dropOfferLocked(ip)
		}
		if oip, ok := p.offerOf[mac]; ok && oip != ip {
			// The client took another appliance's offer.
			p.dropOfferLocked(oip)
		}
	}
	if mac == "" {
		return stale{}, false
	}
	prevIP, had := p.byMAC[mac]
	prev, hasPrev := p.byIP[prevIP]
	if !had || prevIP == ip || !hasPrev || prev.mac != mac {
		p.byMAC[mac] = ip
		return stale{}, false
	}
	curLive, prevLive := cur.live(now), prev.live(now)
	if curLive && prevLive && cur.subnet == prev.subnet {
		// Two live bindings of one client in one subnet: the newer
		// stays, the older is to be released.
		if rev > prev.rev {
			p.byMAC[mac] = ip
			return stale{ip: prevIP, newer: ip, mac: mac, rev: prev.rev, newerRev: rev}, true
		}
		return stale{ip: ip, newer: prevIP, mac: mac, rev: rev, newerRev: prev.rev}, true
	}
	// byMAC names the client's live binding if it has one, else its
	// newest (leases are sticky).
	if curLive && (!prevLive || rev > prev.rev) || !curLive && !prevLive && rev > prev.rev {
		p.byMAC[mac] = ip
	}
	return stale{}, false
}

// putOfferLocked reserves ip for the client (caller holds mu), replacing
// the client's other pending offer and any other client's offer of ip.
func (p *leases) putOfferLocked(ip netip.Addr, o offer) {
	if prev, ok := p.offerOf[o.mac]; ok && prev != ip {
		p.dropOfferLocked(prev)
	}
	p.dropOfferLocked(ip)
	p.offers[ip] = o
	p.offerOf[o.mac] = ip
}

// dropOfferLocked withdraws the offer of ip, if any (caller holds mu).
func (p *leases) dropOfferLocked(ip netip.Addr) {
	if o, ok := p.offers[ip]; ok {
		if p.offerOf[o.mac] == ip {
			delete(p.offerOf, o.mac)
		}
		delete(p.offers, ip)
	}
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
	switch {
	case e.mac == mac && e.state != bootv1.Lease_STATE_DECLINED:
		return true
	case e.state == bootv1.Lease_STATE_DECLINED:
		return now.Unix() >= e.expires
	}
	return false // another client's, active or sticky
}

// reclaimable reports whether another client's expired or released lease
// may be taken when the range has no never-used address left (a pinned
// one never may).
func reclaimable(e leaseEntry, now time.Time) bool {
	return e.pinned == "" && now.Unix() >= e.expires
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
		p.putOfferLocked(ip, offer{mac: mac, cid: cid, until: now.Add(30 * time.Second)})
		return ip
	}
	if ip, ok := p.byMAC[mac]; ok && r.Contains(ip) && p.freeFor(ip, mac, now) {
		return pick(ip), nil
	}
	if requested.IsValid() && r.Contains(requested) && p.freeFor(requested, mac, now) {
		return pick(requested), nil
	}
	// The client's pending offer: a client DISCOVERing again is offered
	// the same address.
	if ip, ok := p.offerOf[mac]; ok && r.Contains(ip) && p.offeredTo(ip, mac, cid) && p.freeFor(ip, mac, now) {
		return pick(ip), nil
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
		if !best.IsValid() || e.expires < bestAt {
			best, bestAt = a, e.expires
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
		if e, used := p.byIP[a]; used && !reclaimable(e, now) && e.mac != "" {
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
		if !r.Contains(a) || e.state != bootv1.Lease_STATE_DECLINED {
			continue
		}
		if !best.IsValid() || e.expires < bestAt {
			best, bestAt = a, e.expires
		}
	}
	if best.IsValid() {
		return pick(best), nil
	}
	return netip.Addr{}, fmt.Errorf("%w: %s", ErrExhausted, r)
}

func (p *leases) freeForReclaim(a netip.Addr, e leaseEntry, mac string, now time.Time) bool {
	if o, ok := p.offers[a]; ok && o.mac != mac && now.Before(o.until) {
		return false
	}
	return reclaimable(e, now)
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
	return ok && e.mac == mac && e.state != bootv1.Lease_STATE_DECLINED && sameClient(e.cid, cid)
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
		if e, ok := p.byIP[ip]; ok && e.mac != "" && e.mac != mac && !reclaimable(e, now) {
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
	if e, ok := p.byIP[ip]; ok && p.offeredTo(ip, mac, cid) &&
		(reclaimable(e, now) || e.state == bootv1.Lease_STATE_DECLINED) {
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
		var (
			rev          int64
			pinned, prev string
			released     bool
		)
		if e, ok := p.byIP[ip]; ok {
			rev, prev, released = e.rev, e.mac, e.state == bootv1.Lease_STATE_RELEASED
			if e.mac == mac {
				pinned = e.pinned // the MAC renewing its pinned lease keeps the pin
			}
		}
		p.mu.Unlock()
		l := &bootv1.Lease{Ip: ip.String(), Mac: mac, State: bootv1.Lease_STATE_ACTIVE,
			ExpiresUnix: now.Add(ttl).Unix(), UpdatedUnix: now.Unix(), Subnet: r.Subnet.String(),
			Hostname: hostname, Relay: relay, PinnedBy: pinned}
		newRev, err := p.commitBind(ctx, ip, l, rev, prev, released, r, now)
		if errors.Is(err, store.ErrConflict) {
			if err := p.reload(ctx, ip); err != nil {
				return nil, err
			}
			if rev == 0 {
				p.scatter(ip, mac, r)
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		p.mu.Lock()
		older, two := p.setLocked(ip, l, newRev, cid, now)
		p.dropOfferLocked(ip)
		p.mu.Unlock()
		if two {
			p.supersede(ctx, older)
		}
		return l, nil
	}
	return nil, fmt.Errorf("dhcp: bind %s: too many conflicting writers", ip)
}

// Owner returns the MAC holding ip, if any.
func (p *leases) Owner(ip netip.Addr) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.byIP[ip]
	if !ok || e.mac == "" {
		return "", false
	}
	return e.mac, true
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

// hostnameOK is a client's host name (option 12) as its lease records it:
// the letters, digits, '-' and '.' of its first 63 bytes.
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
