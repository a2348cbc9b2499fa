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
// Holders are never deleted: like the sticky leases, one stays per MAC
// and subnet the fleet has bound.

// holderCacheMax bounds the holder records an appliance remembers.
var holderCacheMax = 65536

// LeaseHoldersPrefix is the store prefix of the MACs' holder records.
const LeaseHoldersPrefix = store.LeaseHoldersPrefix

// holderKey is the key of mac's holder record in subnet.
func holderKey(subnet netip.Prefix, mac string) string {
	return LeaseHoldersPrefix + strings.ReplaceAll(subnet.String(), "/", "_") + "/" + mac
}

// holderSeen is a holder record as this appliance last wrote or read it.
type holderSeen struct {
	ip  string
	rev int64
}

// commitBind stores l (ip's lease, for l's MAC) at rev together with the
// MAC's holder record: one transaction, or ErrConflict when the lease,
// the holder or the holder's previous lease changed since they were read,
// or ErrOtherAddress when the holder names another address the MAC still
// holds live (memory then learns that lease). A holder this appliance
// knows naming ip costs no read (a renewal): the transaction checks its
// revision; one it does not know is first assumed absent (a new client)
// and read only after a conflict.
func (p *leases) commitBind(ctx context.Context, ip netip.Addr, l *bootv1.Lease, rev int64, r Range, now time.Time) (int64, error) {
	mac := l.GetMac()
	raw, err := record.Marshal(l)
	if err != nil {
		return 0, err
	}
	ops := []store.Op{{Kind: store.OpPut, Key: leaseKey(ip), Value: raw, Rev: rev}}
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
	kv, err := p.st.Get(ctx, leaseKey(other))
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
