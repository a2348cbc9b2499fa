package server

import "google.golang.org/grpc"

// MetricsConfig configures /metrics, /healthz and /readyz.
type MetricsConfig struct {
	// Listen is the metrics and health HTTP listen address ("" = off).
	Listen string
}

// observability holds the Prometheus registry and collectors.
type observability struct{}

// initObservability creates the registry and collectors, before the gRPC
// server exists.
func (s *Server) initObservability() error { return nil }

// metricsInterceptors are the gRPC server metrics middleware (nil = off).
func (s *Server) metricsInterceptors() (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	return nil, nil
}

// initHealth sets the gRPC health of each service and adds the metrics and
// health HTTP listener; it runs last in New.
func (s *Server) initHealth() error { return nil }
