package server

import (
	"context"

	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/auth"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/inventory"
	"google.golang.org/grpc"
)

// join serves AgentService.Join: a caller holding a node token (or admin)
// exchanges a certificate request for a node identity signed by the CA
// (CN = node name, O = corral:node, server and client usages).
func (s *Server) join(ctx context.Context, req *nodev1.JoinRequest) (*nodev1.JoinResponse, error) {
	if err := inventory.CheckName(req.GetName()); err != nil {
		return nil, apierr.Invalidf("node name: %v", err)
	}
	p, _ := auth.FromContext(ctx)
	certPEM, err := s.signNodeCert(ctx, req.GetName(), []byte(req.GetCsrPem()), "join")
	if err != nil {
		return nil, apierr.Invalidf("%v", err)
	}
	s.log.Info("node joined: certificate issued", "node", req.GetName(), "token_id", p.ID, "role", p.Role.String())
	return &nodev1.JoinResponse{CertPem: string(certPEM), CaCertPem: string(s.ca.CertPEM())}, nil
}

// nodeIdentity is a unary interceptor: a NODE principal may apply only the
// Node its certificate names, and never with a token (a node token is for
// Join only).
func nodeIdentity() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if err := checkNodeApply(ctx, info.FullMethod, req); err != nil {
			return nil, apierr.ToStatus(err)
		}
		return h(ctx, req)
	}
}

// checkNodeApply refuses, with an apierr.ErrPermissionDenied error, an
// ApplyNode by a NODE principal that used a token or names another node.
func checkNodeApply(ctx context.Context, method string, req any) error {
	const applyNode = "/corral.pool.v1.NodeService/ApplyNode"
	if method != applyNode {
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
		return apierr.PermissionDeniedf("a node token may only be used to Join; ApplyNode needs the node's certificate")
	}
	if p.Subject != name {
		return apierr.PermissionDeniedf("node certificate %q may not apply node %q", p.Subject, name)
	}
	return nil
}
