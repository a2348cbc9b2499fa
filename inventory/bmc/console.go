package bmc

import (
	"context"
	"fmt"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
)

// ConsoleTarget returns how to reach machine's serial console: its IPMI
// BMC with the opened password (Serial-over-LAN). A machine without an
// enrolled BMC, or one reached over Redfish only, is apierr.ErrPrecondition;
// an unknown machine is the inventory's not-found. The password is for
// the caller's session only: never logged, stored or sent elsewhere.
func (c *Service) ConsoleTarget(ctx context.Context, name string) (Target, error) {
	m, t, err := c.target(ctx, name)
	if err != nil {
		return Target{}, err
	}
	b := m.GetBmc()
	if b.GetProtocol() == inventoryv1.BmcProtocol_BMC_PROTOCOL_REDFISH ||
		(b.GetProtocol() == inventoryv1.BmcProtocol_BMC_PROTOCOL_AUTO && b.GetProvider() == RedfishProviderName) {
		return Target{}, apierr.Preconditionf("machine %q's BMC is reached over Redfish: its serial console is served over IPMI Serial-over-LAN only", name)
	}
	if t.Port == 0 {
		t.Port = defaultBMCPort(inventoryv1.BmcProtocol_BMC_PROTOCOL_IPMI)
	}
	if t.Host == "" {
		return Target{}, fmt.Errorf("machine %q: %w", name, apierr.ErrPrecondition)
	}
	return t, nil
}
