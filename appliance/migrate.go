package appliance

import (
	"context"
	"fmt"
	"net/netip"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// schemaSteps carry stored records from each schema version to the next
// (store/record.Migrate walks them; record.SchemaVersion is the last).
// They live here, in the composition layer, because a step may need any
// record type and store/record imports none.
var schemaSteps = []record.Step{
	{
		// Before schema version 2 a network's CIDRs were stored as the operator
		// wrote them, host bits and all ("10.0.0.5/24"); the pool has since
		// refused such input, and the readers compensated (pool's
		// sameCIDR). Version 2 stores them canonically.
		From:   1,
		Name:   "network CIDRs stored canonically",
		Types:  []string{string((&poolv1.Network{}).ProtoReflect().Descriptor().FullName())},
		Change: canonicalNetworkCIDRs,
	},
}

// canonicalNetworkCIDRs clears the host bits of a Network's CIDRs. A CIDR
// that does not parse is left as it is (the pool reports it when used).
func canonicalNetworkCIDRs(v *anypb.Any) error {
	var n poolv1.Network
	if err := v.UnmarshalTo(&n); err != nil {
		return err
	}
	for _, c := range []*string{&n.Ipv4Cidr, &n.Ipv6Cidr} {
		if p, err := netip.ParsePrefix(*c); err == nil {
			*c = p.Masked().String()
		}
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(&n)
	if err != nil {
		return err
	}
	v.Value = b
	return nil
}

// migrateStore carries the store's records to record.SchemaVersion, and
// refuses a store written by a newer corrald. It runs once in New, before
// the API serves (readers before it see older records as they are, which
// every reader accepts).
func (s *Server) migrateStore(ctx context.Context) error {
	if _, err := record.Migrate(ctx, s.store, schemaSteps, s.log.With("component", "store")); err != nil {
		return fmt.Errorf("%s: %w", storeName(s.cfg), err)
	}
	return nil
}
