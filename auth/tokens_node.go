package auth

import (
	"context"
	"errors"
	"fmt"
	"time"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
)

// TokenSpec is what CreateBound makes.
type TokenSpec struct {
	// Role is VIEWER, OPERATOR, ADMIN or NODE. AGENT tokens are minted by
	// the boot server only.
	Role        authv1.Role
	Description string
	// TTL is the lifetime; 0 means the token never expires.
	TTL time.Duration
	// Node binds a NODE token to the one node name it may Join as.
	Node string
	// SingleUse makes the token work once. NODE tokens always are: Join
	// consumes them when it succeeds; any other single-use token is
	// consumed by the first call it authenticates.
	SingleUse bool
}

// ErrInvalidSpec means the token request is inconsistent (an AGENT role, a node
// binding on another role). An API maps it to InvalidArgument.
var ErrInvalidSpec = apierr.New(apierr.ErrInvalid, "auth: invalid token request")

// CreateBound makes a token as spec says and returns it with its record
// (Sha256 cleared). The token is made by Create, then its bindings are
// written by compare-and-swap before the token leaves this function; if
// that write fails the token is deleted, so a token is never handed out
// without its bindings (and one left unbound by a crash was never shown to
// anyone).
//
// It returns an error wrapping ErrInvalidSpec, ErrInvalidRole or
// ErrInvalidTTL for a bad spec, or the store's error.
func (t *Tokens) CreateBound(ctx context.Context, spec TokenSpec) (string, *authv1.Token, error) {
	switch {
	case spec.Role == authv1.Role_ROLE_AGENT:
		return "", nil, fmt.Errorf("%w: AGENT tokens are minted by the boot server only", ErrInvalidSpec)
	case spec.Node != "" && spec.Role != authv1.Role_ROLE_NODE:
		return "", nil, fmt.Errorf("%w: only a NODE token may be bound to a node name", ErrInvalidSpec)
	case spec.Role == authv1.Role_ROLE_NODE:
		spec.SingleUse = true
	}
	tok, err := t.Create(ctx, spec.Role, spec.Description, spec.TTL)
	if err != nil {
		return "", nil, err
	}
	id, ok := parseToken(tok)
	if !ok {
		return "", nil, fmt.Errorf("auth: created token has an unexpected form")
	}
	if spec.Node == "" && !spec.SingleUse {
		rec, err := t.Record(ctx, id)
		if err != nil {
			return "", nil, err
		}
		return tok, rec, nil
	}
	rec, err := record.Update(ctx, t.Store, tokenKey(id), func() *authv1.Token { return &authv1.Token{} },
		func(m *authv1.Token, exists bool) (bool, error) {
			if !exists {
				return false, fmt.Errorf("auth: token %s vanished before its bindings were written: %w", id, store.ErrNotFound)
			}
			m.Node, m.SingleUse = spec.Node, spec.SingleUse
			return false, nil
		})
	if err != nil {
		if rerr := t.Revoke(context.WithoutCancel(ctx), id); rerr != nil && !errors.Is(rerr, store.ErrNotFound) {
			err = errors.Join(err, fmt.Errorf("auth: delete unbound token %s: %w", id, rerr))
		}
		return "", nil, fmt.Errorf("auth: bind token %s: %w", id, err)
	}
	rec.Sha256 = nil
	return tok, rec, nil
}

// Record returns the stored record of token id with Sha256 cleared, or an
// error wrapping store.ErrNotFound (also for an id that is not 16
// lowercase hex digits).
func (t *Tokens) Record(ctx context.Context, id string) (*authv1.Token, error) {
	rec, _, err := t.record(ctx, id)
	if err != nil {
		return nil, err
	}
	rec.Sha256 = nil
	return rec, nil
}

func (t *Tokens) record(ctx context.Context, id string) (*authv1.Token, int64, error) {
	if !validID(id) {
		return nil, 0, fmt.Errorf("auth: token %q: %w", id, store.ErrNotFound)
	}
	var rec authv1.Token
	rev, err := record.Get(ctx, t.Store, tokenKey(id), &rec)
	if err != nil {
		return nil, 0, fmt.Errorf("auth: token %s: %w", id, err)
	}
	return &rec, rev, nil
}

// Claim is a single-use token read for consumption: Consume deletes it if
// it is still the record that was read.
type Claim struct {
	// Token is the record (Sha256 cleared).
	Token    *authv1.Token
	id       string
	revision int64
}

// ClaimToken reads token id for a use that consumes it (Join). It returns
// an error wrapping ErrUnauthenticated if the token no longer exists
// (consumed or revoked since it authenticated the call), or the store's
// error.
func (t *Tokens) ClaimToken(ctx context.Context, id string) (*Claim, error) {
	rec, rev, err := t.record(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: token %s was used or revoked", ErrUnauthenticated, id)
	}
	if err != nil {
		return nil, err
	}
	rec.Sha256 = nil
	return &Claim{Token: rec, id: id, revision: rev}, nil
}

// Consume deletes the claimed token by compare-and-swap on the revision
// ClaimToken read: of two uses racing for one token exactly one succeeds.
// The loser gets an error wrapping ErrUnauthenticated; any other error is
// the store's.
func (t *Tokens) Consume(ctx context.Context, c *Claim) error {
	err := t.Store.Delete(ctx, tokenKey(c.id), c.revision)
	if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%w: token %s was already used or revoked", ErrUnauthenticated, c.id)
	}
	if err != nil {
		return fmt.Errorf("auth: consume token %s: %w", c.id, err)
	}
	return nil
}
