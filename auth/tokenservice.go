package auth

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"time"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/internal/paging"
	"github.com/corralhq/corral/store"
	"google.golang.org/grpc"
)

// MaxTokenDescription bounds a token's description (it is stored and
// listed).
const MaxTokenDescription = 256

// TokenService serves corral.auth.v1.TokenService over Tokens: ADMIN only
// (the methods' access option; the Interceptor enforces it). Tokens are
// shown once, by CreateToken; ListTokens never returns a hash or a secret;
// RevokeToken deletes the record, so the next call that presents the
// token is Unauthenticated. Every change is logged with the token id and
// the caller, never the token. Safe for concurrent use.
type TokenService struct {
	authv1.UnimplementedTokenServiceServer
	// Tokens is the token store; required.
	Tokens *Tokens
	// CheckNode, when set, validates CreateToken's node binding (the
	// appliance passes its node name rule); nil accepts any non-empty
	// name.
	CheckNode func(name string) error
	// Logger receives one line per created or revoked token; nil discards.
	Logger *slog.Logger
}

// RegisterTokenService registers s on r.
func RegisterTokenService(r grpc.ServiceRegistrar, s *TokenService) {
	authv1.RegisterTokenServiceServer(r, s)
}

func (s *TokenService) logger() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return slog.New(slog.DiscardHandler)
}

// caller names who made a call, for logs.
func caller(ctx context.Context) []any {
	p, _ := FromContext(ctx)
	return []any{"by_role", p.Role.String(), "by_token_id", p.ID, "by_subject", p.Subject}
}

// toStatus is this service's one mapping from errors to gRPC status.
func toStatus(err error) error {
	switch {
	case errors.Is(err, ErrInvalidRole), errors.Is(err, ErrInvalidTTL):
		return apierr.ToStatus(apierr.Invalidf("%v", err))
	}
	return apierr.ToStatus(err)
}

// CreateToken mints a VIEWER, OPERATOR, ADMIN or NODE token (AGENT tokens
// come from the boot server only) and returns it once, with its record.
// Bad arguments are InvalidArgument.
func (s *TokenService) CreateToken(ctx context.Context, req *authv1.CreateTokenRequest) (*authv1.CreateTokenResponse, error) {
	switch r := req.GetRole(); r {
	case authv1.Role_ROLE_VIEWER, authv1.Role_ROLE_USER, authv1.Role_ROLE_OPERATOR, authv1.Role_ROLE_ADMIN, authv1.Role_ROLE_NODE:
	case authv1.Role_ROLE_AGENT:
		return nil, toStatus(apierr.Invalidf("role %s: agent tokens are minted by the boot server only", r))
	default:
		return nil, toStatus(apierr.Invalidf("role %s: want VIEWER, OPERATOR, ADMIN or NODE", r))
	}
	if len(req.GetDescription()) > MaxTokenDescription {
		return nil, toStatus(apierr.Invalidf("description: %d bytes, the limit is %d", len(req.GetDescription()), MaxTokenDescription))
	}
	if req.GetTtlSeconds() < 0 || req.GetTtlSeconds() > int64(100*365*24*time.Hour/time.Second) {
		return nil, toStatus(apierr.Invalidf("ttl_seconds %d: want 0 (no expiry) up to 100 years", req.GetTtlSeconds()))
	}
	if n := req.GetNode(); n != "" {
		if req.GetRole() != authv1.Role_ROLE_NODE {
			return nil, toStatus(apierr.Invalidf("node %q: only a NODE token may be bound to a node name", n))
		}
		if s.CheckNode != nil {
			if err := s.CheckNode(n); err != nil {
				return nil, toStatus(apierr.Invalidf("node %q: %v", n, err))
			}
		}
	}
	tok, info, err := s.Tokens.CreateBound(ctx, TokenSpec{
		Role: req.GetRole(), Description: req.GetDescription(), TTL: time.Duration(req.GetTtlSeconds()) * time.Second,
		Node: req.GetNode(), SingleUse: req.GetSingleUse(),
	})
	if err != nil {
		return nil, toStatus(err)
	}
	s.logger().Info("token created", append([]any{"token_id", info.GetId(), "role", info.GetRole().String(),
		"node", info.GetNode(), "single_use", info.GetSingleUse(), "expires_unix", info.GetExpiresUnix()}, caller(ctx)...)...)
	return &authv1.CreateTokenResponse{Token: tok, Info: info}, nil
}

// ListTokens returns the tokens' records, never their hashes, filtered by
// role; AGENT tokens only when asked for by role or with include_agent.
func (s *TokenService) ListTokens(ctx context.Context, req *authv1.ListTokensRequest) (*authv1.ListTokensResponse, error) {
	all, err := s.Tokens.List(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	out := make([]*authv1.Token, 0, len(all))
	for _, t := range all {
		switch {
		case req.GetRole() != authv1.Role_ROLE_UNSPECIFIED && t.GetRole() != req.GetRole():
			continue
		case req.GetRole() == authv1.Role_ROLE_UNSPECIFIED && t.GetRole() == authv1.Role_ROLE_AGENT && !req.GetIncludeAgent():
			continue
		}
		t.Sha256 = nil // List clears it; never let a hash out whatever List does
		out = append(out, t)
	}
	paging.SortByKey(out, (*authv1.Token).GetId)
	page, next, err := paging.Slice(out, (*authv1.Token).GetId, req.GetPageSize(), req.GetPageToken(),
		paging.Fingerprint(req.GetRole().String(), strconv.FormatBool(req.GetIncludeAgent())))
	if err != nil {
		return nil, toStatus(err)
	}
	return &authv1.ListTokensResponse{Tokens: page, NextPageToken: next}, nil
}

// RevokeToken revokes the token with the given id: InvalidArgument for a
// malformed id, NotFound for one that does not exist.
func (s *TokenService) RevokeToken(ctx context.Context, req *authv1.RevokeTokenRequest) (*authv1.RevokeTokenResponse, error) {
	id := req.GetId()
	if !validID(id) {
		return nil, toStatus(apierr.Invalidf("token id %q: want the 16 hex digits `corral token list` shows", id))
	}
	err := s.Tokens.Revoke(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, toStatus(apierr.NotFoundf("token %s does not exist (revoked or expired and purged?)", id))
	}
	if err != nil {
		return nil, toStatus(err)
	}
	s.logger().Info("token revoked", append([]any{"token_id", id}, caller(ctx)...)...)
	return &authv1.RevokeTokenResponse{}, nil
}
