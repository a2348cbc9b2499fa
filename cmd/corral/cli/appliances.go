package cli

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	fleetv1 "github.com/corralhq/corral/api/fleet/v1"
)

// applianceKind shows the fleet's appliances (`corral get appliances`):
// each appliance's role, endpoint, runner load, the machines the leader's
// dispatch gives it and its last heartbeat. Appliances register
// themselves; they are never applied or deleted, so the kind is not in
// deploy's registry and only get knows it.
var applianceKind = &kind{
	name:    "appliance",
	columns: []string{"NAME", "ROLE", "ENDPOINT", "LOAD", "ASSIGNED", "LAST-HEARTBEAT"},
	row: func(m proto.Message) []string {
		a := m.(*fleetv1.Appliance)
		beat := "-"
		if hb := a.GetLastHeartbeat(); hb != nil {
			beat = shortAge(time.Since(hb.AsTime())) + " ago"
		}
		return []string{
			a.GetName(),
			stateName(a.GetRole().String(), "ROLE_"),
			cell(a.GetApiEndpoint()),
			strconv.FormatUint(uint64(a.GetLoad()), 10),
			strconv.FormatUint(uint64(a.GetAssigned()), 10),
			beat,
		}
	},
	page: func(ctx context.Context, cc grpc.ClientConnInterface, q pageQuery) ([]proto.Message, string, error) {
		resp, err := fleetv1.NewApplianceServiceClient(cc).ListAppliances(ctx, &fleetv1.ListAppliancesRequest{PageSize: q.size, PageToken: q.token})
		return messages(resp.GetAppliances()), resp.GetNextPageToken(), err
	},
	get: func(ctx context.Context, cc grpc.ClientConnInterface, name string) (proto.Message, error) {
		resp, err := fleetv1.NewApplianceServiceClient(cc).ListAppliances(ctx, &fleetv1.ListAppliancesRequest{})
		if err != nil {
			return nil, err
		}
		for _, a := range resp.GetAppliances() {
			if a.GetName() == name {
				return a, nil
			}
		}
		return nil, status.Error(codes.NotFound, "no such appliance in the fleet")
	},
	del: func(context.Context, grpc.ClientConnInterface, string) error {
		return status.Error(codes.InvalidArgument, "appliances leave the fleet when they stop; they cannot be deleted")
	},
}

// applianceNames are the names get accepts for applianceKind.
var applianceNames = []string{"appliance", "appliances", "app"}

// getKindArg resolves the KIND of get: the registry's kinds, the fleet's
// appliances and the standby pools.
func getKindArg(name string) (*kind, error) {
	n := strings.ToLower(strings.TrimSpace(name))
	if slices.Contains(applianceNames, n) {
		return applianceKind, nil
	}
	if slices.Contains(standbyPoolNames, n) {
		return standbyPoolKind, nil
	}
	k, err := kindArg(name)
	if err != nil {
		return nil, usageErrorf("unknown kind %q (valid: %s, %s, %s)", name, kindList(), strings.Join(applianceNames, "|"), strings.Join(standbyPoolNames, "|"))
	}
	return k, nil
}
