package auth

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Per-boot agent tokens.
//
// The boot server puts an AGENT token on every discovery kernel command
// line, and the iPXE script that carries it is plain HTTP: anyone on the
// boot LAN can read it. Such a token is therefore bound to the boot MAC and
// the machine it was rendered for (authv1.Token.mac and .machine, surfaced
// as Principal.MAC and Principal.Machine) and the agent edge refuses it for
// any other machine.
//
// One live boot token per MAC, and rendering the script again does not
// replace it: a machine that is booting keeps the token its kernel already
// holds, so re-requesting a script is no denial of service, and a render
// writes the store only when it must mint (none live) or extend the expiry
// (at most once per half lifetime). This works because the token is
// derived, not drawn:
//
//   - its id is HMAC(boot key, MAC): the record of a MAC's token lives at one
//     key, /auth/tokens/<id>, so "one live per MAC" is a compare-and-swap on
//     that key, and Authenticate, List and Revoke need nothing special;
//   - its secret is HMAC(boot key, id, created_unix): a re-render rebuilds
//     the same token from the record, and a new mint (a later created_unix)
//     gives a new secret. Revoke expires a boot token in place instead of
//     deleting it, and PurgeExpired deletes only tokens expired at least a
//     second ago, so a token minted after a revoke or purge always has a
//     later created_unix than the one it replaces and can never reproduce it.
//
// The boot key (32 random bytes) is kept in the store at BootKeyKey, not in
// the data directory: several appliances sharing one store (etcd, next)
// must derive the same tokens, and a key file per appliance would make each
// one's tokens unknown to the others. The cost is that whoever can read the
// store can mint boot tokens — but whoever can read the store can also
// rewrite every record in it, so the key adds no new asset to protect.
// Deleting the key record (corrald restarted) makes every later render mint
// new tokens under new ids; tokens already issued live until they expire
// or are revoked.

// BootKeyKey is the store key of the boot-token key (a
// google.protobuf.BytesValue of 32 bytes).
const BootKeyKey = store.BootKeyKey

const bootKeyBytes = 32

// ErrBootToken means a per-boot token cannot be issued for these arguments (a
// malformed MAC, an empty machine name, a non-positive lifetime). An API
// maps it to InvalidArgument.
var ErrBootToken = errors.New("auth: invalid boot token request")

// BootDescription is the description of the boot token for mac and machine.
func BootDescription(mac, machine string) string { return "boot " + mac + " " + machine }

// IssueBoot returns the per-boot AGENT token for mac (lower-case colon
// form, as boot/http normalises it), bound to mac and machine, with
// lifetime ttl:
//
//   - when the MAC's token is live (unexpired, derived from the current boot
//     key) it is returned again, unchanged, and minted is false; if less
//     than half of ttl is left its expiry is moved to now+ttl (one write),
//     and if the MAC now belongs to another machine its binding follows
//     (one write);
//   - otherwise a new token is minted in one compare-and-swap write, and
//     minted is true. An expired or revoked token is never brought back.
//
// It is safe for concurrent use; concurrent calls for one MAC agree on one
// token. It returns an error wrapping ErrBootToken for invalid arguments,
// or the store's error.
func (t *Tokens) IssueBoot(ctx context.Context, mac, machine string, ttl time.Duration) (token string, minted bool, err error) {
	if !validBootMAC(mac) || machine == "" || ttl < time.Second {
		return "", false, fmt.Errorf("%w: mac %q, machine %q, ttl %v", ErrBootToken, mac, machine, ttl)
	}
	key, err := t.bootKey(ctx)
	if err != nil {
		return "", false, err
	}
	id := bootID(key, mac)
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return "", false, err
		}
		var rec authv1.Token
		rev, err := record.Get(ctx, t.Store, tokenKey(id), &rec)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return "", false, fmt.Errorf("auth: load boot token %s: %w", id, err)
		}
		now := t.now()
		if rev != 0 && (rec.GetRole() != authv1.Role_ROLE_AGENT || rec.GetMac() != mac) {
			// A 64-bit id collision with a token of another kind: never
			// overwrite it.
			return "", false, fmt.Errorf("auth: boot token id %s for %s is taken by another token", id, mac)
		}
		if rev != 0 && bootLive(key, &rec, now) {
			tok := bootToken(key, id, rec.GetCreatedUnix())
			change := false
			if time.Unix(rec.GetExpiresUnix(), 0).Sub(now) < ttl/2 {
				rec.ExpiresUnix = now.Add(ttl).Unix()
				rec.LastUsedUnix = now.Unix()
				change = true
			}
			if rec.GetMachine() != machine {
				rec.Machine, rec.Description = machine, BootDescription(mac, machine)
				change = true
			}
			if !change {
				return tok, false, nil
			}
			_, err := record.Put(ctx, t.Store, tokenKey(id), &rec, rev)
			if errors.Is(err, store.ErrConflict) && attempt < 8 {
				continue
			}
			if err != nil {
				return "", false, fmt.Errorf("auth: extend boot token %s: %w", id, err)
			}
			return tok, false, nil
		}
		created := now.Unix()
		if rev != 0 && rec.GetCreatedUnix() >= created {
			created = rec.GetCreatedUnix() + 1 // never reproduce a revoked secret
		}
		tok := bootToken(key, id, created)
		sum := sha256.Sum256([]byte(tok))
		nrec := &authv1.Token{
			Id: id, Sha256: sum[:], Role: authv1.Role_ROLE_AGENT, Description: BootDescription(mac, machine),
			CreatedUnix: created, ExpiresUnix: now.Add(ttl).Unix(), Mac: mac, Machine: machine,
		}
		_, err = record.Put(ctx, t.Store, tokenKey(id), nrec, rev)
		if errors.Is(err, store.ErrConflict) && attempt < 8 {
			continue // a concurrent render minted or extended it: read again
		}
		if err != nil {
			return "", false, fmt.Errorf("auth: store boot token %s: %w", id, err)
		}
		return tok, true, nil
	}
}

// bootLive reports whether rec is an unexpired boot token whose stored hash
// is the one the current key derives.
func bootLive(key []byte, rec *authv1.Token, now time.Time) bool {
	if exp := rec.GetExpiresUnix(); exp == 0 || now.Unix() >= exp {
		return false
	}
	sum := sha256.Sum256([]byte(bootToken(key, rec.GetId(), rec.GetCreatedUnix())))
	return hmac.Equal(sum[:], rec.GetSha256())
}

// bootID is the token id of mac's boot token.
func bootID(key []byte, mac string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("corral boot token id\x00" + mac))
	return hex.EncodeToString(m.Sum(nil)[:idBytes])
}

// bootToken is the boot token with id minted at created.
func bootToken(key []byte, id string, created int64) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("corral boot token secret\x00" + id + "\x00" + strconv.FormatInt(created, 10)))
	return TokenPrefix + id + "_" + secretEncoding.EncodeToString(m.Sum(nil)[:secretBytes])
}

// validBootMAC reports whether mac is a lower-case colon-separated 6-byte
// MAC, the one form boot tokens are keyed by.
func validBootMAC(mac string) bool {
	if len(mac) != 17 {
		return false
	}
	for i, c := range []byte(mac) {
		if i%3 == 2 {
			if c != ':' {
				return false
			}
			continue
		}
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// bootKey returns the boot-token key, creating it in the store on first
// use. It is cached once read: the key never changes while records exist.
func (t *Tokens) bootKey(ctx context.Context) ([]byte, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.key != nil {
		return t.key, nil
	}
	for attempt := 0; attempt < 3; attempt++ {
		var v wrapperspb.BytesValue
		_, err := record.Get(ctx, t.Store, BootKeyKey, &v)
		if err == nil {
			if len(v.GetValue()) != bootKeyBytes {
				return nil, fmt.Errorf("auth: boot key %s has %d bytes, want %d: %w", BootKeyKey, len(v.GetValue()), bootKeyBytes, store.ErrCorrupt)
			}
			t.key = v.GetValue()
			return t.key, nil
		}
		if !errors.Is(err, store.ErrNotFound) {
			return nil, fmt.Errorf("auth: load boot key: %w", err)
		}
		k := make([]byte, bootKeyBytes)
		if _, err := rand.Read(k); err != nil {
			return nil, fmt.Errorf("auth: random boot key: %w", err)
		}
		_, err = record.Put(ctx, t.Store, BootKeyKey, wrapperspb.Bytes(k), 0)
		if errors.Is(err, store.ErrConflict) {
			continue // another appliance made it first: read theirs
		}
		if err != nil {
			return nil, fmt.Errorf("auth: store boot key: %w", err)
		}
		t.key = k
		return k, nil
	}
	return nil, fmt.Errorf("auth: boot key: %w", store.ErrConflict)
}

// slideBoot extends a boot token's expiry on use when less than half of its
// lifetime (the span from its last extension, or creation, to its expiry)
// is left: an agent whose install or wait outlasts the script's TTL keeps
// working, at one store write per half lifetime. A failed write does not
// fail the call (the token is still valid; the next use tries again): a
// conflict means another use extended it, anything else is logged.
func (t *Tokens) slideBoot(ctx context.Context, rec *authv1.Token, rev int64) {
	now := t.now()
	from := max(rec.GetCreatedUnix(), rec.GetLastUsedUnix())
	ttl := rec.GetExpiresUnix() - from
	if ttl <= 0 || rec.GetExpiresUnix()-now.Unix() >= ttl/2 {
		return
	}
	rec.ExpiresUnix = now.Unix() + ttl
	rec.LastUsedUnix = now.Unix()
	if _, err := record.Put(ctx, t.Store, tokenKey(rec.GetId()), rec, rev); err != nil && !errors.Is(err, store.ErrConflict) && t.Logger != nil {
		t.Logger.Warn("boot token expiry not extended", "token_id", rec.GetId(), "mac", rec.GetMac(), "err", err)
	}
}
