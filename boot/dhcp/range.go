package dhcp

import (
	"fmt"
	"net/netip"
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
