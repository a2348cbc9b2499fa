package appliance

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/corralhq/corral/auth/pki"
	hvappliance "github.com/corralhq/corral/hypervisor/appliance"
	"github.com/corralhq/corral/inventory/pool"
)

// applianceClientCN names the appliance in the client certificate it
// presents to hypervisor nodes.
const applianceClientCN = "corral-appliance"

// initHypervisor wires the BlockStorage, VirtualMachine and Image services
// and their reconciler. The appliance dials each node's HypervisorService
// over mutual TLS with a client certificate issued by its own CA, renewed
// in memory at two thirds of its lifetime (no restart), and refuses a node
// whose certificate is revoked.
func (s *Server) initHypervisor(p *pool.Pool) error {
	certs := &clientCerts{ca: s.ca, cn: applianceClientCN, validity: s.cfg.PKI.ApplianceClientCertValidity, log: s.log}
	if _, err := certs.get(nil); err != nil {
		return fmt.Errorf("appliance client certificate: %w", err)
	}
	dialer := &hvappliance.MTLSDialer{
		Pool: p,
		TLS: &tls.Config{
			GetClientCertificate: certs.get,
			RootCAs:              s.ca.Pool(),
			MinVersion:           tls.VersionTLS12,
		},
		CheckCert: s.revocations.Check,
	}
	svc, err := hvappliance.New(hvappliance.Config{
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
	hvappliance.Register(s.grpc, svc)
	s.vms = svc
	s.addSingleton("reconciler", svc.Run)
	s.addComponent("node-dialer", func(ctx context.Context) error {
		<-ctx.Done()
		return dialer.Close()
	})
	return nil
}

// clientCerts is the appliance's client certificate for dialling nodes: it
// is issued on first use and reissued, from the CA in memory, once two
// thirds of its lifetime have passed, so every new handshake carries a
// certificate with a third of its lifetime left. get is a
// tls.Config.GetClientCertificate; it is safe for concurrent use.
type clientCerts struct {
	ca       *pki.CA
	cn       string
	validity time.Duration
	log      *slog.Logger
	now      func() time.Time // nil: time.Now

	mu      sync.Mutex
	cert    *tls.Certificate
	renewAt time.Time
}

func (c *clientCerts) get(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	now := time.Now()
	if c.now != nil {
		now = c.now()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cert != nil && now.Before(c.renewAt) {
		return c.cert, nil
	}
	certPEM, keyPEM, err := c.ca.IssueClientCert(c.cn, c.validity)
	if err != nil {
		if c.cert != nil && now.Before(c.cert.Leaf.NotAfter) {
			// Keep the old one while it lasts; try again next handshake.
			c.log.Error("appliance client certificate renewal failed; keeping the current one", "err", err,
				"not_after", c.cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
			return c.cert, nil
		}
		return nil, err
	}
	tc, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	if tc.Leaf == nil {
		if tc.Leaf, err = x509.ParseCertificate(tc.Certificate[0]); err != nil {
			return nil, err
		}
	}
	renewed := c.cert != nil
	c.cert = &tc
	// NotBefore is backdated for clock skew: count the lifetime from now.
	c.renewAt = now.Add(tc.Leaf.NotAfter.Sub(now) * 2 / 3)
	if renewed {
		c.log.Info("appliance client certificate renewed", "serial", pki.Serial(tc.Leaf),
			"not_after", tc.Leaf.NotAfter.UTC().Format(time.RFC3339), "renew_at", c.renewAt.UTC().Format(time.RFC3339))
	}
	return c.cert, nil
}
