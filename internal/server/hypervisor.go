package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"time"

	"github.com/corralhq/corral/hypervisor/appliance"
	"github.com/corralhq/corral/inventory/pool"
)

// applianceClientCN names the appliance in the client certificate it
// presents to hypervisor nodes.
const applianceClientCN = "corral-appliance"

// initHypervisor wires the BlockStorage, VirtualMachine and Image services
// and their reconciler. The appliance dials each node's HypervisorService
// over mutual TLS with a client certificate issued by its own CA at start.
func (s *Server) initHypervisor(p *pool.Pool) error {
	certPEM, keyPEM, err := s.ca.IssueClientCert(applianceClientCN, 30*24*time.Hour)
	if err != nil {
		return fmt.Errorf("appliance client certificate: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("appliance client certificate: %w", err)
	}
	dialer := &appliance.MTLSDialer{Pool: p, TLS: &tls.Config{
		Certificates: []tls.Certificate{cert},
		RootCAs:      s.ca.Pool(),
		MinVersion:   tls.VersionTLS12,
	}}
	svc, err := appliance.New(appliance.Config{
		Store:  s.store,
		Pool:   p,
		Nodes:  dialer,
		Logger: s.log.With("component", "appliance"),
		// ReconcileInterval 0 takes appliance's default.
		ReconcileInterval: s.cfg.Lifecycle.HypervisorReconcileInterval,
	})
	if err != nil {
		return err
	}
	appliance.Register(s.grpc, svc)
	s.addComponent("reconciler", func(ctx context.Context) error {
		defer dialer.Close()
		return svc.Run(ctx)
	})
	return nil
}
