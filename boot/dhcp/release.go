package dhcp

import (
	"context"
	"fmt"
	"net/netip"

	bootv1 "github.com/corralhq/corral/api/boot/v1"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/protobuf/proto"
)

// A client gives a lease back: RELEASE ends it (sticky), DECLINE
// quarantines the address. Neither touches a pinned lease (pin.go).

// Release ends mac's lease on ip now; the binding stays sticky. A pinned
// lease is not released (ErrPinned).
func (p *leases) Release(ctx context.Context, mac string, ip netip.Addr) (*bootv1.Lease, error) {
	now := p.now()
	return p.update(ctx, ip, func(l *bootv1.Lease) error {
		if l.GetMac() != mac {
			return ErrTaken
		}
		if l.GetPinnedBy() != "" {
			return fmt.Errorf("%w by %s", ErrPinned, l.GetPinnedBy())
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
			if exists && cur.GetPinnedBy() != "" {
				// A pinned address is configured on a deployed OS:
				// quarantining it would hand it to another client.
				return false, fmt.Errorf("%w by %s: %s", ErrPinned, cur.GetPinnedBy(), ip)
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
	p.dropOfferLocked(ip)
	p.mu.Unlock()
	return l, p.reload(ctx, ip)
}
