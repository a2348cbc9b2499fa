package appliance

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strconv"
	"sync"

	hypervisorv1 "github.com/corralhq/corral/api/hypervisor/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/inventory/pool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// DefaultHypervisorPort is used when a Node has no hypervisor_port.
const DefaultHypervisorPort = 20181

// MTLSDialer is the production NodeDialer: it reads the node's address and
// hypervisor_port from the pool and keeps one gRPC client connection per
// node (grpc.NewClient connects lazily and reconnects by itself). A node
// whose address or port changes gets a new connection.
//
// TLS must carry the appliance's client certificate and the CA that signed
// the nodes' certificates. When TLS.ServerName is empty, the node's name is
// the expected server name, so node certificates must carry their node name
// as a DNS SAN.
//
// It is safe for concurrent use. Close closes every connection.
type MTLSDialer struct {
	Pool *pool.Pool
	TLS  *tls.Config

	mu    sync.Mutex
	conns map[string]*nodeConn
}

type nodeConn struct {
	target string
	conn   *grpc.ClientConn
	client hypervisorv1.HypervisorServiceClient
}

// Hypervisor returns the client for nodeName. It fails with a NotFound
// class error for an unknown node and an Invalid one for a node without an
// address; it does not wait for the connection to come up.
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
	defer d.mu.Unlock()
	if c, ok := d.conns[nodeName]; ok {
		if c.target == target {
			return c.client, nil
		}
		_ = c.conn.Close()
		delete(d.conns, nodeName)
	}
	cfg := d.TLS.Clone()
	if cfg.ServerName == "" {
		cfg.ServerName = nodeName
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		return nil, err
	}
	if d.conns == nil {
		d.conns = map[string]*nodeConn{}
	}
	c := &nodeConn{target: target, conn: conn, client: hypervisorv1.NewHypervisorServiceClient(conn)}
	d.conns[nodeName] = c
	return c.client, nil
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
