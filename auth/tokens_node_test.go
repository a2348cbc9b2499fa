package auth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"testing"
	"time"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

func TestCreateBound(t *testing.T) {
	tk, _, c := newTestTokens(t)
	ctx := context.Background()
	type view struct {
		Role      authv1.Role
		Node      string
		SingleUse bool
		Expires   int64
		HasHash   bool
	}
	for name, tc := range map[string]struct {
		spec TokenSpec
		want view
		err  error
	}{
		"viewer":              {TokenSpec{Role: authv1.Role_ROLE_VIEWER}, view{Role: authv1.Role_ROLE_VIEWER}, nil},
		"single-use operator": {TokenSpec{Role: authv1.Role_ROLE_OPERATOR, SingleUse: true, TTL: time.Hour}, view{Role: authv1.Role_ROLE_OPERATOR, SingleUse: true, Expires: c.t.Add(time.Hour).Unix()}, nil},
		"node is single-use":  {TokenSpec{Role: authv1.Role_ROLE_NODE}, view{Role: authv1.Role_ROLE_NODE, SingleUse: true}, nil},
		"bound node":          {TokenSpec{Role: authv1.Role_ROLE_NODE, Node: "n1"}, view{Role: authv1.Role_ROLE_NODE, Node: "n1", SingleUse: true}, nil},
		"agent refused":       {TokenSpec{Role: authv1.Role_ROLE_AGENT}, view{}, ErrInvalidSpec},
		"node on an admin":    {TokenSpec{Role: authv1.Role_ROLE_ADMIN, Node: "n1"}, view{}, ErrInvalidSpec},
		"no role":             {TokenSpec{}, view{}, ErrInvalidRole},
		"negative ttl":        {TokenSpec{Role: authv1.Role_ROLE_VIEWER, TTL: -time.Second}, view{}, ErrInvalidTTL},
	} {
		t.Run(name, func(t *testing.T) {
			tok, rec, err := tk.CreateBound(ctx, tc.spec)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("CreateBound = %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := view{Role: rec.GetRole(), Node: rec.GetNode(), SingleUse: rec.GetSingleUse(), Expires: rec.GetExpiresUnix(), HasHash: len(rec.GetSha256()) > 0}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("record (-want +got):\n%s", d)
			}
			p, err := tk.Authenticate(ctx, tok)
			if err != nil || p.ID != rec.GetId() || p.Node != tc.want.Node {
				t.Errorf("Authenticate = %+v, %v", p, err)
			}
		})
	}
	if !errors.Is(ErrInvalidSpec, apierr.ErrInvalid) {
		t.Error("ErrInvalidSpec is not of class Invalid")
	}
}

// TestClaimConsume: of two claims of one token only the first Consume
// wins; a consumed token authenticates no more.
func TestClaimConsume(t *testing.T) {
	tk, _, _ := newTestTokens(t)
	ctx := context.Background()
	tok, rec, err := tk.CreateBound(ctx, TokenSpec{Role: authv1.Role_ROLE_NODE})
	if err != nil {
		t.Fatal(err)
	}
	c1, err := tk.ClaimToken(ctx, rec.GetId())
	if err != nil {
		t.Fatal(err)
	}
	c2, err := tk.ClaimToken(ctx, rec.GetId())
	if err != nil {
		t.Fatal(err)
	}
	if err := tk.Consume(ctx, c1); err != nil {
		t.Fatal(err)
	}
	if err := tk.Consume(ctx, c2); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("second Consume = %v, want ErrUnauthenticated", err)
	}
	if _, err := tk.ClaimToken(ctx, rec.GetId()); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("Claim after consumption = %v", err)
	}
	if _, err := tk.Authenticate(ctx, tok); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("Authenticate after consumption = %v", err)
	}
}

// checker is a CertificateChecker over a set of revoked serials.
type checker map[string]bool

func (c checker) Check(_ context.Context, cert *x509.Certificate) error {
	if c[serialOf(cert)] {
		return ErrRevoked
	}
	if c["fail"] {
		return errors.New("store down")
	}
	return nil
}

// TestInterceptorClientCertificateEveryCall: a verified client certificate
// that expired or was revoked since the handshake refuses the call,
// whichever credentials it carries.
func TestInterceptorClientCertificateEveryCall(t *testing.T) {
	now := time.Now()
	cert := func(serial int64, notAfter time.Time) *x509.Certificate {
		return &x509.Certificate{Subject: pkix.Name{CommonName: "node-1", Organization: []string{NodeOrganization}},
			SerialNumber: big.NewInt(serial), NotAfter: notAfter}
	}
	for name, tc := range map[string]struct {
		leaf  *x509.Certificate
		check checker
		want  codes.Code
	}{
		"valid":             {cert(1, now.Add(time.Hour)), checker{}, codes.OK},
		"expired":           {cert(2, now.Add(-time.Second)), checker{}, codes.Unauthenticated},
		"revoked":           {cert(3, now.Add(time.Hour)), checker{"3": true}, codes.Unauthenticated},
		"list unreadable":   {cert(4, now.Add(time.Hour)), checker{"fail": true}, codes.Internal},
		"no checker, valid": {cert(5, now.Add(time.Hour)), nil, codes.OK},
	} {
		t.Run(name, func(t *testing.T) {
			ic := &Interceptor{NodeCertificates: true}
			if tc.check != nil {
				ic.Certificates = tc.check
			}
			state := tls.ConnectionState{PeerCertificates: []*x509.Certificate{tc.leaf}, VerifiedChains: [][]*x509.Certificate{{tc.leaf}}}
			ctx := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: credentials.TLSInfo{State: state}})
			_, err := ic.Unary()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/corral.pool.v1.NodeService/GetNode"},
				func(context.Context, any) (any, error) { return nil, nil })
			if got := status.Code(err); got != tc.want {
				t.Fatalf("code = %v (%v), want %v", got, err, tc.want)
			}
		})
	}
}

// recvStream is a server stream whose RecvMsg always has a message.
type recvStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s recvStream) Context() context.Context { return s.ctx }
func (recvStream) RecvMsg(any) error          { return nil }

// TestInterceptorStreamRechecksCertificate: a stream opened with a valid
// certificate fails its next receive once the certificate is revoked (the
// first receive checks; later ones every StreamRecheck).
func TestInterceptorStreamRechecksCertificate(t *testing.T) {
	leaf := &x509.Certificate{Subject: pkix.Name{CommonName: "node-1", Organization: []string{NodeOrganization}},
		SerialNumber: big.NewInt(42), NotAfter: time.Now().Add(time.Hour)}
	revoked := checker{}
	ic := &Interceptor{NodeCertificates: true, Certificates: revoked}
	state := tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}, VerifiedChains: [][]*x509.Certificate{{leaf}}}
	ctx := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: credentials.TLSInfo{State: state}})
	info := &grpc.StreamServerInfo{FullMethod: "/corral.node.v1.AgentService/Session"}

	err := ic.Stream()(nil, recvStream{ctx: ctx}, info, func(_ any, ss grpc.ServerStream) error {
		if err := ss.RecvMsg(nil); err != nil {
			return err
		}
		revoked["2a"] = true
		return ss.RecvMsg(nil) // within StreamRecheck of the last check
	})
	if err != nil {
		t.Fatalf("receive within the recheck interval: %v", err)
	}
	delete(revoked, "2a")
	err = ic.Stream()(nil, recvStream{ctx: ctx}, info, func(_ any, ss grpc.ServerStream) error {
		revoked["2a"] = true // revoked after the stream opened
		return ss.RecvMsg(nil)
	})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("receive after revocation = %v, want Unauthenticated", err)
	}
}
