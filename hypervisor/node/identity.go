package node

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/internal/nodeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// Identity is the node's TLS identity: its certificate and the CA it
// trusts (the appliance's).
type Identity struct {
	Certificate tls.Certificate
	CAPool      *x509.CertPool
	CAPEM       []byte
}

// EnrolConfig configures Enrol.
type EnrolConfig struct {
	// Name is the node name (certificate CommonName and DNS SAN).
	Name    string
	DataDir string
	// Join is the appliance's host:port.
	Join string
	// Token is a bearer token with the node role (corrald token create
	// --role node); it is used only when no identity is stored yet.
	Token string
	// CACertPEM is the appliance CA the node trusts (--ca-cert).
	CACertPEM []byte
	// Hosts are extra SANs (addresses the appliance dials the node on).
	Hosts []string
	// Timeout bounds the Join call (default 30 s).
	Timeout time.Duration
	// DialOptions are appended (tests).
	DialOptions []grpc.DialOption
}

// Enrol returns the node identity stored in DataDir/identity, or, when
// there is none, creates a key and a CSR, exchanges them for a certificate
// with AgentService.Join (authenticated by the token, over TLS verified
// against CACertPEM), checks that the certificate chains to that CA and
// matches the key, and stores key, certificate and CA (key first, each
// written atomically). A stored identity that no longer verifies against
// CACertPEM is an error (the operator removes DataDir/identity to
// re-enrol): it is never replaced silently.
func Enrol(ctx context.Context, cfg EnrolConfig) (Identity, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(cfg.CACertPEM) {
		return Identity{}, errors.New("node: enrol: CA certificate: no PEM certificate found")
	}
	dir := filepath.Join(cfg.DataDir, nodeid.Dir)
	if id, err := loadIdentity(dir, pool, cfg.CACertPEM); err == nil {
		return id, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return Identity{}, fmt.Errorf("node: stored identity in %s: %w", dir, err)
	}
	if cfg.Name == "" || cfg.Join == "" || cfg.Token == "" {
		return Identity{}, errors.New("node: enrol: name, join address and token are required for the first start")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Identity{}, err
	}
	tmpl := &x509.CertificateRequest{Subject: pkix.Name{CommonName: cfg.Name}, DNSNames: []string{cfg.Name}}
	for _, h := range cfg.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" && h != cfg.Name {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		return Identity{}, err
	}
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})),
		grpc.WithPerRPCCredentials(bearer(cfg.Token)),
	}, cfg.DialOptions...)
	conn, err := grpc.NewClient(cfg.Join, opts...)
	if err != nil {
		return Identity{}, fmt.Errorf("node: enrol: %w", err)
	}
	defer conn.Close()
	jctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := nodev1.NewAgentServiceClient(conn).Join(jctx, &nodev1.JoinRequest{
		Name: cfg.Name, CsrPem: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csr})),
	})
	if err != nil {
		return Identity{}, fmt.Errorf("node: enrol: join %s: %w", cfg.Join, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Identity{}, err
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	certPEM := []byte(resp.GetCertPem())
	id, err := makeIdentity(certPEM, keyPEM, pool, cfg.CACertPEM)
	if err != nil {
		return Identity{}, fmt.Errorf("node: enrol: certificate from %s: %w", cfg.Join, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Identity{}, err
	}
	for _, f := range []struct {
		name string
		data []byte
	}{{nodeid.KeyFile, keyPEM}, {nodeid.CertFile, certPEM}, {nodeid.CAFile, cfg.CACertPEM}} {
		if err := writeFileAtomic(filepath.Join(dir, f.name), f.data); err != nil {
			return Identity{}, fmt.Errorf("node: enrol: store %s: %w", f.name, err)
		}
	}
	return id, nil
}

func loadIdentity(dir string, pool *x509.CertPool, caPEM []byte) (Identity, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, nodeid.CertFile))
	if err != nil {
		return Identity{}, err
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, nodeid.KeyFile))
	if err != nil {
		return Identity{}, err
	}
	return makeIdentity(certPEM, keyPEM, pool, caPEM)
}

func makeIdentity(certPEM, keyPEM []byte, pool *x509.CertPool, caPEM []byte) (Identity, error) {
	tc, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return Identity{}, err
	}
	// Leaf is nil when the binary runs with GODEBUG x509keypairleaf=0
	// (gobusybox builds in the images take an older go directive).
	if tc.Leaf == nil {
		if tc.Leaf, err = x509.ParseCertificate(tc.Certificate[0]); err != nil {
			return Identity{}, err
		}
	}
	if _, err := tc.Leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return Identity{}, fmt.Errorf("does not chain to the appliance CA: %w", err)
	}
	return Identity{Certificate: tc, CAPool: pool, CAPEM: caPEM}, nil
}

type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (bearer) RequireTransportSecurity() bool { return true }

// DialOptions returns the gRPC options for calling the appliance as this
// node: TLS trusting only the appliance CA and presenting the node
// certificate (the appliance's interceptor then sees a NODE principal).
// With them, poolv1.NewNodeServiceClient(conn) is a Registry for Run.
func (id Identity) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: id.CAPool, Certificates: []tls.Certificate{id.Certificate}, MinVersion: tls.VersionTLS12,
	}))}
}
