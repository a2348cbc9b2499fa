package appliance

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	hypervisorv1 "github.com/corralhq/corral/api/hypervisor/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/internal/nodeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// DefaultHypervisorPort is used when a Node has no hypervisor_port.
const DefaultHypervisorPort = 20181

// checkTimeout bounds one CheckCert call made during a handshake.
const checkTimeout = 5 * time.Second

// MTLSDialer is the production NodeDialer: it reads the node's address and
// hypervisor_port from the pool and keeps one gRPC client connection per
// node (grpc.NewClient connects lazily and reconnects by itself). A node
// whose address or port changes gets a new connection.
//
// TLS must carry the appliance's client certificate (Certificates or
// GetClientCertificate) and the CA that signed the nodes' certificates.
// When TLS.ServerName is empty, the node's name is the expected server
// name (node certificates carry their name as their one DNS SAN). Beyond
// the chain, the server must present a node certificate (Organization
// nodeid.Organization) whose CommonName is exactly the node's name, and
// CheckCert must accept it: at every handshake, and on every Hypervisor
// call for the certificate the cached connection was made with, so a node
// revoked after the handshake is not called again. A connection whose
// node certificate has expired is re-made (the node renews its own).
//
// It is safe for concurrent use. Close closes every connection.
type MTLSDialer struct {
	Pool NodeGetter
	TLS  *tls.Config
	// CheckCert, when set, says whether a node's verified certificate may
	// still be trusted (the appliance's revocation list); an error refuses
	// the node.
	CheckCert func(ctx context.Context, cert *x509.Certificate) error

	mu    sync.Mutex
	conns map[string]*nodeConn
}

type nodeConn struct {
	target string
	conn   *grpc.ClientConn
	client hypervisorv1.HypervisorServiceClient
	// leaf is the node certificate of the latest handshake.
	leaf atomic.Pointer[x509.Certificate]
}

// Hypervisor returns the client for nodeName. It fails with a NotFound
// class error for an unknown node, an Invalid one for a node without an
// address and a PermissionDenied one for a node whose certificate
// CheckCert refuses; it does not wait for the connection to come up.
func (d *MTLSDialer) Hypervisor(ctx context.Context, nodeName string) (hypervisorv1.HypervisorServiceClient, error) {
	if d.Pool == nil || d.TLS == nil {
		return nil, errors.New("appliance: MTLSDialer needs Pool and TLS")
	}
	n, err := d.Pool.GetNode(ctx, nodeName)
	if err != nil {
		return nil, err
	}
	host := n.GetAddress()
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if host == "" {
		return nil, apierr.Invalidf("node %q has no address", nodeName)
	}
	port := int(n.GetHypervisorPort())
	if port == 0 {
		port = DefaultHypervisorPort
	}
	target := net.JoinHostPort(host, strconv.Itoa(port))

	d.mu.Lock()
	c, ok := d.conns[nodeName]
	if ok && c.target != target {
		_ = c.conn.Close()
		delete(d.conns, nodeName)
		ok = false
	}
	d.mu.Unlock()
	if ok {
		leaf := c.leaf.Load()
		switch {
		case leaf == nil:
			return c.client, nil // not connected yet: the handshake checks
		case time.Now().After(leaf.NotAfter):
			d.drop(nodeName, c) // its certificate expired: handshake again
		default:
			if err := d.check(ctx, leaf); err != nil {
				d.drop(nodeName, c)
				return nil, apierr.PermissionDeniedf("node %q is not trusted any more: %v", nodeName, err)
			}
			return c.client, nil
		}
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	if c, ok := d.conns[nodeName]; ok && c.target == target {
		return c.client, nil // another caller made it meanwhile
	}
	c = &nodeConn{target: target}
	cfg := d.TLS.Clone()
	if cfg.ServerName == "" {
		cfg.ServerName = nodeName
	}
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
			return fmt.Errorf("node %q: the server's certificate was not verified", nodeName)
		}
		leaf := cs.VerifiedChains[0][0]
		if !slices.Contains(leaf.Subject.Organization, nodeid.Organization) || leaf.Subject.CommonName != nodeName {
			return fmt.Errorf("node %q presented a certificate for %q (organization %v), not its node certificate",
				nodeName, leaf.Subject.CommonName, leaf.Subject.Organization)
		}
		cctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
		defer cancel()
		if err := d.check(cctx, leaf); err != nil {
			return fmt.Errorf("node %q: %w", nodeName, err)
		}
		c.leaf.Store(leaf)
		return nil
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		return nil, err
	}
	if d.conns == nil {
		d.conns = map[string]*nodeConn{}
	}
	c.conn, c.client = conn, hypervisorv1.NewHypervisorServiceClient(conn)
	d.conns[nodeName] = c
	return c.client, nil
}

func (d *MTLSDialer) check(ctx context.Context, leaf *x509.Certificate) error {
	if d.CheckCert == nil {
		return nil
	}
	return d.CheckCert(ctx, leaf)
}

// drop closes c if it is still nodeName's connection.
func (d *MTLSDialer) drop(nodeName string, c *nodeConn) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.conns[nodeName] == c {
		_ = c.conn.Close()
		delete(d.conns, nodeName)
	}
}

// Close closes every cached connection; the dialer stays usable.
func (d *MTLSDialer) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var errs []error
	for name, c := range d.conns {
		errs = append(errs, c.conn.Close())
		delete(d.conns, name)
	}
	return errors.Join(errs...)
}
