package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base32"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
)

// Sentinel errors; test them with errors.Is.
var (
	// ErrUnauthenticated: the token is malformed, unknown, wrong or
	// expired. Errors wrapping it never distinguish an unknown id from a
	// wrong secret, so their text is safe to return to the caller.
	ErrUnauthenticated = errors.New("auth: unauthenticated")
	// ErrInvalidRole: the role is not one a token can hold (VIEWER,
	// OPERATOR, ADMIN, NODE or AGENT). An API maps it to InvalidArgument.
	ErrInvalidRole = errors.New("auth: invalid role")
	// ErrInvalidTTL: the token lifetime is negative. An API maps it to
	// InvalidArgument.
	ErrInvalidTTL = errors.New("auth: invalid ttl")
)

const (
	// TokenPrefix starts every Corral bearer token.
	TokenPrefix = "crl_"
	// TokenKeyPrefix is the store prefix under which tokens live, one
	// record per token at TokenKeyPrefix+id.
	TokenKeyPrefix = store.TokensPrefix

	idBytes     = 8
	secretBytes = 32
	idLen       = 2 * idBytes // hex
	// createAttempts bounds retries when a random id is already taken.
	createAttempts = 3
)

// secretEncoding writes the secret as lowercase unpadded base32, so a
// token is one word of [a-z0-9_] that survives copy and paste.
var secretEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

var secretLen = secretEncoding.EncodedLen(secretBytes)

// Tokens keeps bearer tokens in a store.Store. A token is
// crl_<id>_<secret> with a 16-hex-digit id and a 52-character base32
// secret; the store holds only the SHA-256 of the whole token. Per-boot
// agent tokens (IssueBoot, boottokens.go) are derived from a key kept in
// the store. Tokens caches nothing but that key: it is safe for concurrent
// use, and several values over the same store agree. Use a *Tokens; it
// must not be copied after first use.
type Tokens struct {
	// Store holds the records; required.
	Store store.Store
	// Now is the clock used for creation and expiry; nil means time.Now.
	Now func() time.Time
	// Logger receives writes that failed where the caller goes on (a boot
	// token's expiry not extended); nil discards them.
	Logger *slog.Logger

	mu  sync.Mutex
	key []byte // the boot-token key, once read
}

func (t *Tokens) now() time.Time {
	if t.Now != nil {
		return t.Now()
	}
	return time.Now()
}

func tokenKey(id string) string { return TokenKeyPrefix + id }

// Create makes a new token with role, a free-form description (shown by
// List and used as the principal's Subject) and a lifetime; ttl 0 means
// the token never expires. It returns the token itself, which is not
// stored anywhere and cannot be recovered later.
//
// It returns an error wrapping ErrInvalidRole for a role other than
// VIEWER, OPERATOR, ADMIN, NODE or AGENT, ErrInvalidTTL for a negative
// ttl, or the store's error if the record cannot be written.
func (t *Tokens) Create(ctx context.Context, role authv1.Role, description string, ttl time.Duration) (string, error) {
	if !ValidRole(role) {
		return "", fmt.Errorf("%w: %v", ErrInvalidRole, role)
	}
	if ttl < 0 {
		return "", fmt.Errorf("%w: %v is negative", ErrInvalidTTL, ttl)
	}
	for attempt := 1; ; attempt++ {
		id, token, err := newToken()
		if err != nil {
			return "", err
		}
		sum := sha256.Sum256([]byte(token))
		now := t.now()
		rec := &authv1.Token{
			Id:          id,
			Sha256:      sum[:],
			Role:        role,
			Description: description,
			CreatedUnix: now.Unix(),
		}
		if ttl > 0 {
			rec.ExpiresUnix = now.Add(ttl).Unix()
		}
		_, err = record.Put(ctx, t.Store, tokenKey(id), rec, 0)
		if errors.Is(err, store.ErrConflict) && attempt < createAttempts {
			continue // the random id is taken: draw another
		}
		if err != nil {
			return "", fmt.Errorf("auth: store token %s: %w", id, err)
		}
		return token, nil
	}
}

// newToken draws a random id and secret and returns the id and the token.
func newToken() (id, token string, err error) {
	var b [idBytes + secretBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", fmt.Errorf("auth: random token: %w", err)
	}
	id = hex.EncodeToString(b[:idBytes])
	return id, TokenPrefix + id + "_" + secretEncoding.EncodeToString(b[idBytes:]), nil
}

// parseToken returns the id of a well-formed token. It checks only the
// shape (prefix, lowercase hex id, base32 secret of the right length).
func parseToken(token string) (id string, ok bool) {
	rest, ok := strings.CutPrefix(token, TokenPrefix)
	if !ok {
		return "", false
	}
	id, secret, ok := strings.Cut(rest, "_")
	if !ok || !validID(id) || len(secret) != secretLen {
		return "", false
	}
	for _, c := range []byte(secret) {
		if !('a' <= c && c <= 'z' || '2' <= c && c <= '7') {
			return "", false
		}
	}
	return id, true
}

// validID reports whether id is 16 lowercase hex digits.
func validID(id string) bool {
	if len(id) != idLen {
		return false
	}
	for _, c := range []byte(id) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// Authenticate checks token and returns the principal it stands for, with
// Role and ID from the record, Subject set to its description and the
// record's bindings (MAC and Machine of a per-boot agent token, Node of a
// node token). A per-boot agent token's expiry slides forward when less
// than half of its lifetime is left (one store write per half lifetime;
// see IssueBoot).
//
// It returns an error wrapping ErrUnauthenticated when the token is
// malformed, its id is unknown, its secret does not match (compared in
// constant time) or it has expired; an unknown id and a wrong secret give
// the same error, so the error text may be shown to the caller. Any other
// error (the store failing, a corrupt record) is returned wrapped and
// should be reported as an internal error.
func (t *Tokens) Authenticate(ctx context.Context, token string) (Principal, error) {
	id, ok := parseToken(token)
	if !ok {
		return Principal{}, fmt.Errorf("%w: malformed token", ErrUnauthenticated)
	}
	sum := sha256.Sum256([]byte(token))
	var rec authv1.Token
	rev, err := record.Get(ctx, t.Store, tokenKey(id), &rec)
	if errors.Is(err, store.ErrNotFound) {
		return Principal{}, fmt.Errorf("%w: invalid token", ErrUnauthenticated)
	}
	if err != nil {
		return Principal{}, fmt.Errorf("auth: load token %s: %w", id, err)
	}
	if subtle.ConstantTimeCompare(sum[:], rec.GetSha256()) != 1 || rec.GetId() != id {
		return Principal{}, fmt.Errorf("%w: invalid token", ErrUnauthenticated)
	}
	if exp := rec.GetExpiresUnix(); exp != 0 && t.now().Unix() >= exp {
		return Principal{}, fmt.Errorf("%w: token %s expired at %s", ErrUnauthenticated, id,
			time.Unix(exp, 0).UTC().Format(time.RFC3339))
	}
	if !ValidRole(rec.GetRole()) {
		return Principal{}, fmt.Errorf("%w: token %s has no valid role", ErrUnauthenticated, id)
	}
	p := Principal{Role: rec.GetRole(), ID: id, Subject: rec.GetDescription(), MAC: rec.GetMac(), Machine: rec.GetMachine(), Node: rec.GetNode()}
	if rec.GetRole() == authv1.Role_ROLE_AGENT && rec.GetMac() != "" {
		t.slideBoot(ctx, &rec, rev)
	}
	return p, nil
}

// List returns every stored token in id order, expired ones included, with
// the Sha256 field cleared: callers learn ids, roles, descriptions and
// timestamps, never hashes. It returns the store's error, or one wrapping
// store.ErrCorrupt for an undecodable record.
func (t *Tokens) List(ctx context.Context) ([]*authv1.Token, error) {
	recs, err := record.List(ctx, t.Store, TokenKeyPrefix, func() *authv1.Token { return &authv1.Token{} })
	if err != nil {
		return nil, fmt.Errorf("auth: list tokens: %w", err)
	}
	for _, r := range recs {
		r.Sha256 = nil
	}
	return recs, nil
}

// Revoke deletes the token with id; it stops authenticating at once. A
// per-boot agent token (one bound to a MAC) is expired in place instead and
// left for PurgeExpired, so that the next token minted for its MAC is
// certain to differ from it (see IssueBoot). It returns an error wrapping
// store.ErrNotFound if there is no such token (including an id that is not
// 16 lowercase hex digits), or the store's error.
func (t *Tokens) Revoke(ctx context.Context, id string) error {
	if !validID(id) {
		return fmt.Errorf("auth: revoke token %q: %w", id, store.ErrNotFound)
	}
	for {
		kv, err := t.Store.Get(ctx, tokenKey(id))
		if err != nil {
			return fmt.Errorf("auth: revoke token %s: %w", id, err)
		}
		var rec authv1.Token
		if record.Unmarshal(kv.Value, &rec) == nil && rec.GetRole() == authv1.Role_ROLE_AGENT && rec.GetMac() != "" {
			now := t.now().Unix()
			if rec.GetExpiresUnix() != 0 && rec.GetExpiresUnix() <= now {
				return nil // already expired or revoked
			}
			rec.ExpiresUnix = now
			_, err = record.Put(ctx, t.Store, tokenKey(id), &rec, kv.Revision)
		} else {
			err = t.Store.Delete(ctx, tokenKey(id), kv.Revision)
		}
		if errors.Is(err, store.ErrConflict) && ctx.Err() == nil {
			continue // rewritten since we read it: read again
		}
		if err != nil {
			return fmt.Errorf("auth: revoke token %s: %w", id, err)
		}
		return nil
	}
}

// PurgeExpired deletes every token that expired at least a second ago
// (tokens without an expiry are kept) and returns how many it deleted. A
// per-boot agent token stays until its MAC's next mint would replace it
// anyway; purging keeps the tokens of machines that stopped booting from
// piling up. A token rewritten concurrently is left for the next purge.
func (t *Tokens) PurgeExpired(ctx context.Context) (int, error) {
	kvs, err := t.Store.List(ctx, TokenKeyPrefix)
	if err != nil {
		return 0, fmt.Errorf("auth: purge tokens: %w", err)
	}
	now := t.now().Unix()
	n := 0
	for _, kv := range kvs {
		var tok authv1.Token
		if err := record.Unmarshal(kv.Value, &tok); err != nil {
			continue
		}
		if tok.GetExpiresUnix() == 0 || tok.GetExpiresUnix() >= now {
			continue
		}
		if err := t.Store.Delete(ctx, kv.Key, kv.Revision); err == nil {
			n++
		} else if !errors.Is(err, store.ErrConflict) && !errors.Is(err, store.ErrNotFound) {
			return n, fmt.Errorf("auth: purge tokens: %w", err)
		}
	}
	return n, nil
}
