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
}

func (l storeLeases) LeaseHolder(ctx context.Context, a netip.Addr) (string, bool, error) {
	if !a.Is4() {
		return "", false, nil
	}
	var lease bootv1.Lease
	_, err := record.Get(ctx, l.st, dhcp.LeasePrefix+a.String(), &lease)
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
