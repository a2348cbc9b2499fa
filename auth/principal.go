package auth

import (
	"context"
	"slices"
	"sync"

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
// USER, OPERATOR, ADMIN, NODE or AGENT.
func ValidRole(r authv1.Role) bool {
	switch r {
	case authv1.Role_ROLE_VIEWER, authv1.Role_ROLE_USER, authv1.Role_ROLE_OPERATOR, authv1.Role_ROLE_ADMIN,
		authv1.Role_ROLE_NODE, authv1.Role_ROLE_AGENT:
		return true
	default: // UNSPECIFIED, APPLIANCE and values this build does not know
		return false
	}
}

// humanRank orders the human roles; machine and unknown roles rank 0.
func humanRank(r authv1.Role) int {
	switch r {
	case authv1.Role_ROLE_VIEWER:
		return 1
	case authv1.Role_ROLE_USER:
		return 2
	case authv1.Role_ROLE_OPERATOR:
		return 3
	case authv1.Role_ROLE_ADMIN:
		return 4
	default: // machine roles, UNSPECIFIED and unknown values
		return 0
	}
}

// Allowed reports whether p may call a method whose access option is a.
//
// ADMIN may call everything, including methods with no option (a == nil),
// which nobody else may call. VIEWER < USER < OPERATOR < ADMIN is a
// hierarchy: a method needing VIEWER admits USER, OPERATOR and ADMIN, one
// needing USER admits OPERATOR and ADMIN, one needing OPERATOR admits ADMIN. NODE, AGENT and APPLIANCE (a peer appliance's certificate,
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
	case authv1.Role_ROLE_VIEWER, authv1.Role_ROLE_USER, authv1.Role_ROLE_OPERATOR:
		need := humanRank(a.GetRole())
		return need > 0 && humanRank(p.Role) >= need
	case authv1.Role_ROLE_NODE, authv1.Role_ROLE_AGENT, authv1.Role_ROLE_APPLIANCE:
		return slices.Contains(a.GetAlso(), p.Role)
	default: // UNSPECIFIED and unknown roles (ADMIN was admitted above)
		return false
	}
}

// Resolution is where the Interceptor notes who a call's caller turned out
// to be, for an interceptor that runs before it (the audit) and must also
// see calls the Interceptor refuses. Put one in the context with
// WithResolution; the Interceptor fills it as soon as it knows: the
// principal once authenticated (before the role check, so a
// PermissionDenied call has one), or, for an Unauthenticated call, the
// token id the caller claimed when the header parsed (it is not secret).
// It is safe for concurrent use.
type Resolution struct {
	mu      sync.Mutex
	p       Principal
	ok      bool
	claimed string
}

type resolutionKey struct{}

// WithResolution returns a copy of ctx carrying a new, empty Resolution.
func WithResolution(ctx context.Context) (context.Context, *Resolution) {
	r := &Resolution{}
	return context.WithValue(ctx, resolutionKey{}, r), r
}

// Principal returns the authenticated caller, if the Interceptor got that
// far.
func (r *Resolution) Principal() (Principal, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.p, r.ok
}

// ClaimedTokenID returns the token id of an authorization header that was
// well formed but did not authenticate ("" when there was none).
func (r *Resolution) ClaimedTokenID() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.claimed
}

// noteResolved records p in ctx's Resolution, if it has one.
func noteResolved(ctx context.Context, p Principal) {
	if r, ok := ctx.Value(resolutionKey{}).(*Resolution); ok {
		r.mu.Lock()
		r.p, r.ok = p, true
		r.mu.Unlock()
	}
}

// noteClaimed records the token id a refused caller claimed.
func noteClaimed(ctx context.Context, id string) {
	if r, ok := ctx.Value(resolutionKey{}).(*Resolution); ok && id != "" {
		r.mu.Lock()
		r.claimed = id
		r.mu.Unlock()
	}
}
