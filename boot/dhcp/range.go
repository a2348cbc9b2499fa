package dhcp

import (
	"fmt"
	"net/netip"

	bootv1 "github.com/corralhq/corral/api/boot/v1"
)

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

// size is the number of addresses from Start to End inclusive.
func (r Range) size() uint64 {
	if !r.Start.Is4() || !r.End.Is4() || r.End.Less(r.Start) {
		return 0
	}
	s, e := r.Start.As4(), r.End.As4()
	return uint64(be32(e)) - uint64(be32(s)) + 1
}

func be32(b [4]byte) uint32 {
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// RangeUsage is one full-mode range's size and the addresses a new client
// could be given now (for /metrics).
type RangeUsage struct {
	// Range is "START-END", the range's bounds (configuration, never a
	// client's value).
	Range string
	Size  uint64
	// Free counts the addresses of the range that are neither bound to a
	// live or pinned lease, nor quarantined after a DECLINE, nor offered
	// to a client in the last 30 s.
	Free uint64
}

// RangeUsage reports each configured range's size and free addresses (nil
// outside full mode). It walks the leases in memory once, under the pool's
// lock: its cost grows with the leases, not the ranges' sizes. Safe for
// concurrent use.
func (s *Server) RangeUsage() []RangeUsage {
	if s == nil || s.leases == nil {
		return nil
	}
	return s.leases.usage(s.cfg.Ranges)
}

// usage counts each range's addresses in use (see RangeUsage).
func (p *leases) usage(ranges []Range) []RangeUsage {
	now := p.now()
	out := make([]RangeUsage, len(ranges))
	for i, r := range ranges {
		out[i] = RangeUsage{Range: r.Start.String() + "-" + r.End.String(), Size: r.size()}
	}
	used := make([]uint64, len(ranges))
	inRange := func(ip netip.Addr) int {
		for i, r := range ranges {
			if r.Contains(ip) {
				return i
			}
		}
		return -1
	}
	p.mu.Lock()
	for ip, e := range p.byIP {
		quarantined := e.state == bootv1.Lease_STATE_DECLINED && now.Unix() < e.expires
		if !e.live(now) && !quarantined {
			continue
		}
		if i := inRange(ip); i >= 0 {
			used[i]++
		}
	}
	for ip, o := range p.offers {
		if !now.Before(o.until) {
			continue
		}
		if e, ok := p.byIP[ip]; ok && (e.live(now) || (e.state == bootv1.Lease_STATE_DECLINED && now.Unix() < e.expires)) {
			continue // counted above
		}
		if i := inRange(ip); i >= 0 {
			used[i]++
		}
	}
	p.mu.Unlock()
	for i := range out {
		out[i].Free = out[i].Size - min(used[i], out[i].Size)
	}
	return out
}
