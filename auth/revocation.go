package auth

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
)

// Store prefixes of node certificate records.
const (
	// IssuedKeyPrefix holds one authv1.IssuedCertificates per node name:
	// the live certificates issued for it.
	IssuedKeyPrefix = store.IssuedCertsPrefix
	// RevokedKeyPrefix holds one authv1.RevokedCertificate per revoked
	// serial (lowercase hex), until the certificate would have expired.
	RevokedKeyPrefix = store.RevokedCertsPrefix
)

// DefaultMaxLiveCerts is how many unexpired certificates one node name may
// hold before the oldest are revoked as superseded. A node renewing at two
// thirds of the lifetime holds two.
const DefaultMaxLiveCerts = 4

// ErrRevoked means the certificate is on the revocation list.
var ErrRevoked = errors.New("auth: certificate revoked")

// Revocations records the node certificates the CA issues, per node name,
// and the revocation list the appliance's mTLS verifiers check.
//
// Records live in the store: IssuedKeyPrefix+name (every unexpired
// certificate issued for the name, so that reprovisioning or deleting the
// machine can revoke them all) and RevokedKeyPrefix+serial (one small
// record per revoked serial, so a check is one Get). Revocations holds no
// state of its own: it is safe for concurrent use and several values over
// one store agree. Set the fields before first use.
type Revocations struct {
	// Store holds the records; required.
	Store store.Store
	// MaxLiveCerts bounds the unexpired certificates recorded per name
	// (default DefaultMaxLiveCerts): recording one more revokes the
	// oldest, as superseded, and logs it.
	MaxLiveCerts int
	// Logger receives supersession and purge lines; nil discards them.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

func (r *Revocations) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *Revocations) logger() *slog.Logger {
	if r.Logger != nil {
		return r.Logger
	}
	return slog.New(slog.DiscardHandler)
}

func (r *Revocations) maxLive() int {
	if r.MaxLiveCerts > 0 {
		return r.MaxLiveCerts
	}
	return DefaultMaxLiveCerts
}

func issuedKey(name string) string    { return IssuedKeyPrefix + name }
func revokedKey(serial string) string { return RevokedKeyPrefix + serial }

// serialOf is the revocation key of a certificate: its serial in lowercase
// hex (pki.Serial).
func serialOf(c *x509.Certificate) string { return c.SerialNumber.Text(16) }

// Record adds cert, just issued for node name, to the name's issued list,
// dropping entries that have expired. If more than MaxLiveCerts remain, the
// oldest are revoked (reason "superseded") so nothing issued escapes
// revocation. via says how it was issued ("install", "join", "renew").
// It returns the store's error; the certificate must not be handed out if
// Record fails.
func (r *Revocations) Record(ctx context.Context, name string, cert *x509.Certificate, via string) error {
	now := r.now()
	var dropped []*authv1.IssuedCertificates_Entry
	_, err := record.Mutate(ctx, r.Store, issuedKey(name), func() *authv1.IssuedCertificates { return &authv1.IssuedCertificates{} },
		func(m *authv1.IssuedCertificates, _ bool) (bool, error) {
			dropped = nil
			m.Name = name
			live := slices.DeleteFunc(m.Certificates, func(e *authv1.IssuedCertificates_Entry) bool {
				return e.GetNotAfterUnix() <= now.Unix()
			})
			live = append(live, &authv1.IssuedCertificates_Entry{
				Serial: serialOf(cert), NotAfterUnix: cert.NotAfter.Unix(), Via: via,
			})
			if n := len(live) - r.maxLive(); n > 0 {
				dropped = slices.Clone(live[:n])
				live = live[n:]
			}
			m.Certificates = live
			return false, nil
		})
	if err != nil {
		return fmt.Errorf("auth: record certificate %s for %s: %w", serialOf(cert), name, err)
	}
	for _, e := range dropped {
		if err := r.revoke(ctx, name, e, "superseded"); err != nil {
			return err
		}
		r.logger().Warn("node certificate superseded: revoked the oldest of more than --max-live-node-certs",
			"node", name, "serial", e.GetSerial(), "limit", r.maxLive())
	}
	return nil
}

// revoke writes the revocation record of one issued entry (idempotent).
func (r *Revocations) revoke(ctx context.Context, name string, e *authv1.IssuedCertificates_Entry, reason string) error {
	rec := &authv1.RevokedCertificate{
		Serial: e.GetSerial(), Name: name, Reason: reason,
		RevokedUnix: r.now().Unix(), NotAfterUnix: e.GetNotAfterUnix(),
	}
	_, err := record.Put(ctx, r.Store, revokedKey(e.GetSerial()), rec, 0)
	if errors.Is(err, store.ErrConflict) {
		return nil // revoked already
	}
	if err != nil {
		return fmt.Errorf("auth: revoke certificate %s of %s: %w", e.GetSerial(), name, err)
	}
	return nil
}

// RevokeName revokes every unexpired certificate recorded for node name,
// with reason, and clears the name's issued list. It returns the serials
// it revoked (none when the name has no certificates on record) or the
// store's error; a failure part way leaves the rest recorded for a retry.
func (r *Revocations) RevokeName(ctx context.Context, name, reason string) ([]string, error) {
	var issued authv1.IssuedCertificates
	rev, err := record.Get(ctx, r.Store, issuedKey(name), &issued)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("auth: revoke certificates of %s: %w", name, err)
	}
	now := r.now().Unix()
	var serials []string
	for _, e := range issued.GetCertificates() {
		if e.GetNotAfterUnix() <= now {
			continue
		}
		if err := r.revoke(ctx, name, e, reason); err != nil {
			return serials, err
		}
		serials = append(serials, e.GetSerial())
	}
	err = r.Store.Delete(ctx, issuedKey(name), rev)
	switch {
	case errors.Is(err, store.ErrConflict):
		// A certificate was issued meanwhile: go again, it is revoked too.
		more, err := r.RevokeName(ctx, name, reason)
		return append(serials, more...), err
	case err != nil && !errors.Is(err, store.ErrNotFound):
		return serials, fmt.Errorf("auth: revoke certificates of %s: %w", name, err)
	}
	return serials, nil
}

// Issued returns the unexpired certificates on record for node name (none
// for a name that never had one), or the store's error.
func (r *Revocations) Issued(ctx context.Context, name string) ([]*authv1.IssuedCertificates_Entry, error) {
	var issued authv1.IssuedCertificates
	_, err := record.Get(ctx, r.Store, issuedKey(name), &issued)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("auth: certificates of %s: %w", name, err)
	}
	now := r.now().Unix()
	return slices.DeleteFunc(issued.Certificates, func(e *authv1.IssuedCertificates_Entry) bool {
		return e.GetNotAfterUnix() <= now
	}), nil
}

// Check returns an error wrapping ErrRevoked if cert is on the revocation
// list, nil if it is not, or the store's error. It is one store Get by
// serial: cheap enough for every call.
func (r *Revocations) Check(ctx context.Context, cert *x509.Certificate) error {
	serial := serialOf(cert)
	var rec authv1.RevokedCertificate
	_, err := record.Get(ctx, r.Store, revokedKey(serial), &rec)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("auth: revocation list: %w", err)
	}
	return fmt.Errorf("%w: %q (serial %s) revoked at %s: %s", ErrRevoked, rec.GetName(), serial,
		time.Unix(rec.GetRevokedUnix(), 0).UTC().Format(time.RFC3339), rec.GetReason())
}

// Purge deletes revocation records of certificates that have expired
// anyway (an expired certificate fails verification by itself) and issued
// lists with nothing live left. It returns how many records it deleted; a
// record rewritten meanwhile is left for the next purge.
func (r *Revocations) Purge(ctx context.Context) (int, error) {
	now := r.now().Unix()
	n := 0
	for _, prefix := range []string{RevokedKeyPrefix, IssuedKeyPrefix} {
		kvs, err := r.Store.List(ctx, prefix)
		if err != nil {
			return n, fmt.Errorf("auth: purge certificate records: %w", err)
		}
		for _, kv := range kvs {
			expired := false
			if strings.HasPrefix(kv.Key, RevokedKeyPrefix) {
				var rec authv1.RevokedCertificate
				expired = record.Unmarshal(kv.Value, &rec) == nil && rec.GetNotAfterUnix() <= now
			} else {
				var rec authv1.IssuedCertificates
				expired = record.Unmarshal(kv.Value, &rec) == nil &&
					!slices.ContainsFunc(rec.GetCertificates(), func(e *authv1.IssuedCertificates_Entry) bool { return e.GetNotAfterUnix() > now })
			}
			if !expired {
				continue
			}
			if err := r.Store.Delete(ctx, kv.Key, kv.Revision); err == nil {
				n++
			} else if !errors.Is(err, store.ErrConflict) && !errors.Is(err, store.ErrNotFound) {
				return n, fmt.Errorf("auth: purge certificate records: %w", err)
			}
		}
	}
	return n, nil
}
