package clientconfig

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// DialOptions returns the gRPC options that connect to c.Endpoint: TLS
// transport credentials that trust only c.CACert (or the system trust
// store when CACert is empty) and, with c.CACert, require the server's
// certificate to be the appliance's (VerifyAppliance: a node
// certificate from the same CA is refused); and, when c.Token is set,
// per-RPC credentials that send "authorization: Bearer <token>" and refuse
// to do so over an insecure transport. It returns an error if c is nil, CACert contains no
// parsable PEM certificate, or the system trust store cannot be loaded.
func (c *Config) DialOptions() ([]grpc.DialOption, error) {
	if c == nil {
		return nil, errors.New("clientconfig: nil config")
	}
	pool, err := c.certPool()
	if err != nil {
		return nil, fmt.Errorf("clientconfig: %w", err)
	}
	tlsConf := &tls.Config{
		RootCAs:    pool,
		MinVersion: tls.VersionTLS12,
	}
	if c.CACert != "" {
		// The appliance CA also signs node certificates: only the
		// appliance's own carries its identity.
		tlsConf.VerifyConnection = VerifyApplianceConnection
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tlsConf))}
	if c.Token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearerToken(c.Token)))
	}
	return opts, nil
}

// Dial creates a client connection to cfg.Endpoint with cfg.DialOptions()
// followed by extra, using grpc.NewClient (so no I/O happens until the
// first RPC). It returns an error if cfg is nil, has no endpoint, its
// options cannot be built, or grpc.NewClient rejects the target.
func Dial(cfg *Config, extra ...grpc.DialOption) (*grpc.ClientConn, error) {
	if cfg == nil {
		return nil, errors.New("clientconfig: nil config")
	}
	if cfg.Endpoint == "" {
		return nil, errors.New("clientconfig: endpoint is required")
	}
	opts, err := cfg.DialOptions()
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(cfg.Endpoint, append(opts, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("clientconfig: dial %s: %w", cfg.Endpoint, err)
	}
	return conn, nil
}

// certPool returns the pool to verify the server against.
func (c *Config) certPool() (*x509.CertPool, error) {
	if c.CACert == "" {
		pool, err := x509.SystemCertPool()
		if err != nil {
			return nil, fmt.Errorf("load system trust store: %w", err)
		}
		return pool, nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(c.CACert)) {
		return nil, errors.New("ca_cert contains no PEM certificate")
	}
	return pool, nil
}

// bearerToken implements credentials.PerRPCCredentials.
type bearerToken string

var _ credentials.PerRPCCredentials = bearerToken("")

func (t bearerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

func (bearerToken) RequireTransportSecurity() bool { return true }
