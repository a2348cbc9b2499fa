package auth

import (
	"context"
	"slices"

	authv1 "github.com/corralhq/corral/api/auth/v1"
)

// Principal is an authenticated caller.
type Principal struct {
	// Role is what the caller may do; never ROLE_UNSPECIFIED for a
	// principal produced by this package.
	Role authv1.Role
	// ID is the token id for token principals, empty for certificate
	// principals. It is not secret and may be logged.
	ID string
	// Subject names the caller for humans and logs: the token's
	// description, or the certificate's common name.
	Subject string
	// MAC and Machine bind a per-boot AGENT token (IssueBoot) to the boot
	// MAC (lower-case colon form) and the machine its script was rendered
	// for: the agent edge lets it Register only that MAC and Session only
	// that machine. Both are empty for any other principal, including an
	// AGENT token an admin made by hand (corrald token create), which is
	// bound to nothing.
	MAC     string
	Machine string
	// Node is the one node name a NODE token may Join as (empty: any name
	// that is not a node yet). For a certificate principal it is empty:
	// Subject is the node's name.
	Node string
}

type principalKey struct{}

// NewContext returns a copy of ctx carrying p.
func NewContext(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the principal stored by NewContext (the interceptor
// stores one for every call it lets through, except health checks), and
// whether there was one.
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// ValidRole reports whether r is a role a principal can hold: VIEWER,
// OPERATOR, ADMIN, NODE or AGENT.
func ValidRole(r authv1.Role) bool {
	switch r {
	case authv1.Role_ROLE_VIEWER, authv1.Role_ROLE_OPERATOR, authv1.Role_ROLE_ADMIN,
		authv1.Role_ROLE_NODE, authv1.Role_ROLE_AGENT:
		return true
	}
	return false
}

// humanRank orders the human roles; machine and unknown roles rank 0.
func humanRank(r authv1.Role) int {
	switch r {
	case authv1.Role_ROLE_VIEWER:
		return 1
	case authv1.Role_ROLE_OPERATOR:
		return 2
	case authv1.Role_ROLE_ADMIN:
		return 3
	}
	return 0
}

// Allowed reports whether p may call a method whose access option is a.
//
// ADMIN may call everything, including methods with no option (a == nil),
// which nobody else may call. VIEWER < OPERATOR < ADMIN is a hierarchy: a
// method needing VIEWER admits OPERATOR and ADMIN, one needing OPERATOR
// admits ADMIN. NODE, AGENT and APPLIANCE (a peer appliance's certificate,
// never a token) are admitted only where a.Also names them.
// A principal with an invalid role is never admitted.
func Allowed(p Principal, a *authv1.Access) bool {
	if p.Role == authv1.Role_ROLE_ADMIN {
		return true
	}
	if a == nil {
		return false
	}
	switch p.Role {
	case authv1.Role_ROLE_VIEWER, authv1.Role_ROLE_OPERATOR:
		need := humanRank(a.GetRole())
		return need > 0 && humanRank(p.Role) >= need
	case authv1.Role_ROLE_NODE, authv1.Role_ROLE_AGENT, authv1.Role_ROLE_APPLIANCE:
		return slices.Contains(a.GetAlso(), p.Role)
	}
	return false
}
