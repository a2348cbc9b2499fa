package appliance

import (
	"context"
	"errors"
	"fmt"
	"path"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/auth"
	"github.com/corralhq/corral/auth/pki"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/inventory"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// join serves AgentService.Join: a certificate request exchanged for a node
// certificate signed by the CA (CN and the one DNS SAN = the node name, O =
// corral:node, server and client usages, PKIConfig.NodeCertValidity). The
// caller decides the name, under these rules:
//
//   - the name is a valid node name and never an IP address;
//   - a NODE token (single-use) joins a new name: one that is no pool node,
//     no machine and has no certificate on record; a token bound to a name
//     (token create --node) joins only that name. The token is consumed,
//     by compare-and-swap, only when the certificate is issued;
//   - a node certificate renews its own name only (the node renews before
//     its certificate expires);
//   - ADMIN joins any name, an existing one included.
//
// Every refusal is PermissionDenied or InvalidArgument with the reason, and
// a log line with the caller.
func (s *Server) join(ctx context.Context, req *nodev1.JoinRequest) (*nodev1.JoinResponse, error) {
	name := req.GetName()
	p, _ := auth.FromContext(ctx)
	refuse := func(err error) (*nodev1.JoinResponse, error) {
		s.log.Info("join refused", "node", name, "role", p.Role.String(), "token_id", p.ID, "subject", p.Subject, "reason", err.Error())
		return nil, err
	}
	if err := inventory.CheckName(name); err != nil {
		return refuse(apierr.Invalidf("node name: %v", err))
	}
	if err := pki.CheckNodeName(name); err != nil {
		return refuse(apierr.Invalidf("node name: %v", err))
	}
	if _, err := pki.ParseCSR([]byte(req.GetCsrPem())); err != nil {
		return refuse(apierr.Invalidf("csr_pem: %v", err))
	}
	via := "join"
	var commit func(context.Context) error
	switch {
	case p.Role == authv1.Role_ROLE_ADMIN:
	case p.Role == authv1.Role_ROLE_NODE && p.ID == "":
		if p.Subject != name {
			return refuse(apierr.PermissionDeniedf("the certificate of node %q may renew only its own name, not %q", p.Subject, name))
		}
		via = "renew"
	case p.Role == authv1.Role_ROLE_NODE:
		claim, err := s.tokens.ClaimToken(ctx, p.ID)
		if errors.Is(err, auth.ErrUnauthenticated) {
			s.log.Info("join refused", "node", name, "token_id", p.ID, "reason", err.Error())
			return nil, status.Error(codes.Unauthenticated, err.Error())
		}
		if err != nil {
			return nil, err
		}
		if bound := claim.Token.GetNode(); bound != "" && bound != name {
			return refuse(apierr.PermissionDeniedf("this node token is bound to node %q, not %q", bound, name))
		}
		if why, err := s.nodeNameTaken(ctx, name); err != nil {
			return nil, err
		} else if why != "" {
			return refuse(apierr.PermissionDeniedf("node %q already exists (%s): a token joins only a new name; the node renews with its own certificate, or an admin re-joins it", name, why))
		}
		commit = func(ctx context.Context) error {
			if err := s.tokens.Consume(ctx, claim); errors.Is(err, auth.ErrUnauthenticated) {
				return status.Error(codes.Unauthenticated, err.Error())
			} else if err != nil {
				return err
			}
			return nil
		}
	default:
		return refuse(apierr.PermissionDeniedf("%s may not Join", p.Role))
	}
	certPEM, err := s.issueNodeCert(ctx, name, []byte(req.GetCsrPem()), via, commit)
	if err != nil {
		if status.Code(err) == codes.Unauthenticated || errors.Is(err, apierr.ErrInvalid) {
			return refuse(err)
		}
		return nil, err
	}
	s.log.Info("node joined: certificate issued", "node", name, "via", via, "token_id", p.ID, "role", p.Role.String())
	return &nodev1.JoinResponse{CertPem: string(certPEM), CaCertPem: string(s.ca.CertPEM())}, nil
}

// nodeNameTaken says why name is not new ("" when it is): a node in the
// pool, a machine of the inventory (machines get their certificate from
// their install), or certificates on record.
func (s *Server) nodeNameTaken(ctx context.Context, name string) (string, error) {
	if _, err := s.pool.GetNode(ctx, name); err == nil {
		return "a node in the pool", nil
	} else if !errors.Is(err, apierr.ErrNotFound) {
		return "", fmt.Errorf("join %q: %w", name, err)
	}
	if _, err := s.inv.GetMachine(ctx, name); err == nil {
		return "a machine of the inventory", nil
	} else if !errors.Is(err, apierr.ErrNotFound) {
		return "", fmt.Errorf("join %q: %w", name, err)
	}
	issued, err := s.revocations.Issued(ctx, name)
	if err != nil {
		return "", fmt.Errorf("join %q: %w", name, err)
	}
	if len(issued) > 0 {
		return fmt.Sprintf("%d certificate(s) issued", len(issued)), nil
	}
	return "", nil
}

// nodeIdentity is a unary interceptor: a NODE principal may apply and read
// only the Node its certificate names, and never with a token (a node
// token is for Join only). Listing and watching nodes are not a node's
// (the methods' access options leave NODE out), so a node certificate
// sees its own record and nothing of the others (docs/security.md, "Node
// certificates read their own node only").
func nodeIdentity() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if err := checkNodeScope(ctx, info.FullMethod, req); err != nil {
			return nil, apierr.ToStatus(err)
		}
		return h(ctx, req)
	}
}

// nodeScoped are the NodeService methods a NODE principal may call, each
// for its own node only, and what it does there.
var nodeScoped = map[string]string{
	"/corral.pool.v1.NodeService/ApplyNode": "apply",
	"/corral.pool.v1.NodeService/GetNode":   "read",
}

// checkNodeScope refuses, with an apierr.ErrPermissionDenied error, an
// ApplyNode or GetNode by a NODE principal that used a token or names
// another node.
func checkNodeScope(ctx context.Context, method string, req any) error {
	verb, scoped := nodeScoped[method]
	if !scoped {
		return nil
	}
	p, ok := auth.FromContext(ctx)
	if !ok || p.Role != authRoleNode {
		return nil
	}
	name := ""
	if r, ok := req.(interface{ GetName() string }); ok {
		name = r.GetName()
	}
	if p.ID != "" {
		return apierr.PermissionDeniedf("a node token may only be used to Join; %s needs the node's certificate", path.Base(method))
	}
	if p.Subject != name {
		return apierr.PermissionDeniedf("node certificate %q may not %s node %q: a node certificate reads and applies its own node only", p.Subject, verb, name)
	}
	return nil
}
