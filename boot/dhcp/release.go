package dhcp

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	bootv1 "github.com/corralhq/corral/api/boot/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
)

// A client gives a lease back: RELEASE ends it (sticky), DECLINE
// quarantines the address. Neither touches a pinned lease (pin.go).

// Release ends mac's lease on ip now; the binding stays sticky, and the
// MAC's holder record goes with it (holder.go), in one transaction. A
// pinned lease is not released (ErrPinned).
func (p *leases) Release(ctx context.Context, mac string, ip netip.Addr) (*bootv1.Lease, error) {
	// A RELEASE often follows its ACK by milliseconds: a replica's read
	// could still show the address's former client and refuse it, leaving
	// the lease bound (store.WithFreshReads).
	ctx = store.WithFreshReads(ctx)
	for range 5 {
		kv, err := p.st.Get(ctx, leaseKey(ip))
		if errors.Is(err, store.ErrNotFound) {
			return nil, ErrNoLease
		}
		if err != nil {
			return nil, err
		}
		_, l, err := decodeLease(kv)
		switch {
		case err != nil:
			return nil, err
		case l.GetMac() != mac:
			return nil, ErrTaken
		case l.GetPinnedBy() != "":
			return nil, fmt.Errorf("%w by %s", ErrPinned, l.GetPinnedBy())
		}
		now := p.now()
		l.State, l.ExpiresUnix, l.UpdatedUnix = bootv1.Lease_STATE_RELEASED, now.Unix(), now.Unix()
		err = p.writeDropping(ctx, kv, l, subnetOf(l), mac)
		if errors.Is(err, store.ErrConflict) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return l, p.reload(ctx, ip)
	}
	return nil, fmt.Errorf("dhcp: release %s: too many conflicting writers", ip)
}

// writeDropping stores l over kv (a revision of 0: absent) and deletes
// the holder records of macs that name l's address, in one transaction.
func (p *leases) writeDropping(ctx context.Context, kv store.KV, l *bootv1.Lease, subnet netip.Prefix, macs ...string) error {
	raw, err := record.Marshal(l)
	if err != nil {
		return err
	}
	ip, _ := netip.ParseAddr(l.GetIp())
	ops := []store.Op{{Kind: store.OpPut, Key: kv.Key, Value: raw, Rev: kv.Revision}}
	var keys []string
	for _, m := range slices.Compact(slices.Sorted(slices.Values(macs))) {
		op, k, err := p.dropHolder(ctx, subnet, m, ip, false)
		if err != nil {
			return err
		}
		if op != nil {
			ops = append(ops, *op)
			keys = append(keys, k)
		}
	}
	_, err = p.st.Txn(ctx, ops)
	if err == nil || errors.Is(err, store.ErrConflict) {
		p.forgetHolders(keys...)
	}
	return err
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
	// The quarantine names no MAC: the holders naming ip go with the
	// binding it replaces (the decliner's, and the former client's). The
	// address is read current, as Release's is.
	ctx = store.WithFreshReads(ctx)
	var err error
	for range 5 {
		var kv store.KV
		kv, err = p.st.Get(ctx, leaseKey(ip))
		former := ""
		switch {
		case errors.Is(err, store.ErrNotFound):
			kv = store.KV{Key: leaseKey(ip)}
		case err != nil:
			return nil, err
		default:
			_, cur, derr := decodeLease(kv)
			if derr != nil {
				return nil, derr
			}
			// The store is the truth: someone else's live lease (another
			// writer bound it since) is not the decliner's to quarantine.
			if cur.GetMac() != "" && cur.GetMac() != mac && now.Unix() < cur.GetExpiresUnix() {
				return nil, fmt.Errorf("%w: %s", ErrTaken, ip)
			}
			if cur.GetPinnedBy() != "" {
				// A pinned address is configured on a deployed OS:
				// quarantining it would hand it to another client.
				return nil, fmt.Errorf("%w by %s: %s", ErrPinned, cur.GetPinnedBy(), ip)
			}
			former = cur.GetMac()
		}
		err = p.writeDropping(ctx, kv, l, r.Subnet, mac, former)
		if !errors.Is(err, store.ErrConflict) {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	if p.byMAC[mac] == ip {
		delete(p.byMAC, mac)
	}
	p.dropOfferLocked(ip)
	p.mu.Unlock()
	return l, p.reload(ctx, ip)
}
