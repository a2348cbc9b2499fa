package appliance

import (
	"context"
	"errors"
	"net/netip"
	"time"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	bootv1 "github.com/corralhq/corral/api/boot/v1"
	"github.com/corralhq/corral/auth"
	"github.com/corralhq/corral/boot/dhcp"
	"github.com/corralhq/corral/boot/dhcp6"
	boothttp "github.com/corralhq/corral/boot/http"
	"github.com/corralhq/corral/lifecycle"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
)

// agentCaller tells the agent edge (lifecycle.AgentServer) who is calling,
// from the principal the auth interceptor put in ctx: an ADMIN token, a
// discovery agent's token with its MAC and machine bindings (per-boot
// tokens) or none (made by hand), or a node certificate by its name. A
// NODE token (made for Join) is a node with no name here: it can hold no
// session.
func agentCaller(ctx context.Context) (lifecycle.Caller, bool) {
	p, ok := auth.FromContext(ctx)
	if !ok {
		return lifecycle.Caller{}, false
	}
	switch p.Role {
	case authv1.Role_ROLE_ADMIN:
		return lifecycle.Caller{Role: lifecycle.CallerAdmin, ID: p.ID}, true
	case authv1.Role_ROLE_AGENT:
		return lifecycle.Caller{Role: lifecycle.CallerAgent, ID: p.ID, MAC: p.MAC, Machine: p.Machine}, true
	case authv1.Role_ROLE_NODE:
		if p.ID != "" {
			return lifecycle.Caller{Role: lifecycle.CallerNode, ID: p.ID}, true
		}
		return lifecycle.Caller{Role: lifecycle.CallerNode, Node: p.Subject}, true
	default:
		// Viewers, operators, the appliance and unspecified roles are no
		// agent callers.
		return lifecycle.Caller{}, false
	}
}

// storeLeases answers boot/http's lease question (full DHCP mode) from the
// leases boot/dhcp keeps in the store: it writes each one by
// compare-and-swap before it ACKs, so a client that has its address has
// its lease record. Only an ACTIVE, unexpired lease counts.
type storeLeases struct {
	st  store.Store
	now func() time.Time
	// v4 and v6: corrald leases that family (DHCPv4 full mode, DHCPv6).
	// An IPv4 address when only IPv6 is leased gets ErrNoLeaseRule (no
	// rule); an IPv6 one when only IPv4 is leased holds no lease.
	v4, v6 bool
}

func (l storeLeases) LeaseHolder(ctx context.Context, a netip.Addr) (string, bool, error) {
	a = a.Unmap().WithZone("")
	prefix := dhcp.LeasePrefix
	switch {
	case a.Is4() && !l.v4:
		// DHCPv4 in proxy mode beside DHCPv6: no IPv4 leases to hold
		// an IPv4 client to.
		return "", false, boothttp.ErrNoLeaseRule
	case a.Is6() && l.v6:
		prefix = dhcp6.LeasePrefix
	case !a.Is4():
		// An IPv6 source where only IPv4 is leased holds no lease.
		return "", false, nil
	}
	var lease bootv1.Lease
	_, err := record.Get(ctx, l.st, prefix+a.String(), &lease)
	if errors.Is(err, store.ErrNotFound) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	if lease.GetState() != bootv1.Lease_STATE_ACTIVE || lease.GetMac() == "" || l.now().Unix() >= lease.GetExpiresUnix() {
		return "", false, nil
	}
	return lease.GetMac(), true, nil
}
