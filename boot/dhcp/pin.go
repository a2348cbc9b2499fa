package dhcp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	bootv1 "github.com/corralhq/corral/api/boot/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
)

// Pinning: a deployed operating system is configured statically with its
// boot MAC's address (lifecycle/nocloud), so while the deployment holds
// it the address must go to no one else. The pin is a field of the lease
// record (pinned_by), written by compare-and-swap like every binding, so
// it survives restarts (load) and every appliance of a fleet learns it
// from its watch of the lease records (follow): entryOf carries it into
// memory, where live treats a pinned lease as live whatever its expiry and
// reclaimable never gives it up.

const maxHolder = 128

// lookupMAC returns the address of mac's lease (any state but DECLINED:
// leases are sticky), from memory, else from the store (a lease another
// appliance wrote that the watch has not delivered yet), preferring a
// live one, then the newest.
func (p *leases) lookupMAC(ctx context.Context, mac string) (netip.Addr, error) {
	p.mu.Lock()
	ip, ok := p.byMAC[mac]
	e, known := p.byIP[ip]
	p.mu.Unlock()
	if ok && known && e.mac == mac && e.state != bootv1.Lease_STATE_DECLINED {
		return ip, nil
	}
	kvs, err := p.st.List(ctx, LeasePrefix)
	if err != nil {
		return netip.Addr{}, err
	}
	now := p.now()
	var (
		best     netip.Addr
		bestLive bool
		bestRev  int64
	)
	for _, kv := range kvs {
		a, l, err := decodeLease(kv)
		if err != nil || l.GetMac() != mac || l.GetState() == bootv1.Lease_STATE_DECLINED {
			continue
		}
		lv := live(l, now)
		if !best.IsValid() || lv && !bestLive || lv == bestLive && kv.Revision > bestRev {
			best, bestLive, bestRev = a, lv, kv.Revision
		}
	}
	if !best.IsValid() {
		return netip.Addr{}, ErrNoLease
	}
	return best, nil
}

// pin makes mac's lease permanent for holder (idempotent for the same
// holder); ErrNoLease when mac has none, ErrPinned when another holder
// pinned it. The pin is written as a binding (commitBind), with the MAC's
// holder record: a released lease, whose holder went with the RELEASE, is
// active again once pinned, and must hold the MAC's one address.
func (p *leases) pin(ctx context.Context, mac, holder string) (*bootv1.Lease, error) {
	for range 5 {
		ip, err := p.lookupMAC(ctx, mac)
		if err != nil {
			return nil, err
		}
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
		case l.GetMac() != mac || l.GetState() == bootv1.Lease_STATE_DECLINED:
			return nil, ErrNoLease // moved on since it was looked up
		case l.GetPinnedBy() != "" && l.GetPinnedBy() != holder:
			return nil, fmt.Errorf("%w by %s", ErrPinned, l.GetPinnedBy())
		}
		// A released or expired (sticky) lease of the MAC is its address
		// still: pinned, it is active again.
		now := p.now()
		l.PinnedBy, l.State, l.UpdatedUnix = holder, bootv1.Lease_STATE_ACTIVE, now.Unix()
		_, err = p.commitBind(ctx, ip, l, kv.Revision, mac, false, Range{Subnet: subnetOf(l)}, now)
		switch {
		case errors.Is(err, store.ErrConflict):
			if err := p.reload(ctx, ip); err != nil {
				return nil, err
			}
			continue
		case errors.Is(err, ErrOtherAddress):
			continue // memory learnt the MAC's live lease: pin that one
		case err != nil:
			return nil, err
		}
		return l, p.reload(ctx, ip)
	}
	return nil, fmt.Errorf("dhcp: pin %s: too many conflicting writers", mac)
}

// unpin lets mac's lease pinned by holder expire normally again, at the
// latest ttl from now; a lease pinned by another holder, or none, is left
// alone.
func (p *leases) unpin(ctx context.Context, mac, holder string, ttl int64) error {
	ip, err := p.lookupMAC(ctx, mac)
	if errors.Is(err, ErrNoLease) {
		return nil
	}
	if err != nil {
		return err
	}
	now := p.now().Unix()
	_, err = p.update(ctx, ip, func(l *bootv1.Lease) error {
		if l.GetMac() != mac || l.GetPinnedBy() != holder {
			return errNotPinnedBy
		}
		l.PinnedBy, l.UpdatedUnix = "", now
		if l.GetState() == bootv1.Lease_STATE_ACTIVE {
			l.ExpiresUnix = min(max(l.GetExpiresUnix(), now), now+ttl)
		}
		return nil
	})
	if errors.Is(err, errNotPinnedBy) || errors.Is(err, ErrNoLease) {
		return nil
	}
	return err
}

var errNotPinnedBy = errors.New("dhcp: not pinned by this holder")

// Pin makes the DHCP lease of mac permanent for holder (e.g.
// "deployment:<id>") and returns its address with the range's prefix
// length, the range's first router (invalid when it has none) and its DNS
// servers. While pinned the lease never expires, is never reclaimed,
// superseded, released or quarantined, and its address is offered to no
// other MAC, on this appliance and, through the store, every other of
// the fleet; mac renewing keeps it. Pinning again for the same holder
// changes nothing. FailedPrecondition when the server hands out no
// addresses (proxy mode), when mac has no lease, or when another holder
// pinned it; InvalidArgument for a malformed MAC or holder. Safe for
// concurrent use.
func (s *Server) Pin(ctx context.Context, mac, holder string) (addr netip.Prefix, gateway netip.Addr, dns []netip.Addr, err error) {
	mac, err = s.pinArgs(mac, holder)
	if err != nil {
		return netip.Prefix{}, netip.Addr{}, nil, err
	}
	l, err := s.leases.pin(ctx, mac, holder)
	switch {
	case errors.Is(err, ErrNoLease):
		return netip.Prefix{}, netip.Addr{}, nil, apierr.Preconditionf("MAC %s has no DHCP lease here: it has not booted on a range Corral serves", mac)
	case errors.Is(err, ErrPinned):
		return netip.Prefix{}, netip.Addr{}, nil, apierr.Preconditionf("the DHCP lease of %s: %v", mac, err)
	case err != nil:
		return netip.Prefix{}, netip.Addr{}, nil, fmt.Errorf("dhcp: pin %s: %w", mac, err)
	}
	ip, _ := netip.ParseAddr(l.GetIp())
	subnet, perr := netip.ParsePrefix(l.GetSubnet())
	for _, r := range s.cfg.Ranges {
		if perr == nil && r.Subnet == subnet || perr != nil && r.Subnet.Contains(ip) {
			subnet = r.Subnet
			if len(r.Router) > 0 {
				gateway = r.Router[0]
			}
			dns = append([]netip.Addr(nil), r.DNS...)
			break
		}
	}
	if !subnet.IsValid() {
		return netip.Prefix{}, netip.Addr{}, nil, apierr.Preconditionf("the DHCP lease of %s (%s) is in no range this appliance serves", mac, ip)
	}
	s.log.Info("lease pinned", "mac", mac, "ip", ip.String(), "holder", holder)
	return netip.PrefixFrom(ip, subnet.Bits()), gateway, dns, nil
}

// Unpin lets the lease of mac pinned by holder expire normally again (at
// the latest one lease time from now). A lease pinned by another holder,
// or none at all, is left alone (nil). Safe for concurrent use.
func (s *Server) Unpin(ctx context.Context, mac, holder string) error {
	mac, err := s.pinArgs(mac, holder)
	if err != nil {
		return err
	}
	if err := s.leases.unpin(ctx, mac, holder, int64(s.cfg.LeaseTime.Seconds())); err != nil {
		return fmt.Errorf("dhcp: unpin %s: %w", mac, err)
	}
	return nil
}

// pinArgs checks Pin's and Unpin's arguments and the mode, and returns
// mac as leases record it.
func (s *Server) pinArgs(mac, holder string) (string, error) {
	if s.cfg.Mode != ModeFull || s.leases == nil {
		return "", apierr.Preconditionf("proxy DHCP: Corral assigns no addresses")
	}
	hw, err := net.ParseMAC(mac)
	if err != nil || len(hw) != 6 {
		return "", apierr.Invalidf("MAC %q", mac)
	}
	if holder == "" || len(holder) > maxHolder || strings.ContainsFunc(holder, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return "", apierr.Invalidf("lease holder %q: want 1 to %d printable characters", holder, maxHolder)
	}
	return hw.String(), nil
}
