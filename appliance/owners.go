package appliance

import (
	"context"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/auth"
	"github.com/corralhq/corral/inventory"
)

// machineCaller is who calls MachineService as allocation sees it
// (docs/security.md, "Owners"): a token's caller is "token:<id>", an
// operator or admin sees and changes every machine. A call without a
// principal (none passes the interceptor) is nobody: it owns nothing and
// allocates nothing.
func machineCaller(ctx context.Context) inventory.Owner {
	p, ok := auth.FromContext(ctx)
	if !ok {
		return inventory.Owner{}
	}
	o := inventory.Owner{Name: p.Subject}
	if p.ID != "" {
		o.ID = "token:" + p.ID
	}
	switch p.Role {
	case authv1.Role_ROLE_OPERATOR, authv1.Role_ROLE_ADMIN:
		o.Operator = true
	default: // VIEWER and USER, and principals that never reach MachineService's verbs
	}
	return o
}
