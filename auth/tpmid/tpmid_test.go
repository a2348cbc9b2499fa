package tpmid_test

import (
	"context"
	"crypto/x509"
	"errors"
	"testing"
	"time"

	"github.com/corralhq/corral/agent/tpm"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/auth/tpmid"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/testsupport/require"
	"github.com/corralhq/corral/testsupport/swtpm"
	"google.golang.org/protobuf/proto"
)

// device starts a swtpm of its own for t and opens it as the agent does.
func device(t testing.TB) *tpm.Device {
	t.Helper()
	require.Tool(t, "swtpm")
	ctx, cancel := context.WithCancel(context.Background())
	sw, err := swtpm.Start(ctx, t.TempDir(), swtpm.Commands)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); sw.Stop() })
	rwc, err := sw.Dial()
	if err != nil {
		t.Fatal(err)
	}
	d, err := tpm.OpenChannel(rwc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// clock is a settable clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

const (
	bindA = "token:tok-a 52:54:00:00:00:0a"
	bindB = "token:tok-b 52:54:00:00:00:0b"
)

func begin(t testing.TB, v *tpmid.Verifier, d *tpm.Device, bind string) (*nodev1.AttestBeginRequest, *nodev1.AttestBeginResponse) {
	t.Helper()
	req, err := d.Begin()
	if err != nil {
		t.Fatal(err)
	}
	ch, err := v.Begin(bind, req)
	if err != nil {
		t.Fatal(err)
	}
	return req, ch
}

func TestCredentialActivation(t *testing.T) {
	a, b := device(t), device(t)
	clk := &clock{t: time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)}
	v := tpmid.New(tpmid.Config{Now: clk.now})

	// The first Begin reads the EK and makes the AK, once a boot.
	t0 := time.Now()
	if _, err := a.Begin(); err != nil {
		t.Fatal(err)
	}
	t.Logf("EK read and AK made in %s", time.Since(t0).Round(time.Millisecond))

	// The right proof passes, and names the EK the agent offered.
	req, ch := begin(t, v, a, bindA)
	secret, err := a.Activate(ch)
	if err != nil {
		t.Fatal(err)
	}
	ek, err := v.Finish(bindA, &nodev1.TpmProof{ChallengeId: ch.GetChallengeId(), Secret: secret})
	if err != nil {
		t.Fatalf("right proof refused: %v", err)
	}
	pub, _ := x509.ParsePKIXPublicKey(req.GetEkPublic())
	if want, _ := tpmid.Identity(pub); ek != want || len(ek) != 64 {
		t.Fatalf("identity %q, want %q", ek, want)
	}

	// Replayed: the challenge is used up.
	if _, err := v.Finish(bindA, &nodev1.TpmProof{ChallengeId: ch.GetChallengeId(), Secret: secret}); !errors.Is(err, apierr.ErrPrecondition) {
		t.Fatalf("replayed proof: %v, want ErrPrecondition", err)
	}

	// Stable: a second boot's proof (a new AK on the same TPM would do
	// too) names the same EK.
	_, ch = begin(t, v, a, bindA)
	secret, _ = a.Activate(ch)
	if again, err := v.Finish(bindA, &nodev1.TpmProof{ChallengeId: ch.GetChallengeId(), Secret: secret}); err != nil || again != ek {
		t.Fatalf("second proof: %q, %v; want %q", again, err, ek)
	}

	// Another TPM cannot answer for A's EK: B offers A's EK with its own
	// AK; the credential is sealed to A's EK, which B does not hold.
	reqB, err := b.Begin()
	if err != nil {
		t.Fatal(err)
	}
	forged := proto.Clone(reqB).(*nodev1.AttestBeginRequest)
	forged.EkPublic, forged.EkCertificate = req.GetEkPublic(), req.GetEkCertificate()
	ch, err = v.Begin(bindB, forged)
	if err != nil {
		t.Fatal(err)
	}
	got, actErr := b.Activate(ch)
	if actErr == nil {
		// Should the TPM release anything, it is not the secret.
		if _, err := v.Finish(bindB, &nodev1.TpmProof{ChallengeId: ch.GetChallengeId(), Secret: got}); !errors.Is(err, apierr.ErrPermissionDenied) {
			t.Fatalf("B's activation of a challenge for A's EK: %v, want ErrPermissionDenied", err)
		}
	} else if _, err := v.Finish(bindB, &nodev1.TpmProof{ChallengeId: ch.GetChallengeId(), Secret: make([]byte, 32)}); !errors.Is(err, apierr.ErrPermissionDenied) {
		t.Fatalf("a guessed secret: %v, want ErrPermissionDenied", err)
	}

	// A's AK with B's EK: A cannot activate what is sealed to B's EK.
	forged = proto.Clone(req).(*nodev1.AttestBeginRequest)
	forged.EkPublic = reqB.GetEkPublic()
	ch, err = v.Begin(bindA, forged)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := a.Activate(ch); err == nil {
		if _, err := v.Finish(bindA, &nodev1.TpmProof{ChallengeId: ch.GetChallengeId(), Secret: s}); err == nil {
			t.Fatal("A proved B's EK")
		}
	}

	// B's own proof names B's EK, not A's.
	_, ch = begin(t, v, b, bindB)
	secret, _ = b.Activate(ch)
	if ekB, err := v.Finish(bindB, &nodev1.TpmProof{ChallengeId: ch.GetChallengeId(), Secret: secret}); err != nil || ekB == ek {
		t.Fatalf("B's proof: %q, %v (A is %q)", ekB, err, ek)
	}

	// A proof for another boot MAC's challenge fails, and uses it up.
	_, ch = begin(t, v, a, bindA)
	secret, _ = a.Activate(ch)
	if _, err := v.Finish(bindB, &nodev1.TpmProof{ChallengeId: ch.GetChallengeId(), Secret: secret}); !errors.Is(err, apierr.ErrPermissionDenied) {
		t.Fatalf("proof under another binding: %v, want ErrPermissionDenied", err)
	}
	if _, err := v.Finish(bindA, &nodev1.TpmProof{ChallengeId: ch.GetChallengeId(), Secret: secret}); !errors.Is(err, apierr.ErrPrecondition) {
		t.Fatalf("after a refused proof: %v, want ErrPrecondition", err)
	}

	// Expired: the right secret, too late.
	_, ch = begin(t, v, a, bindA)
	secret, _ = a.Activate(ch)
	clk.t = clk.t.Add(tpmid.DefaultTTL)
	if _, err := v.Finish(bindA, &nodev1.TpmProof{ChallengeId: ch.GetChallengeId(), Secret: secret}); !errors.Is(err, apierr.ErrPrecondition) {
		t.Fatalf("expired proof: %v, want ErrPrecondition", err)
	}

	// A newer challenge of the same binding replaces the older.
	_, old := begin(t, v, a, bindA)
	_, ch = begin(t, v, a, bindA)
	secret, _ = a.Activate(ch)
	if _, err := v.Finish(bindA, &nodev1.TpmProof{ChallengeId: old.GetChallengeId(), Secret: secret}); !errors.Is(err, apierr.ErrPrecondition) {
		t.Fatalf("replaced challenge: %v, want ErrPrecondition", err)
	}
	if _, err := v.Finish(bindA, &nodev1.TpmProof{ChallengeId: ch.GetChallengeId(), Secret: secret}); err != nil {
		t.Fatalf("newest challenge: %v", err)
	}
}

// TestBeginChecksTheAK: an AK whose creation statement was not signed by
// it (or was edited) gets no challenge.
func TestBeginChecksTheAK(t *testing.T) {
	d := device(t)
	v := tpmid.New(tpmid.Config{})
	req, err := d.Begin()
	if err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string]func(r *nodev1.AttestBeginRequest){
		"signature": func(r *nodev1.AttestBeginRequest) { r.Ak.CreateSignature[len(r.Ak.CreateSignature)-1] ^= 1 },
		"statement": func(r *nodev1.AttestBeginRequest) { r.Ak.CreateAttestation[len(r.Ak.CreateAttestation)-1] ^= 1 },
		"no ak":     func(r *nodev1.AttestBeginRequest) { r.Ak = nil },
		"ek":        func(r *nodev1.AttestBeginRequest) { r.EkPublic = []byte("not a key") },
	} {
		t.Run(name, func(t *testing.T) {
			r := proto.Clone(req).(*nodev1.AttestBeginRequest)
			edit(r)
			if _, err := v.Begin(bindA, r); !errors.Is(err, apierr.ErrInvalid) {
				t.Fatalf("Begin: %v, want ErrInvalid", err)
			}
		})
	}
}

// TestOutstandingBounded: the table of unanswered challenges has a
// bound; expired ones make room.
func TestOutstandingBounded(t *testing.T) {
	d := device(t)
	clk := &clock{t: time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)}
	v := tpmid.New(tpmid.Config{Now: clk.now, MaxOutstanding: 2})
	req, err := d.Begin()
	if err != nil {
		t.Fatal(err)
	}
	for _, bind := range []string{"a", "b"} {
		if _, err := v.Begin(bind, req); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := v.Begin("c", req); !errors.Is(err, apierr.ErrExhausted) {
		t.Fatalf("third challenge: %v, want ErrExhausted", err)
	}
	clk.t = clk.t.Add(tpmid.DefaultTTL)
	if _, err := v.Begin("c", req); err != nil {
		t.Fatalf("after expiry: %v", err)
	}
	if n := v.Outstanding(); n != 1 {
		t.Fatalf("outstanding %d, want 1", n)
	}
}

// BenchmarkVerifier is the appliance's share of a TPM proof: Begin (the
// AK's checks and TPM2_MakeCredential: one RSA-OAEP encryption to the EK)
// and Finish. Figures printed, not asserted.
func BenchmarkVerifier(b *testing.B) {
	d := device(b)
	req, err := d.Begin()
	if err != nil {
		b.Fatal(err)
	}
	v := tpmid.New(tpmid.Config{})
	for b.Loop() {
		ch, err := v.Begin(bindA, req)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := v.Finish(bindA, &nodev1.TpmProof{ChallengeId: ch.GetChallengeId(), Secret: make([]byte, 32)}); !errors.Is(err, apierr.ErrPermissionDenied) {
			b.Fatal(err)
		}
	}
}
