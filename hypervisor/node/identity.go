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
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/corralhq/corral/api/clientconfig"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/hypervisor/internal/durable"
	"github.com/corralhq/corral/internal/nodeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// Identity is the node's TLS identity: its certificate and the CA it
// trusts (the appliance's). Copies share the current certificate, which
// Renew replaces: serve with GetCertificate and dial with DialOptions to
// always present it.
type Identity struct {
	// Certificate is the certificate as loaded or enrolled; Current is
	// the one to present after a renewal.
	Certificate tls.Certificate
	CAPool      *x509.CertPool
	CAPEM       []byte

	state *identityState // nil for an Identity built by hand
}

// identityState is shared by copies of an Identity.
type identityState struct {
	dir string
	cur atomic.Pointer[tls.Certificate]
	gen atomic.Uint64 // counts renewals
}

// Renewed-identity files, written next to the identity before they
// replace it: a crash between the two renames leaves a new key beside the
// old certificate and node.crt.new, which loadIdentity completes.
const (
	nextKeyFile  = nodeid.KeyFile + ".new"
	nextCertFile = nodeid.CertFile + ".new"
)

// EnrolConfig configures Enrol.
type EnrolConfig struct {
	// Name is the node name (certificate CommonName and only DNS SAN: the
	// appliance decides the SANs and dials the node by name).
	Name    string
	DataDir string
	// Join is the appliance's host:port.
	Join string
	// Appliances, when set, are the fleet's appliances the Join call goes
	// along (failing over as Appliances says), instead of Join.
	Appliances *Appliances
	// Token is a bearer token with the node role (corrald token create
	// --role node); it is used only when no identity is stored yet, and
	// the appliance consumes it.
	Token string
	// CACertPEM is the appliance CA the node trusts (--ca-cert).
	CACertPEM []byte
	// Timeout bounds the Join call (default 30 s).
	Timeout time.Duration
	// DialOptions are appended (tests).
	DialOptions []grpc.DialOption
}

// Enrol returns the node identity stored in DataDir/identity, or, when
// there is none, creates a key and a CSR, exchanges them for a certificate
// with AgentService.Join (authenticated by the token, over TLS verified
// against CACertPEM and the appliance identity), checks that the
// certificate chains to that CA and matches the key, and stores key,
// certificate and CA (key first, each written atomically). A stored
// identity that no longer verifies against CACertPEM is an error (the
// operator removes DataDir/identity to re-enrol): it is never replaced
// silently.
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
	apps := cfg.Appliances
	if apps == nil && cfg.Join != "" {
		apps = single(cfg.Join)
	}
	if cfg.Name == "" || apps == nil || cfg.Token == "" {
		return Identity{}, errors.New("node: enrol: name, join address and token are required for the first start")
	}
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(applianceTLS(pool, nil))),
		grpc.WithPerRPCCredentials(bearer(cfg.Token)),
	}, cfg.DialOptions...)
	var certPEM, keyPEM []byte
	var from string
	err := apps.do(ctx, "join", func(ep string) (err error) {
		from = ep
		certPEM, keyPEM, err = join(ctx, ep, cfg.Name, cfg.Timeout, opts)
		return err
	})
	if err != nil {
		return Identity{}, fmt.Errorf("node: enrol: %w", err)
	}
	id, err := makeIdentity(certPEM, keyPEM, pool, cfg.CACertPEM)
	if err != nil {
		return Identity{}, fmt.Errorf("node: enrol: certificate from %s: %w", from, err)
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
	id.state.dir = dir
	return id, nil
}

// join makes a key and a request for name and exchanges it through
// AgentService.Join at target with opts (a token, or the current
// certificate). It returns the certificate and the key in PEM.
func join(ctx context.Context, target, name string, timeout time.Duration, opts []grpc.DialOption) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	// The appliance decides subject and SANs; the request carries the key.
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: name}}, key)
	if err != nil {
		return nil, nil, err
	}
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		return nil, nil, err
	}
	defer conn.Close()
	jctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := nodev1.NewAgentServiceClient(conn).Join(jctx, &nodev1.JoinRequest{
		Name: name, CsrPem: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csr})),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("join %s: %w", target, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return []byte(resp.GetCertPem()), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}

// loadIdentity reads the stored pair, first completing a renewal that a
// crash interrupted between its two renames.
func loadIdentity(dir string, pool *x509.CertPool, caPEM []byte) (Identity, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, nodeid.CertFile))
	if err != nil {
		return Identity{}, err
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, nodeid.KeyFile))
	if err != nil {
		return Identity{}, err
	}
	id, err := makeIdentity(certPEM, keyPEM, pool, caPEM)
	if err != nil {
		next, nerr := os.ReadFile(filepath.Join(dir, nextCertFile))
		if nerr != nil {
			return Identity{}, err
		}
		if id, nerr = makeIdentity(next, keyPEM, pool, caPEM); nerr != nil {
			return Identity{}, err
		}
		if err := rename(dir, nextCertFile, nodeid.CertFile); err != nil {
			return Identity{}, err
		}
	}
	id.state.dir = dir
	return id, nil
}

// rename renames from to to inside dir and syncs dir, so the rename
// survives a power cut.
func rename(dir, from, to string) error {
	if err := os.Rename(filepath.Join(dir, from), filepath.Join(dir, to)); err != nil {
		return err
	}
	return durable.SyncDir(dir)
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
	id := Identity{Certificate: tc, CAPool: pool, CAPEM: caPEM, state: &identityState{}}
	id.state.cur.Store(&tc)
	return id, nil
}

// Current returns the certificate to present now: the latest renewal's,
// or Certificate.
func (id Identity) Current() *tls.Certificate {
	if id.state != nil {
		if c := id.state.cur.Load(); c != nil {
			return c
		}
	}
	return &id.Certificate
}

// GetCertificate is a tls.Config.GetCertificate presenting Current (the
// node's HypervisorService: Config.GetCertificate).
func (id Identity) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return id.Current(), nil
}

// getClientCertificate is a tls.Config.GetClientCertificate presenting
// Current.
func (id Identity) getClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return id.Current(), nil
}

type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (bearer) RequireTransportSecurity() bool { return true }

// applianceTLS is the configuration every dial of the appliance uses: the
// appliance CA as the only root, and the server must be the appliance
// (clientconfig.VerifyApplianceConnection: another node's certificate chains to
// the same CA but is refused).
func applianceTLS(pool *x509.CertPool, getCert func(*tls.CertificateRequestInfo) (*tls.Certificate, error)) *tls.Config {
	return &tls.Config{
		RootCAs: pool, GetClientCertificate: getCert, MinVersion: tls.VersionTLS12,
		VerifyConnection: clientconfig.VerifyApplianceConnection,
	}
}

// DialOptions returns the gRPC options for calling the appliance as this
// node: TLS trusting only the appliance CA, accepting only the appliance's
// own certificate, and presenting the node's current certificate at each
// handshake (the appliance's interceptor then sees a NODE principal).
// A connection keeps the certificate of its handshake: use Registry for a
// connection that follows renewals.
func (id Identity) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(applianceTLS(id.CAPool, id.getClientCertificate)))}
}

// RenewConfig configures Renew.
type RenewConfig struct {
	// Join is the appliance's host:port.
	Join string
	// Appliances, when set, are the fleet's appliances renewals go along
	// (failing over as Appliances says), instead of Join.
	Appliances *Appliances
	// Retry is the wait after a failed renewal (default 1 min, never past
	// the certificate's expiry).
	Retry time.Duration
	// Timeout bounds one Join call (default 30 s).
	Timeout time.Duration
	// Logger receives one line per renewal and per failure; nil discards.
	Logger *slog.Logger
	// DialOptions are appended (tests).
	DialOptions []grpc.DialOption
}

// renewAt is when a certificate is renewed: at two thirds of its lifetime.
func renewAt(c *x509.Certificate) time.Time {
	return c.NotBefore.Add(c.NotAfter.Sub(c.NotBefore) * 2 / 3)
}

// Renew keeps the identity fresh until ctx ends, then returns nil: at two
// thirds of the current certificate's lifetime it makes a new key and
// request and calls AgentService.Join presenting the current certificate
// (the appliance lets a node certificate renew its own name), checks the
// answer, stores the pair (node.key.new and node.crt.new, then renamed
// over the identity, key first; loadIdentity completes an interrupted
// rename) and makes it Current. A failure is logged and retried every
// Retry. Renewal needs an identity from Enrol.
func (id Identity) Renew(ctx context.Context, cfg RenewConfig) error {
	if id.state == nil || id.state.dir == "" {
		return errors.New("node: renew: the identity was not loaded from a data directory")
	}
	if cfg.Appliances == nil {
		if cfg.Join == "" {
			return errors.New("node: renew: no appliance to join")
		}
		cfg.Appliances = single(cfg.Join)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	retry := cfg.Retry
	if retry <= 0 {
		retry = time.Minute
	}
	for {
		cur := id.Current().Leaf
		wait := time.Until(renewAt(cur))
		if wait > 0 {
			log.Debug("node certificate renewal scheduled", "at", renewAt(cur).UTC().Format(time.RFC3339))
			if !sleep(ctx, wait) {
				return nil
			}
		}
		if err := id.renewOnce(ctx, cfg); err != nil {
			select {
			case <-ctx.Done():
				return nil // stopped, as documented: the failure is the stop
			default:
			}
			left := time.Until(cur.NotAfter)
			log.Warn("node certificate renewal failed; retrying", "err", err, "retry_in", retry.String(),
				"expires_in", left.Round(time.Second).String())
			if !sleep(ctx, retry) {
				return nil
			}
			continue
		}
		n := id.Current().Leaf
		log.Info("node certificate renewed", "serial", n.SerialNumber.Text(16),
			"not_after", n.NotAfter.UTC().Format(time.RFC3339))
		if time.Until(renewAt(n)) <= 0 {
			// A certificate due at once (a very short validity): do not
			// spin on Join.
			log.Warn("renewed node certificate is already due for renewal; waiting", "retry_in", retry.String())
			if !sleep(ctx, retry) {
				return nil
			}
		}
	}
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// renewOnce renews the certificate now.
func (id Identity) renewOnce(ctx context.Context, cfg RenewConfig) error {
	cur := id.Current()
	name := cur.Leaf.Subject.CommonName
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(applianceTLS(id.CAPool, id.getClientCertificate))),
	}, cfg.DialOptions...)
	var certPEM, keyPEM []byte
	var from string
	err := cfg.Appliances.do(ctx, "renew", func(ep string) (err error) {
		from = ep
		certPEM, keyPEM, err = join(ctx, ep, name, cfg.Timeout, opts)
		return err
	})
	if err != nil {
		return err
	}
	next, err := makeIdentity(certPEM, keyPEM, id.CAPool, id.CAPEM)
	if err != nil {
		return fmt.Errorf("renewed certificate from %s: %w", from, err)
	}
	if got := next.Certificate.Leaf.Subject.CommonName; got != name {
		return fmt.Errorf("renewed certificate from %s is for %q, not %q", from, got, name)
	}
	dir := id.state.dir
	for _, f := range []struct {
		name string
		data []byte
	}{{nextKeyFile, keyPEM}, {nextCertFile, certPEM}} {
		if err := writeFileAtomic(filepath.Join(dir, f.name), f.data); err != nil {
			return fmt.Errorf("store renewed %s: %w", f.name, err)
		}
	}
	for _, f := range []struct{ from, to string }{{nextKeyFile, nodeid.KeyFile}, {nextCertFile, nodeid.CertFile}} {
		if err := rename(dir, f.from, f.to); err != nil {
			return fmt.Errorf("store renewed %s: %w", f.to, err)
		}
	}
	id.state.cur.Store(&next.Certificate)
	id.state.gen.Add(1)
	return nil
}

// ApplianceRegistry is a poolv1 NodeService client on the fleet's
// appliances (a Registry for Config.Registry) that presents the
// identity's current certificate: its connection is re-made after each
// renewal, so the appliance never sees a certificate older than the
// latest, and when the appliance does not answer ApplyNode goes to the
// next one (Appliances). Safe for concurrent use; Close it when done.
type ApplianceRegistry struct {
	id   Identity
	apps *Appliances
	opts []grpc.DialOption

	mu     sync.Mutex
	gen    uint64
	target string // the appliance conn is to
	conn   *grpc.ClientConn
	client poolv1.NodeServiceClient
}

// Registry returns an ApplianceRegistry for the appliance at target
// (host:port); opts are appended to DialOptions (tests). It connects
// lazily, so it fails only for a target grpc.NewClient refuses.
func (id Identity) Registry(target string, opts ...grpc.DialOption) (*ApplianceRegistry, error) {
	return id.RegistryOn(single(target), opts...)
}

// RegistryOn returns an ApplianceRegistry on apps: ApplyNode goes to the
// current appliance and fails over along apps. opts are appended to
// DialOptions (tests). It connects lazily, so it fails only for a target
// grpc.NewClient refuses.
func (id Identity) RegistryOn(apps *Appliances, opts ...grpc.DialOption) (*ApplianceRegistry, error) {
	r := &ApplianceRegistry{id: id, apps: apps, opts: opts}
	if _, err := r.current(apps.Current()); err != nil {
		return nil, err
	}
	return r, nil
}

// current returns a client on target presenting the current certificate,
// re-dialling when the target or the certificate changed.
func (r *ApplianceRegistry) current(target string) (poolv1.NodeServiceClient, error) {
	gen := uint64(0)
	if r.id.state != nil {
		gen = r.id.state.gen.Load()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conn != nil && r.gen == gen && r.target == target {
		return r.client, nil
	}
	conn, err := grpc.NewClient(target, append(r.id.DialOptions(), r.opts...)...)
	if err != nil {
		return nil, fmt.Errorf("node: dial %s: %w", target, err)
	}
	// Connect now: the TCP and TLS handshakes (a second or more under
	// emulation) then run while the node starts its server, and the first
	// heartbeat, which makes the node READY, does not wait for them.
	conn.Connect()
	if r.conn != nil {
		// Renewed (handshake again with the new certificate) or failed
		// over (the old appliance's connection is not kept).
		_ = r.conn.Close()
	}
	r.conn, r.gen, r.target, r.client = conn, gen, target, poolv1.NewNodeServiceClient(conn)
	return r.client, nil
}

// ApplyNode calls NodeService.ApplyNode on the current appliance, and on
// the next ones while they do not answer (within ctx).
func (r *ApplianceRegistry) ApplyNode(ctx context.Context, in *poolv1.ApplyNodeRequest, opts ...grpc.CallOption) (*poolv1.Node, error) {
	var out *poolv1.Node
	err := r.apps.do(ctx, "apply_node", func(ep string) error {
		c, err := r.current(ep)
		if err != nil {
			return err
		}
		out, err = c.ApplyNode(ctx, in, opts...)
		return err
	})
	return out, err
}

// Appliances are the appliances r dials.
func (r *ApplianceRegistry) Appliances() *Appliances { return r.apps }

// Close closes the connection.
func (r *ApplianceRegistry) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conn == nil {
		return nil
	}
	err := r.conn.Close()
	r.conn = nil
	return err
}
