package dhcp

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	bootv1 "github.com/corralhq/corral/api/boot/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
)

// A MAC holds at most one live lease in a subnet, on every appliance
// sharing the store. Leases are keyed by address, so the address's
// compare-and-swap alone cannot see that another appliance bound the same
// MAC to another address a moment before (each had offered it one before
// either saw the other's binding, or a client whose ACK came late
// DISCOVERed again from an appliance whose view of the leases lagged).
// Every binding therefore also writes, in the same transaction, the MAC's
// holder record (LeaseHoldersPrefix, one per MAC and subnet, whose value
// is the address): a binding of another address than the holder names
// commits only while the lease the holder names is not live for the MAC,
// and only at the revisions read, so of two racing bindings of one MAC one
// commits and the other is refused with ErrOtherAddress (the client is
// NAKed and is offered its bound address when it DISCOVERs again).
//
// A holder names an address whose lease names its MAC, so the store never
// holds more holder records than leases (at most one per address of the
// fleet's ranges), however many MACs come and go: a binding that takes an
// address from another MAC (a reclaimed expired or released lease)
// deletes that MAC's holder when it still names the address, and a
// RELEASE or a DECLINE deletes the client's, each in the transaction that
// writes the lease. A lease only running out deletes nothing (it still
// names its MAC, which is offered it again); a lease superseded by its
// MAC's newer binding keeps the holder, which names the newer one.

// holderCacheMax bounds the holder records an appliance remembers.
var holderCacheMax = 65536

// LeaseHoldersPrefix is the store prefix of the MACs' holder records.
const LeaseHoldersPrefix = store.LeaseHoldersPrefix

// holderKey is the key of mac's holder record in subnet.
func holderKey(subnet netip.Prefix, mac string) string {
	return LeaseHoldersPrefix + strings.ReplaceAll(subnet.String(), "/", "_") + "/" + mac
}

// dropHolder returns the operation deleting mac's holder record in subnet
// when it names ip (nil when it names another address or none exists),
// and the record's key. A holder this appliance knows naming ip costs no
// read; a stale revision costs a conflict, after which it is read. One it
// does not know is read, unless mac's lease on ip was released: the
// RELEASE deleted it (a superseded lease's holder names the newer
// binding), so reclaiming a released address costs no read. (A holder a
// RELEASE left before RELEASEs deleted them, 2026-11-29, stays until its
// MAC binds again.)
func (p *leases) dropHolder(ctx context.Context, subnet netip.Prefix, mac string, ip netip.Addr, released bool) (*store.Op, string, error) {
	if mac == "" || !subnet.IsValid() {
		return nil, "", nil
	}
	hk := holderKey(subnet, mac)
	p.mu.Lock()
	seen := p.holders[hk]
	p.mu.Unlock()
	if seen.ip == ip.String() && seen.rev > 0 {
		return &store.Op{Kind: store.OpDelete, Key: hk, Rev: seen.rev}, hk, nil
	}
	if released {
		return nil, hk, nil
	}
	h, err := p.st.Get(ctx, hk)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, hk, nil
	case err != nil:
		return nil, hk, err
	case string(h.Value) != ip.String():
		return nil, hk, nil
	}
	return &store.Op{Kind: store.OpDelete, Key: hk, Rev: h.Revision}, hk, nil
}

// forgetHolders drops keys from the holder cache: the records were
// deleted, or their revision is in doubt after a conflict.
func (p *leases) forgetHolders(keys ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, k := range keys {
		delete(p.holders, k)
	}
}

// subnetOf is the subnet a lease record was bound in (invalid for a
// record that names none).
func subnetOf(l *bootv1.Lease) netip.Prefix {
	s, _ := netip.ParsePrefix(l.GetSubnet())
	return s
}

// holderSeen is a holder record as this appliance last wrote or read it.
type holderSeen struct {
	ip  string
	rev int64
}

// commitBind stores l (ip's lease, for l's MAC) at rev together with the
// MAC's holder record, and deletes the holder of prev (the MAC the lease
// at rev names, "" for none; prevReleased when that lease was released)
// when l takes ip from it: one transaction, or
// ErrConflict when the lease, a holder or the holder's previous lease
// changed since they were read, or ErrOtherAddress when the holder names
// another address the MAC still holds live (memory then learns that
// lease). A holder this appliance knows naming ip costs no read (a
// renewal): the transaction checks its revision; one it does not know is
// first assumed absent (a new client) and read only after a conflict.
func (p *leases) commitBind(ctx context.Context, ip netip.Addr, l *bootv1.Lease, rev int64, prev string, prevReleased bool, r Range, now time.Time) (int64, error) {
	mac := l.GetMac()
	raw, err := record.Marshal(l)
	if err != nil {
		return 0, err
	}
	ops := []store.Op{{Kind: store.OpPut, Key: leaseKey(ip), Value: raw, Rev: rev}}
	if !r.Subnet.IsValid() {
		// Only a pin of a lease stored without its subnet comes here
		// (Bind always names it): such a lease has no holder.
		return p.st.Txn(ctx, ops)
	}
	var prevKey string
	if prev != mac && rev > 0 {
		// The address changes hands: its former MAC's holder goes.
		op, k, err := p.dropHolder(ctx, r.Subnet, prev, ip, prevReleased)
		if err != nil {
			return 0, err
		}
		if op != nil {
			ops = append(ops, *op)
		}
		prevKey = k
	}
	hk := holderKey(r.Subnet, mac)
	p.mu.Lock()
	seen, known := p.holders[hk]
	p.mu.Unlock()
	var hold holderSeen
	switch {
	case known && seen.ip == ip.String() && seen.rev > 0:
		ops = append(ops, store.Op{Kind: store.OpCheck, Key: hk, Rev: seen.rev})
		hold = seen
	case !known:
		ops = append(ops, store.Op{Kind: store.OpPut, Key: hk, Value: []byte(ip.String())})
	default:
		h, err := p.st.Get(ctx, hk)
		switch {
		case errors.Is(err, store.ErrNotFound):
			ops = append(ops, store.Op{Kind: store.OpPut, Key: hk, Value: []byte(ip.String())})
		case err != nil:
			return 0, err
		case string(h.Value) == ip.String():
			ops = append(ops, store.Op{Kind: store.OpCheck, Key: hk, Rev: h.Revision})
			hold = holderSeen{ip: ip.String(), rev: h.Revision}
		default:
			check, err := p.otherBinding(ctx, mac, string(h.Value), ip, now)
			if err != nil {
				return 0, err
			}
			ops = append(ops, check...)
			ops = append(ops, store.Op{Kind: store.OpPut, Key: hk, Value: []byte(ip.String()), Rev: h.Revision})
		}
	}
	nrev, err := p.st.Txn(ctx, ops)
	if prevKey != "" && (err == nil || errors.Is(err, store.ErrConflict)) {
		p.forgetHolders(prevKey)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.holders[hk]; !ok && len(p.holders) >= holderCacheMax {
		// A cache: a holder it forgets is read again after one conflict.
		// Bounded, or MACs that come and go would grow it for ever.
		clear(p.holders)
	}
	switch {
	case err == nil && hold.rev == 0:
		p.holders[hk] = holderSeen{ip: ip.String(), rev: nrev}
	case err == nil:
		p.holders[hk] = hold
	case errors.Is(err, store.ErrConflict):
		p.holders[hk] = holderSeen{} // read it on the next attempt
	}
	return nrev, err
}

// otherBinding is the precondition of moving mac's holder from the
// address it names (held) to ip: the lease on held is not mac's live
// binding, and stays as read. When it is, the binding is refused with
// ErrOtherAddress and memory learns that lease.
func (p *leases) otherBinding(ctx context.Context, mac, held string, ip netip.Addr, now time.Time) ([]store.Op, error) {
	// A holder naming no address (never written so) binds nothing.
	other, _ := netip.ParseAddr(held)
	if !other.IsValid() || other == ip {
		return nil, nil
	}
	// Current, not a replica's: a stale copy of a lease the client has
	// since released would refuse its new binding (store.WithFreshReads).
	kv, err := p.st.Get(store.WithFreshReads(ctx), leaseKey(other))
	switch {
	case errors.Is(err, store.ErrNotFound):
		return []store.Op{{Kind: store.OpCheck, Key: leaseKey(other)}}, nil
	case err != nil:
		return nil, err
	}
	if _, ol, derr := decodeLease(kv); derr == nil && ol.GetMac() == mac && live(ol, now) {
		if err := p.reload(ctx, other); err != nil {
			return nil, err
		}
		p.contended.Add(1)
		return nil, fmt.Errorf("%w: %s (bound by the fleet)", ErrOtherAddress, other)
	}
	return []store.Op{{Kind: store.OpCheck, Key: leaseKey(other), Rev: kv.Revision}}, nil
}
