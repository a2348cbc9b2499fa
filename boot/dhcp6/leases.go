package dhcp6

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"sync"
	"time"

	bootv1 "github.com/corralhq/corral/api/boot/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
)

// LeasePrefix is the store prefix of DHCPv6 leases, one record per
// address.
const LeasePrefix = store.Leases6Prefix

// Errors of the lease pool.
var (
	ErrExhausted = errors.New("dhcp6: no address available")
	ErrTaken     = errors.New("dhcp6: address belongs to another client")
	ErrNoBinding = errors.New("dhcp6: not this client's binding")
)

// offerTTL is how long an advertised address is kept for its client.
const offerTTL = 60 * time.Second

// maxScan bounds the addresses one allocation looks at, so that a huge
// IPv6 range never costs more than this per SOLICIT.
const maxScan = 4096

// clientKey identifies one IA_NA of one client.
func clientKey(duid []byte, iaid [4]byte) string {
	return hex.EncodeToString(duid) + "/" + hex.EncodeToString(iaid[:])
}

type entry struct {
	key     string // clientKey; "" for a declined address
	mac     string
	rev     int64
	expires int64
	state   bootv1.Lease_State
}

func (e entry) live(now time.Time) bool {
	return e.state == bootv1.Lease_STATE_ACTIVE && e.key != "" && now.Unix() < e.expires
}

// reusable reports whether another client may be given the address.
func (e entry) reusable(now time.Time) bool {
	return !e.live(now) && now.Unix() >= e.expires || e.state == bootv1.Lease_STATE_RELEASED
}

type offer struct {
	key   string
	until time.Time
}

// leases is the in-memory view of the stored DHCPv6 leases plus the
// pending offers. The store is the truth: a binding is written by
// compare-and-swap at the revision memory holds before it is answered.
// byIP is bounded by max (new addresses are refused past it), byKey and
// offers by byIP and the ranges, offerOf by offers.
type leases struct {
	st         store.Store
	now        func() time.Time
	max        int
	quarantine time.Duration
	mu         sync.Mutex
	byIP       map[netip.Addr]entry
	byKey      map[string]netip.Addr
	offers     map[netip.Addr]offer
	offerOf    map[string]netip.Addr
	next       map[netip.Addr]netip.Addr // allocation cursor per range (by Start)
}

func newLeases(st store.Store, now func() time.Time, maxLeases int, quarantine time.Duration) *leases {
	return &leases{st: st, now: now, max: maxLeases, quarantine: quarantine, byIP: map[netip.Addr]entry{}, byKey: map[string]netip.Addr{},
		offers: map[netip.Addr]offer{}, offerOf: map[string]netip.Addr{}, next: map[netip.Addr]netip.Addr{}}
}

func leaseKey(ip netip.Addr) string { return LeasePrefix + ip.String() }

// load reads every stored lease; undecodable ones are skipped and named.
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
		if err != nil || leaseKey(ip) != kv.Key || !ip.Is6() {
			bad = append(bad, kv.Key)
			continue
		}
		p.setLocked(ip, l, kv.Revision)
		n++
	}
	return n, bad, nil
}

// keyOf is the client key a record names ("" for none).
func keyOf(l *bootv1.Lease) string {
	if l.GetDuid() == "" {
		return ""
	}
	var iaid [4]byte
	iaid[0], iaid[1], iaid[2], iaid[3] = byte(l.GetIaid()>>24), byte(l.GetIaid()>>16), byte(l.GetIaid()>>8), byte(l.GetIaid())
	return l.GetDuid() + "/" + hex.EncodeToString(iaid[:])
}

func (p *leases) setLocked(ip netip.Addr, l *bootv1.Lease, rev int64) {
	if old, ok := p.byIP[ip]; ok && old.key != "" && p.byKey[old.key] == ip {
		delete(p.byKey, old.key)
	}
	e := entry{key: keyOf(l), mac: l.GetMac(), rev: rev, expires: l.GetExpiresUnix(), state: l.GetState()}
	p.byIP[ip] = e
	if e.key != "" {
		p.byKey[e.key] = ip
	}
}

// holder is the MAC of ip's live lease.
func (p *leases) holder(ip netip.Addr) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.byIP[ip.WithZone("")]
	if !ok || !e.live(p.now()) || e.mac == "" {
		return "", false
	}
	return e.mac, true
}

// Binding is a client's live lease, if any.
func (p *leases) binding(key string) (netip.Addr, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ip, ok := p.byKey[key]
	if !ok || !p.byIP[ip].live(p.now()) {
		return netip.Addr{}, false
	}
	return ip, true
}

// freeLocked reports whether ip may go to key now.
func (p *leases) freeLocked(ip netip.Addr, key string, now time.Time) bool {
	if o, ok := p.offers[ip]; ok && o.key != key && now.Before(o.until) {
		return false
	}
	e, ok := p.byIP[ip]
	if !ok {
		return len(p.byIP) < p.max
	}
	if e.key == key && e.state != bootv1.Lease_STATE_DECLINED {
		return true
	}
	return e.reusable(now)
}

// Pick chooses an address in r for key and reserves it for offerTTL: the
// client's current or last address (sticky), else its pending offer, else
// the next free address from the range's cursor (at most maxScan looked
// at), never one another client holds or was offered.
func (p *leases) Pick(key string, r Range) (netip.Addr, error) {
	now := p.now()
	p.mu.Lock()
	defer p.mu.Unlock()
	reserve := func(ip netip.Addr) (netip.Addr, error) {
		if prev, ok := p.offerOf[key]; ok && prev != ip {
			delete(p.offers, prev)
		}
		p.offers[ip] = offer{key: key, until: now.Add(offerTTL)}
		p.offerOf[key] = ip
		return ip, nil
	}
	if ip, ok := p.byKey[key]; ok && r.Contains(ip) && p.freeLocked(ip, key, now) {
		return reserve(ip)
	}
	if ip, ok := p.offerOf[key]; ok && r.Contains(ip) && p.freeLocked(ip, key, now) {
		return reserve(ip)
	}
	ip := p.next[r.Start]
	if !r.Contains(ip) {
		ip = r.Start
	}
	for range maxScan {
		if p.freeLocked(ip, key, now) {
			n := ip.Next()
			if !r.Contains(n) {
				n = r.Start
			}
			p.next[r.Start] = n
			return reserve(ip)
		}
		if ip = ip.Next(); !r.Contains(ip) {
			ip = r.Start
		}
	}
	return netip.Addr{}, ErrExhausted
}

// Lease is what Bind writes.
type Lease struct {
	Key        string
	DUID       []byte
	IAID       [4]byte
	MAC, Relay string
	Subnet     netip.Prefix
}

// Bind writes ip as l's lease until now+valid, by compare-and-swap at
// the revision memory holds; ErrTaken when ip is another client's (in
// memory, or in the store when the write conflicts).
func (p *leases) Bind(ctx context.Context, ip netip.Addr, l Lease, valid time.Duration) error {
	now := p.now()
	p.mu.Lock()
	if !p.freeLocked(ip, l.Key, now) {
		p.mu.Unlock()
		return ErrTaken
	}
	rev := p.byIP[ip].rev
	p.mu.Unlock()
	iaid := uint32(l.IAID[0])<<24 | uint32(l.IAID[1])<<16 | uint32(l.IAID[2])<<8 | uint32(l.IAID[3])
	rec := &bootv1.Lease{Ip: ip.String(), Mac: l.MAC, State: bootv1.Lease_STATE_ACTIVE, ExpiresUnix: now.Add(valid).Unix(), UpdatedUnix: now.Unix(),
		Subnet: l.Subnet.String(), Relay: l.Relay, Duid: hex.EncodeToString(l.DUID), Iaid: iaid}
	return p.write(ctx, ip, rec, rev, l.Key)
}

// write puts rec at ip by CAS at rev and updates memory; a conflict
// re-reads the record so memory catches up, and is ErrTaken.
func (p *leases) write(ctx context.Context, ip netip.Addr, rec *bootv1.Lease, rev int64, key string) error {
	nrev, err := record.Put(ctx, p.st, leaseKey(ip), rec, rev)
	if errors.Is(err, store.ErrConflict) {
		cur := &bootv1.Lease{}
		if crev, gerr := record.Get(ctx, p.st, leaseKey(ip), cur); gerr == nil {
			p.mu.Lock()
			p.setLocked(ip, cur, crev)
			p.mu.Unlock()
		}
		return fmt.Errorf("%w: %s changed in the store", ErrTaken, ip)
	}
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.setLocked(ip, rec, nrev)
	if o, ok := p.offers[ip]; ok {
		delete(p.offers, ip)
		if p.offerOf[o.key] == ip {
			delete(p.offerOf, o.key)
		}
	}
	if key != "" {
		if oip, ok := p.offerOf[key]; ok {
			delete(p.offerOf, key)
			delete(p.offers, oip)
		}
	}
	p.mu.Unlock()
	return nil
}

// Renew extends key's live lease on ip; ErrNoBinding when ip is not
// key's live lease.
func (p *leases) Renew(ctx context.Context, ip netip.Addr, l Lease, valid time.Duration) error {
	p.mu.Lock()
	e, ok := p.byIP[ip]
	p.mu.Unlock()
	if !ok || e.key != l.Key || !e.live(p.now()) {
		return ErrNoBinding
	}
	return p.Bind(ctx, ip, l, valid)
}

// End ends key's lease on ip: released (the address stays the client's
// when it comes back, unless another needs it) or declined (quarantined,
// the client forgotten). ErrNoBinding when ip is not key's lease.
func (p *leases) End(ctx context.Context, ip netip.Addr, key string, declined bool) error {
	now := p.now()
	p.mu.Lock()
	e, ok := p.byIP[ip]
	p.mu.Unlock()
	if !ok || e.key != key || e.state != bootv1.Lease_STATE_ACTIVE {
		return ErrNoBinding
	}
	cur := &bootv1.Lease{}
	rev, err := record.Get(ctx, p.st, leaseKey(ip), cur)
	if err != nil {
		return err
	}
	if rev != e.rev || keyOf(cur) != key {
		return ErrNoBinding
	}
	cur.UpdatedUnix = now.Unix()
	if declined {
		cur.State, cur.Mac, cur.Duid, cur.Iaid = bootv1.Lease_STATE_DECLINED, "", "", 0
		cur.ExpiresUnix = now.Add(p.quarantine).Unix()
	} else {
		cur.State, cur.ExpiresUnix = bootv1.Lease_STATE_RELEASED, now.Unix()
	}
	return p.write(ctx, ip, cur, rev, "")
}

// count is the number of lease records held (tests).
func (p *leases) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.byIP)
}

func iaidString(iaid [4]byte) string {
	return strconv.FormatUint(uint64(iaid[0])<<24|uint64(iaid[1])<<16|uint64(iaid[2])<<8|uint64(iaid[3]), 10)
}
