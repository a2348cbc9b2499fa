package auth

import (
	"context"
	"crypto/x509"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/testsupport/syncbuf"
	"github.com/google/go-cmp/cmp"

	"log/slog"
)

func testCert(serial int64, notAfter time.Time) *x509.Certificate {
	return &x509.Certificate{SerialNumber: big.NewInt(serial), NotAfter: notAfter}
}

func newTestRevocations(t *testing.T, limit int) (*Revocations, *clock, *syncbuf.Buffer) {
	t.Helper()
	s := mem.New()
	t.Cleanup(func() { s.Close() })
	c := &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	logs := &syncbuf.Buffer{}
	return &Revocations{Store: s, MaxLiveCerts: limit, Now: c.now, Logger: slog.New(slog.NewTextHandler(logs, nil))}, c, logs
}

func serials(es []*authv1.IssuedCertificates_Entry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.GetSerial())
	}
	return out
}

// TestRevocationsLifecycle: record, revoke by name, check, purge.
func TestRevocationsLifecycle(t *testing.T) {
	r, c, _ := newTestRevocations(t, 0)
	ctx := context.Background()
	day := 24 * time.Hour
	a := testCert(0xa1, c.t.Add(90*day))
	b := testCert(0xb2, c.t.Add(day))
	other := testCert(0xc3, c.t.Add(90*day))
	for _, x := range []struct {
		name string
		cert *x509.Certificate
		via  string
	}{{"n1", a, "join"}, {"n1", b, "renew"}, {"n2", other, "install"}} {
		if err := r.Record(ctx, x.name, x.cert, x.via); err != nil {
			t.Fatal(err)
		}
	}
	issued, err := r.Issued(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"a1", "b2"}, serials(issued)); d != "" {
		t.Errorf("issued (-want +got):\n%s", d)
	}
	if none, err := r.Issued(ctx, "never"); err != nil || len(none) != 0 {
		t.Errorf("Issued(never) = %v, %v", none, err)
	}
	for _, cert := range []*x509.Certificate{a, b, other} {
		if err := r.Check(ctx, cert); err != nil {
			t.Errorf("Check(%x) before revocation: %v", cert.SerialNumber, err)
		}
	}

	// b expires: RevokeName revokes only what is live.
	c.t = c.t.Add(2 * day)
	got, err := r.RevokeName(ctx, "n1", "machine deleted")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"a1"}, got); d != "" {
		t.Errorf("revoked (-want +got):\n%s", d)
	}
	if err := r.Check(ctx, a); !errors.Is(err, ErrRevoked) || !strings.Contains(err.Error(), "machine deleted") {
		t.Errorf("Check(a) = %v, want ErrRevoked with the reason", err)
	}
	if err := r.Check(ctx, other); err != nil {
		t.Errorf("another name's certificate: %v", err)
	}
	if issued, _ := r.Issued(ctx, "n1"); len(issued) != 0 {
		t.Errorf("issued list after revocation: %v", serials(issued))
	}
	if again, err := r.RevokeName(ctx, "n1", "again"); err != nil || len(again) != 0 {
		t.Errorf("second RevokeName = %v, %v", again, err)
	}

	// Purge: nothing before a's expiry; a's record and n2's list after.
	if n, err := r.Purge(ctx); err != nil || n != 0 {
		t.Errorf("early Purge = %d, %v", n, err)
	}
	c.t = c.t.Add(100 * day)
	if n, err := r.Purge(ctx); err != nil || n != 2 {
		t.Errorf("Purge = %d, %v; want 2 (a's revocation, n2's expired list)", n, err)
	}
	if err := r.Check(ctx, a); err != nil {
		t.Errorf("Check after purge: %v (an expired certificate fails verification by itself)", err)
	}
}

// TestRevocationsBounded: recording more live certificates than the limit
// revokes the oldest as superseded, with a log line.
func TestRevocationsBounded(t *testing.T) {
	r, c, logs := newTestRevocations(t, 2)
	ctx := context.Background()
	var certs []*x509.Certificate
	for i := range 4 {
		cert := testCert(int64(0x10+i), c.t.Add(time.Hour))
		certs = append(certs, cert)
		if err := r.Record(ctx, "n1", cert, "renew"); err != nil {
			t.Fatal(err)
		}
	}
	issued, _ := r.Issued(ctx, "n1")
	if d := cmp.Diff([]string{"12", "13"}, serials(issued)); d != "" {
		t.Errorf("issued (-want +got):\n%s", d)
	}
	for i, cert := range certs {
		err := r.Check(ctx, cert)
		if revoked := errors.Is(err, ErrRevoked); revoked != (i < 2) {
			t.Errorf("cert %d: Check = %v", i, err)
		}
	}
	if n := strings.Count(logs.String(), "node certificate superseded"); n != 2 {
		t.Errorf("%d supersession lines, want 2:\n%s", n, logs)
	}
}
