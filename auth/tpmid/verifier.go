package tpmid

import (
	"crypto/rand"
	"crypto/subtle"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/google/go-attestation/attest"

	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/internal/apierr"
)

// Defaults of Config.
const (
	// DefaultTTL is how long a challenge may be answered.
	DefaultTTL = 60 * time.Second
	// DefaultMaxOutstanding bounds the challenges waiting for an answer.
	DefaultMaxOutstanding = 4096
)

// maxFieldBytes bounds each byte field of a request: TPM structures of an
// RSA-2048 key are a few hundred bytes, EK certificates one or two KiB.
const maxFieldBytes = 8 << 10

// Config configures a Verifier; the zero value is ready (no EK CAs).
type Config struct {
	// EKRoots, when set, are the TPM manufacturers' CAs: an EK is then
	// accepted only with a certificate for it that chains to one of them.
	// Nil accepts an EK on the strength of credential activation alone.
	EKRoots *x509.CertPool
	// TTL is how long a challenge may be answered (DefaultTTL).
	TTL time.Duration
	// MaxOutstanding bounds the challenges not yet answered nor expired
	// (DefaultMaxOutstanding); past it Begin answers ResourceExhausted.
	MaxOutstanding int
	// Now is the clock (time.Now); Rand the randomness (crypto/rand).
	Now  func() time.Time
	Rand io.Reader
}

// Verifier makes credential-activation challenges and checks their
// answers. It is safe for concurrent use.
type Verifier struct {
	cfg Config
	mu  sync.Mutex
	// pending holds the challenges by id; byBind the one live challenge
	// of each binding (a new Begin replaces the old one).
	pending map[string]*challenge
	byBind  map[string]string
}

type challenge struct {
	bind    string
	ek      string // the EK's identity
	secret  []byte
	expires time.Time
}

// New returns a Verifier with cfg's defaults filled in.
func New(cfg Config) *Verifier {
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.MaxOutstanding <= 0 {
		cfg.MaxOutstanding = DefaultMaxOutstanding
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Reader
	}
	return &Verifier{cfg: cfg, pending: map[string]*challenge{}, byBind: map[string]string{}}
}

// Begin checks req's EK (and its certificate, when EK CAs are configured)
// and AK, and returns a challenge bound to bind: the caller and boot MAC
// that asked, which Finish must name again. A request that fails the
// checks is ErrInvalid (or ErrPermissionDenied for a certificate that
// does not verify); a full table is ErrExhausted. The caller vouches for
// nothing: bind only says who may answer.
func (v *Verifier) Begin(bind string, req *nodev1.AttestBeginRequest) (*nodev1.AttestBeginResponse, error) {
	ak := req.GetAk()
	for name, b := range map[string][]byte{"ek_public": req.GetEkPublic(), "ek_certificate": req.GetEkCertificate(),
		"ak.public": ak.GetPublic(), "ak.create_data": ak.GetCreateData(), "ak.create_attestation": ak.GetCreateAttestation(), "ak.create_signature": ak.GetCreateSignature()} {
		if len(b) > maxFieldBytes {
			return nil, apierr.Invalidf("%s: %d bytes, at most %d", name, len(b), maxFieldBytes)
		}
	}
	ekPub, err := x509.ParsePKIXPublicKey(req.GetEkPublic())
	if err != nil {
		return nil, apierr.Invalidf("ek_public: %v", err)
	}
	ek, err := Identity(ekPub)
	if err != nil {
		return nil, apierr.Invalidf("ek_public: %v", err)
	}
	now := v.cfg.Now()
	if v.cfg.EKRoots != nil {
		if err := checkCertificate(req.GetEkCertificate(), req.GetEkPublic(), v.cfg.EKRoots, now); err != nil {
			return nil, apierr.PermissionDeniedf("endorsement key %s: %v", short(ek), err)
		}
	}
	params := attest.ActivationParameters{
		EK: ekPub,
		AK: attest.AttestationParameters{
			Public:            ak.GetPublic(),
			CreateData:        ak.GetCreateData(),
			CreateAttestation: ak.GetCreateAttestation(),
			CreateSignature:   ak.GetCreateSignature(),
		},
		Rand: v.cfg.Rand,
	}
	secret, enc, err := params.Generate()
	if err != nil {
		return nil, apierr.Invalidf("attestation key: %v", err)
	}
	idb := make([]byte, 16)
	if _, err := io.ReadFull(v.cfg.Rand, idb); err != nil {
		return nil, fmt.Errorf("challenge id: %w", err)
	}
	id := hex.EncodeToString(idb)

	v.mu.Lock()
	defer v.mu.Unlock()
	if old, ok := v.byBind[bind]; ok {
		delete(v.pending, old)
	}
	if len(v.pending) >= v.cfg.MaxOutstanding {
		v.expire(now)
	}
	if len(v.pending) >= v.cfg.MaxOutstanding {
		return nil, apierr.Exhaustedf("%d TPM challenges outstanding, at most %d: try again later", len(v.pending), v.cfg.MaxOutstanding)
	}
	v.pending[id] = &challenge{bind: bind, ek: ek, secret: secret, expires: now.Add(v.cfg.TTL)}
	v.byBind[bind] = id
	return &nodev1.AttestBeginResponse{
		ChallengeId:      id,
		Credential:       enc.Credential,
		EncryptedSecret:  enc.Secret,
		ExpiresInSeconds: uint32(v.cfg.TTL / time.Second),
	}, nil
}

// expire drops the challenges past their time; v.mu is held.
func (v *Verifier) expire(now time.Time) {
	for id, c := range v.pending {
		if !now.Before(c.expires) {
			v.drop(id, c)
		}
	}
}

func (v *Verifier) drop(id string, c *challenge) {
	delete(v.pending, id)
	if v.byBind[c.bind] == id {
		delete(v.byBind, c.bind)
	}
}

// Finish checks proof against the challenge it names and returns the
// proved EK's identity. The challenge is used up whatever the outcome. An
// unknown, used or expired challenge is ErrPrecondition (ask for a new
// one); one issued to another binding, or a wrong secret, is
// ErrPermissionDenied.
func (v *Verifier) Finish(bind string, proof *nodev1.TpmProof) (string, error) {
	id := proof.GetChallengeId()
	v.mu.Lock()
	c, ok := v.pending[id]
	if ok {
		v.drop(id, c)
	}
	v.mu.Unlock()
	switch {
	case !ok:
		return "", apierr.Preconditionf("TPM challenge %q is unknown, used or expired: ask for a new one", truncID(id))
	case !v.cfg.Now().Before(c.expires):
		return "", apierr.Preconditionf("TPM challenge %s expired: ask for a new one", id)
	case c.bind != bind:
		return "", apierr.PermissionDeniedf("TPM challenge %s was issued to another caller or boot MAC", id)
	case subtle.ConstantTimeCompare(c.secret, proof.GetSecret()) != 1:
		return "", apierr.PermissionDeniedf("TPM proof for endorsement key %s is wrong: the machine does not hold that key", short(c.ek))
	}
	return c.ek, nil
}

// Outstanding is the number of challenges in the table (expired ones
// included until they are swept).
func (v *Verifier) Outstanding() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.pending)
}

func short(ek string) string { return ek[:min(16, len(ek))] }

func truncID(id string) string { return id[:min(40, len(id))] }
