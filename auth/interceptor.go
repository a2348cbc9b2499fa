package auth

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/corralhq/corral/internal/apierr"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/api/clientconfig"
	"github.com/corralhq/corral/internal/nodeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
)

// NodeOrganization is the Subject.Organization entry that makes a verified
// client certificate a NODE principal (see Interceptor.NodeCertificates);
// it is declared by internal/nodeid, which the node side shares.
const NodeOrganization = nodeid.Organization

// Method prefixes with their own rules.
const (
	healthPrefix = "/grpc.health.v1.Health/"
)

var reflectionPrefixes = []string{
	"/grpc.reflection.v1.ServerReflection/",
	"/grpc.reflection.v1alpha.ServerReflection/",
}

// Interceptor authenticates and authorizes every gRPC call to corrald.
//
// For each call it:
//   - lets /grpc.health.v1.Health/ methods through without credentials;
//   - refuses, with codes.Unauthenticated, a call on a connection whose
//     verified client certificate has expired or is revoked
//     (Certificates): checked on every call, not only at the handshake,
//     so a long-lived connection does not outlive its certificate, and
//     again on a stream's receives every StreamRecheck;
//   - authenticates the caller from the "authorization: Bearer <token>"
//     metadata through Tokens or, when there is no such header and
//     NodeCertificates is set, from a verified TLS client certificate: a
//     peer appliance's (clientconfig.VerifyAppliance) is an APPLIANCE principal,
//     one whose Subject.Organization contains NodeOrganization a NODE
//     principal, each with the certificate's CommonName as Subject. A
//     missing, repeated or malformed header, or a token Tokens rejects,
//     gives codes.Unauthenticated;
//   - lets a NODE token (as opposed to a node certificate) call only
//     AgentService.Join, which consumes it, and consumes any other
//     single-use token on the first call it authenticates;
//   - lets the gRPC reflection services through for any principal;
//   - otherwise looks up the method's corral.auth.v1.access option in the
//     protobuf registry and applies Allowed; a method without a descriptor
//     is treated like one without the option (ADMIN only). A refusal gives
//     codes.PermissionDenied naming the method and the role it needs.
//
// Allowed calls reach the handler with the Principal in their context
// (FromContext). Every refusal is logged at info level with the method, the
// role and the token id, never the token.
//
// Set the fields before the first call and do not change them afterwards;
// the interceptors are then safe for concurrent use. The zero value refuses
// every authenticated method. Use an *Interceptor: it must not be copied
// after first use.
type Interceptor struct {
	// Tokens authenticates bearer tokens; nil refuses every token.
	Tokens *Tokens
	// Logger receives denials; nil discards them.
	Logger *slog.Logger
	// NodeCertificates enables the certificate rules for callers that send
	// no authorization header: a node certificate makes a NODE principal,
	// a peer appliance's certificate (the fleet CA's, carrying
	// clientconfig.ApplianceURI and not of the node organization) an APPLIANCE
	// principal. The server's TLS configuration must verify client
	// certificates against the Corral CA (VerifyClientCertIfGiven);
	// unverified certificates are ignored.
	NodeCertificates bool
	// Certificates, when set, is asked on every call whether the caller's
	// verified client certificate is revoked (Revocations.Check: one store
	// read); an error wrapping ErrRevoked refuses the call. Nil skips the
	// revocation check (expiry is still checked).
	Certificates CertificateChecker
	// Now is the clock for certificate expiry; nil means time.Now.
	Now func() time.Time

	// files is where method descriptors are looked up; nil means
	// protoregistry.GlobalFiles. Tests replace it.
	files *protoregistry.Files
	// access caches methodAccess by full method name, for methods that
	// have a descriptor.
	access sync.Map
}

// CertificateChecker says whether a verified client certificate may still
// be used; Revocations implements it. Check returns an error wrapping
// ErrRevoked for a revoked certificate and any other error when it cannot
// tell (the call then fails with codes.Internal).
type CertificateChecker interface {
	Check(ctx context.Context, cert *x509.Certificate) error
}

// joinMethod is the one method a NODE token may call.
const joinMethod = "/corral.node.v1.AgentService/Join"

// methodAccess is what the registry says about one method.
type methodAccess struct {
	known  bool           // the method has a descriptor
	access *authv1.Access // its access option, nil if it has none
}

// Unary returns the unary server interceptor.
func (i *Interceptor) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, err := i.authorize(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// Stream returns the stream server interceptor.
func (i *Interceptor) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, err := i.authorize(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		st := &serverStream{ServerStream: ss, ctx: ctx}
		if verifiedLeaf(ctx) != nil {
			st.recheck = func() error { return i.checkPeerCertificate(ctx, info.FullMethod) }
		}
		return handler(srv, st)
	}
}

// StreamRecheck is how often a stream opened with a client certificate
// checks it again (expiry, revocation) as messages arrive, so a long
// stream does not outlive its certificate by more than this.
const StreamRecheck = 10 * time.Second

// serverStream replaces the context of a server stream and, for a caller
// with a client certificate, re-checks it on receive every StreamRecheck.
type serverStream struct {
	grpc.ServerStream
	ctx     context.Context
	recheck func() error

	mu   sync.Mutex
	last time.Time
}

func (s *serverStream) Context() context.Context { return s.ctx }

func (s *serverStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if s.recheck == nil {
		return nil
	}
	s.mu.Lock()
	due := time.Since(s.last) >= StreamRecheck
	if due {
		s.last = time.Now()
	}
	s.mu.Unlock()
	if due {
		return s.recheck()
	}
	return nil
}

func (i *Interceptor) logger() *slog.Logger {
	if i.Logger != nil {
		return i.Logger
	}
	return slog.New(slog.DiscardHandler)
}

// authorize returns ctx with the caller's principal, or a status error.
func (i *Interceptor) authorize(ctx context.Context, method string) (context.Context, error) {
	if strings.HasPrefix(method, healthPrefix) {
		return ctx, nil
	}
	p, err := i.authenticate(ctx, method)
	if err != nil {
		return nil, err
	}
	noteResolved(ctx, p)
	ctx = NewContext(ctx, p)
	for _, prefix := range reflectionPrefixes {
		if strings.HasPrefix(method, prefix) {
			return ctx, nil
		}
	}
	ma := i.lookup(method)
	if Allowed(p, ma.access) { // ADMIN passes even when !ma.known
		return ctx, nil
	}
	need := needs(ma.access)
	reason := "role too low"
	if !ma.known {
		reason = "unknown method"
	}
	i.logger().LogAttrs(ctx, slog.LevelInfo, "auth: permission denied",
		slog.String("method", method),
		slog.String("role", p.Role.String()),
		slog.String("token_id", p.ID),
		slog.String("subject", p.Subject),
		slog.String("need", need),
		slog.String("reason", reason))
	return nil, status.Errorf(codes.PermissionDenied, "%s needs %s (caller has %s)", method, need, p.Role)
}

// needs describes who may call a method with access option a.
func needs(a *authv1.Access) string {
	if a == nil {
		return authv1.Role_ROLE_ADMIN.String()
	}
	var who []string
	switch r := a.GetRole(); r {
	case authv1.Role_ROLE_VIEWER, authv1.Role_ROLE_USER, authv1.Role_ROLE_OPERATOR:
		who = append(who, r.String()+" or higher")
	default:
		who = append(who, authv1.Role_ROLE_ADMIN.String())
	}
	for _, r := range a.GetAlso() {
		who = append(who, r.String())
	}
	return strings.Join(who, " or ")
}

// authenticate returns the caller's principal or a status error.
func (i *Interceptor) authenticate(ctx context.Context, method string) (Principal, error) {
	if err := i.checkPeerCertificate(ctx, method); err != nil {
		return Principal{}, err
	}
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) == 0 {
		if p, ok := i.nodeCertificate(ctx); ok {
			return p, nil
		}
		return Principal{}, i.unauthenticated(ctx, method, "", "missing authorization: Bearer <token> metadata")
	}
	if len(vals) > 1 {
		return Principal{}, i.unauthenticated(ctx, method, "", "more than one authorization metadata value")
	}
	scheme, token, ok := strings.Cut(vals[0], " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "bearer") || token == "" {
		return Principal{}, i.unauthenticated(ctx, method, "", "authorization metadata is not \"Bearer <token>\"")
	}
	id, _ := parseToken(token) // for the log only
	if i.Tokens == nil {
		return Principal{}, i.unauthenticated(ctx, method, id, "token authentication is not configured")
	}
	p, err := i.Tokens.Authenticate(ctx, token)
	if err == nil {
		noteResolved(ctx, p) // a NODE token refused by tokenUse still has a caller
	}
	switch {
	case errors.Is(err, ErrUnauthenticated):
		// Authenticate's errors do not tell an unknown id from a wrong
		// secret, so the text may go to the caller.
		return Principal{}, i.unauthenticated(ctx, method, id, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return Principal{}, status.FromContextError(err).Err()
	case errors.Is(err, apierr.ErrUnavailable):
		return Principal{}, storeUnavailable(err)
	case err != nil:
		i.logger().LogAttrs(ctx, slog.LevelError, "auth: cannot authenticate token",
			slog.String("method", method),
			slog.String("token_id", id),
			slog.Any("error", err))
		return Principal{}, status.Error(codes.Internal, "auth: cannot check the token")
	}
	return i.tokenUse(ctx, method, p)
}

// tokenUse applies the rules of a token's use: a NODE token may only Join
// (Join consumes it); any other single-use token is consumed now, by
// compare-and-swap, so of two calls racing with it one is refused.
func (i *Interceptor) tokenUse(ctx context.Context, method string, p Principal) (Principal, error) {
	switch p.Role {
	case authv1.Role_ROLE_NODE:
		if method != joinMethod {
			i.logger().LogAttrs(ctx, slog.LevelInfo, "auth: permission denied",
				slog.String("method", method), slog.String("role", p.Role.String()),
				slog.String("token_id", p.ID), slog.String("reason", "a node token may only Join"))
			return Principal{}, status.Errorf(codes.PermissionDenied,
				"%s: a node token may only be used to Join; after Join the node calls with its certificate", method)
		}
		return p, nil
	case authv1.Role_ROLE_VIEWER, authv1.Role_ROLE_USER, authv1.Role_ROLE_OPERATOR, authv1.Role_ROLE_ADMIN:
	default:
		return p, nil
	}
	claim, err := i.Tokens.ClaimToken(ctx, p.ID)
	if err == nil && !claim.Token.GetSingleUse() {
		return p, nil
	}
	if err == nil {
		err = i.Tokens.Consume(ctx, claim)
	}
	switch {
	case err == nil:
		i.logger().LogAttrs(ctx, slog.LevelInfo, "auth: single-use token consumed",
			slog.String("method", method), slog.String("role", p.Role.String()), slog.String("token_id", p.ID))
		return p, nil
	case errors.Is(err, ErrUnauthenticated):
		return Principal{}, i.unauthenticated(ctx, method, p.ID, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return Principal{}, status.FromContextError(err).Err()
	case errors.Is(err, apierr.ErrUnavailable):
		return Principal{}, storeUnavailable(err)
	default:
		i.logger().LogAttrs(ctx, slog.LevelError, "auth: cannot check the token's use",
			slog.String("method", method), slog.String("token_id", p.ID), slog.Any("error", err))
		return Principal{}, status.Error(codes.Internal, "auth: cannot check the token")
	}
}

// storeUnavailable answers a call whose token cannot be checked because
// the store does not answer (a shared store without quorum): Unavailable,
// so clients retry, with the store's reason.
func storeUnavailable(err error) error {
	return status.Errorf(codes.Unavailable, "auth: cannot check the token: %v", err)
}

// verifiedLeaf returns the caller's verified client certificate, if any.
func verifiedLeaf(ctx context.Context) *x509.Certificate {
	pr, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	info, ok := pr.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return nil
	}
	return info.State.VerifiedChains[0][0]
}

// checkPeerCertificate refuses a call on a connection whose verified client
// certificate has expired since the handshake or is revoked.
func (i *Interceptor) checkPeerCertificate(ctx context.Context, method string) error {
	leaf := verifiedLeaf(ctx)
	if leaf == nil {
		return nil
	}
	now := time.Now()
	if i.Now != nil {
		now = i.Now()
	}
	if now.After(leaf.NotAfter) {
		return i.certUnauthenticated(ctx, method, leaf, fmt.Sprintf("client certificate %q expired at %s; renew it (Join) and reconnect",
			leaf.Subject.CommonName, leaf.NotAfter.UTC().Format(time.RFC3339)))
	}
	if i.Certificates == nil {
		return nil
	}
	err := i.Certificates.Check(ctx, leaf)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrRevoked):
		return i.certUnauthenticated(ctx, method, leaf, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	default:
		i.logger().LogAttrs(ctx, slog.LevelError, "auth: cannot check the client certificate",
			slog.String("method", method), slog.String("subject", leaf.Subject.CommonName), slog.Any("error", err))
		return status.Error(codes.Internal, "auth: cannot check the client certificate")
	}
}

func (i *Interceptor) certUnauthenticated(ctx context.Context, method string, leaf *x509.Certificate, reason string) error {
	i.logger().LogAttrs(ctx, slog.LevelInfo, "auth: unauthenticated",
		slog.String("method", method),
		slog.String("subject", leaf.Subject.CommonName),
		slog.String("serial", serialOf(leaf)),
		slog.String("reason", reason))
	return status.Error(codes.Unauthenticated, reason)
}

// unauthenticated logs a refused call and returns its status error.
func (i *Interceptor) unauthenticated(ctx context.Context, method, tokenID, reason string) error {
	noteClaimed(ctx, tokenID)
	i.logger().LogAttrs(ctx, slog.LevelInfo, "auth: unauthenticated",
		slog.String("method", method),
		slog.String("role", authv1.Role_ROLE_UNSPECIFIED.String()),
		slog.String("token_id", tokenID),
		slog.String("reason", reason))
	return status.Error(codes.Unauthenticated, reason)
}

// nodeCertificate applies the certificate rules: a peer appliance's
// certificate makes an APPLIANCE principal, a node certificate a NODE one.
func (i *Interceptor) nodeCertificate(ctx context.Context) (Principal, bool) {
	if !i.NodeCertificates {
		return Principal{}, false
	}
	leaf := verifiedLeaf(ctx)
	if leaf == nil {
		return Principal{}, false
	}
	// The appliance identity is a URI SAN the CA writes into the
	// appliances' own certificates only (a node certificate is signed from
	// the node's public key alone), and VerifyAppliance refuses a
	// certificate of the node organization even if it carried one: a
	// node certificate never passes as an appliance.
	if clientconfig.VerifyAppliance(leaf) == nil {
		return Principal{Role: authv1.Role_ROLE_APPLIANCE, Subject: leaf.Subject.CommonName}, true
	}
	if !slices.Contains(leaf.Subject.Organization, NodeOrganization) || leaf.Subject.CommonName == "" {
		return Principal{}, false
	}
	return Principal{Role: authv1.Role_ROLE_NODE, Subject: leaf.Subject.CommonName}, true
}

// lookup returns the access rule of a full method name ("/pkg.Service/Method"),
// caching it when the method has a descriptor.
func (i *Interceptor) lookup(method string) methodAccess {
	if v, ok := i.access.Load(method); ok {
		return v.(methodAccess)
	}
	files := i.files
	if files == nil {
		files = protoregistry.GlobalFiles
	}
	ma := lookupAccess(files, method)
	if ma.known {
		// Only methods with a descriptor are cached, so callers cannot
		// grow the cache with made-up names.
		i.access.Store(method, ma)
	}
	return ma
}

// lookupAccess finds the access option of method in files.
func lookupAccess(files *protoregistry.Files, method string) methodAccess {
	svc, name, ok := strings.Cut(strings.TrimPrefix(method, "/"), "/")
	if !ok || !strings.HasPrefix(method, "/") || strings.Contains(name, "/") {
		return methodAccess{}
	}
	if !protoreflect.FullName(svc).IsValid() || !protoreflect.Name(name).IsValid() {
		return methodAccess{}
	}
	d, err := files.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return methodAccess{}
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return methodAccess{}
	}
	md := sd.Methods().ByName(protoreflect.Name(name))
	if md == nil {
		return methodAccess{}
	}
	opts, ok := md.Options().(*descriptorpb.MethodOptions)
	if !ok || opts == nil || !proto.HasExtension(opts, authv1.E_Access) {
		return methodAccess{known: true}
	}
	a, ok := proto.GetExtension(opts, authv1.E_Access).(*authv1.Access)
	if !ok {
		return methodAccess{known: true}
	}
	return methodAccess{known: true, access: a}
}
