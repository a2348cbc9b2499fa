// Package appliance is the composition root of the Corral appliance: it
// prepares a data directory (store, CA, server certificate, first admin
// token and admin.conf), wires every part of the appliance into one gRPC
// server over TLS with role checks and one run group, and runs them. It is
// the wiring layer for cmd/corrald and for tests and benchmarks that need
// the real appliance in-process. Its features live in packages beneath it
// that never import it: appliance/metrics, appliance/audit and
// appliance/backup; the fleet's artifact sync is fleet/artifactsync.
package appliance

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/api/clientconfig"
	fleetv1 "github.com/corralhq/corral/api/fleet/v1"
	"github.com/corralhq/corral/appliance/audit"
	"github.com/corralhq/corral/appliance/backup"
	"github.com/corralhq/corral/appliance/metrics"
	"github.com/corralhq/corral/auth"
	"github.com/corralhq/corral/auth/pki"
	"github.com/corralhq/corral/auth/tpmid"
	boothttp "github.com/corralhq/corral/boot/http"
	"github.com/corralhq/corral/fleet/artifactsync"
	hvappliance "github.com/corralhq/corral/hypervisor/appliance"
	"github.com/corralhq/corral/images/osimage"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/inventory/bmc"
	"github.com/corralhq/corral/inventory/pool"
	"github.com/corralhq/corral/lifecycle"
	"github.com/corralhq/corral/lifecycle/standby"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/bolt"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
)

// Files inside the data directory.
const (
	StoreFile       = "corral.db"
	PKIDir          = "pki"
	AdminConfigFile = "admin.conf"
)

// Config configures the appliance. Zero values take the defaults below.
type Config struct {
	// DataDir holds everything corrald keeps (default /var/lib/corral).
	DataDir string
	// APIListen is the gRPC listen address (default ":20180").
	APIListen string
	// APISANs are extra names/addresses for the server certificate.
	APISANs []string
	// ShutdownGrace bounds graceful shutdown (default 10s).
	ShutdownGrace time.Duration
	Logger        *slog.Logger
	// Boot configures network boot (boot.go); BMC configures BMC control
	// (bmc.go).
	Boot BootConfig
	BMC  BMCConfig
	// Lifecycle configures accept/install, the lifecycle timers and the
	// node heartbeat sweep (lifecycle.go).
	Lifecycle LifecycleConfig
	// PKI configures node certificates, their revocation list and the
	// appliance's client certificate (pki.go).
	PKI PKIConfig
	// Limits bound what clients can hold: boot HTTP and TFTP, the gRPC API,
	// the boot timeline (limits.go).
	Limits LimitsConfig
	// Store chooses bbolt (default) or a shared etcd cluster (store.go);
	// Fleet names this appliance among those sharing it (cluster.go).
	Store StoreConfig
	Fleet FleetConfig
	// Web serves the rack's web page (web.go); Metrics serves /metrics,
	// /healthz and /readyz (package metrics).
	Web     WebConfig
	Metrics MetricsConfig
	// Audit bounds the audit stream: its queue and retention (package audit).
	Audit AuditConfig
	// OSImages configures operating-system images (osimagewiring.go).
	OSImages OSImagesConfig
	// Webhooks bounds event export's queues and retries
	// (webhookwiring.go).
	Webhooks WebhooksConfig
}

// Server is a prepared appliance; Run serves it.
type Server struct {
	// webDone is closed when the web listener (REST included) has shut
	// down; nil when it is off. See Run.
	webDone chan struct{}

	cfg    Config
	log    *slog.Logger
	store  store.Store
	ca     *pki.CA
	cert   tls.Certificate
	tokens *auth.Tokens
	grpc   *grpc.Server
	lis    net.Listener
	inv    *inventory.Inventory
	bmc    *bmc.Service
	// vms is the hypervisor services (initHypervisor): the VM consoles'
	// link.
	vms *hvappliance.Services
	// lifecycle drives accept/install, reprovision, maintenance and the
	// lifecycle timers.
	lifecycle *lifecycle.Lifecycle
	// components run beside the gRPC server in Run (boot servers,
	// pollers); each returns nil when its ctx ends.
	components []component

	// revocations records issued node certificates and the revocation
	// list every mTLS verifier checks (pki.go).
	revocations *auth.Revocations
	// pool is the node pool; Join checks new names against it.
	pool *pool.Pool

	// leadership says whether this appliance runs the singleton work
	// (cluster.go); single holds that work.
	leadership Leadership
	single     singletons
	// peers lists the other live appliances' API endpoints (nil alone).
	peers func(ctx context.Context) []string
	// owner reports whether the fleet's dispatch gave a machine's
	// per-machine work to this appliance (nil: alone, owns all).
	owner func(machine string) bool
	// runner names the appliance a machine's per-machine work is given
	// to in a fleet (nil alone).
	runner func(machine string) (string, bool)
	// fleetSelf is this appliance's runner record spec (initFleet).
	fleetSelf *fleetv1.Appliance

	// health is the gRPC health service; package metrics sets each service's
	// status.
	health *health.Server
	// obs holds the Prometheus registry and collectors (package metrics).
	obs *metrics.Metrics
	// audit records mutating calls (package audit).
	audit *audit.Recorder
	// backup serves BackupService (package backup).
	backup *backup.Service
	// artifacts syncs the fleet's boot artifacts (package
	// fleet/artifactsync).
	artifacts *artifactsync.Syncer
	// osImages serves OSImageService and the boot HTTP server's
	// /os-images/ (package images/osimage); bootHTTP is the boot HTTP
	// server (nil when network boot is off).
	osImages *osimage.Service
	bootHTTP *boothttp.Server
	// standby keeps the standby pools (package lifecycle/standby).
	standby *standby.Service
}

type component struct {
	name string
	run  func(ctx context.Context) error
}

// addComponent registers a long-running part for Run.
func (s *Server) addComponent(name string, run func(ctx context.Context) error) {
	s.components = append(s.components, component{name: name, run: run})
}

func (c *Config) setDefaults() error {
	if c.DataDir == "" {
		c.DataDir = "/var/lib/corral"
	}
	if c.APIListen == "" {
		c.APIListen = ":20180"
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if _, _, err := net.SplitHostPort(c.APIListen); err != nil {
		return fmt.Errorf("--api-listen %q: %w", c.APIListen, err)
	}
	if err := c.Store.fill(c.DataDir); err != nil {
		return err
	}
	if err := c.Fleet.fill(); err != nil {
		return err
	}
	return c.Limits.setDefaults()
}

// OpenStore opens the data directory's store, creating the directory.
func OpenStore(dataDir string, log *slog.Logger) (store.Store, error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	// The commit window batches flushes under a sustained write load
	// (store/bolt/window.go); a write on a quiet appliance is not delayed.
	s, err := bolt.Open(filepath.Join(dataDir, StoreFile), bolt.Options{Logger: log, CommitWindow: bolt.DefaultCommitWindow})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// New prepares the data directory and binds the API listener. On first
// start it creates the CA, the server certificate and an admin token, and
// writes admin.conf (0600). It never re-initialises an existing store: a
// corrupt store file is an error naming the file.
func New(cfg Config) (*Server, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if err := cfg.PKI.fill(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger}
	st, err := openStore(context.Background(), cfg)
	if err != nil {
		return nil, err
	}
	s.store = st
	ok := false
	defer func() {
		if !ok {
			st.Close()
		}
	}()
	// Bring records written by an older corrald to this schema before
	// anything reads them (migrate.go); a newer record stops here.
	if err := s.migrateStore(context.Background()); err != nil {
		return nil, err
	}
	if cfg.Store.Kind == StoreEtcd {
		if err := shareSecrets(context.Background(), st, cfg, cfg.Logger); err != nil {
			return nil, err
		}
	}
	if err := s.initLeadership(); err != nil {
		return nil, err
	}
	// Time every write from here on (corral_store_commit_seconds); the
	// elector above needs the backend's own type, everything below takes
	// the timed store. The registry exists whether or not /metrics is
	// served: the boot servers and the BMC controller count into it.
	s.obs = metrics.New(cfg.Metrics, s.log)
	s.obs.SetBuild(Version)
	st = s.obs.WrapStore(st)
	s.store = st
	s.ca, err = pki.EnsureCA(filepath.Join(cfg.DataDir, PKIDir))
	if err != nil {
		return nil, err
	}
	hosts := append(pki.LocalHosts(), cfg.APISANs...)
	if h, _, _ := net.SplitHostPort(cfg.APIListen); h != "" && !isUnspecified(h) {
		hosts = append(hosts, h)
	}
	s.cert, err = s.ca.EnsureServerCert(filepath.Join(cfg.DataDir, PKIDir), hosts)
	if err != nil {
		return nil, err
	}
	// Send the CA after the server certificate: discovery agents carry only
	// the CA's SHA-256 fingerprint (the kernel command line has no room
	// for a certificate) and pin it against the chain the server sends.
	if block, _ := pem.Decode(s.ca.CertPEM()); block != nil {
		s.cert.Certificate = append(s.cert.Certificate, block.Bytes)
		if ca, err := x509.ParseCertificate(block.Bytes); err == nil {
			s.obs.CertificateExpiry("ca", ca.NotAfter)
		}
	}
	if leaf, err := x509.ParseCertificate(s.cert.Certificate[0]); err == nil {
		s.obs.CertificateExpiry("server", leaf.NotAfter)
	}
	s.tokens = &auth.Tokens{Store: st, Logger: s.log.With("component", "tokens")}
	s.revocations = &auth.Revocations{Store: st, MaxLiveCerts: cfg.PKI.MaxLiveNodeCerts, Logger: cfg.Logger.With("component", "pki")}

	lis, err := net.Listen("tcp", cfg.APIListen)
	if err != nil {
		return nil, fmt.Errorf("api listen: %w", err)
	}
	s.lis = cfg.Limits.GRPC.listener(lis, cfg.Logger.With("component", "grpc"))
	if err := s.ensureAdminConfig(context.Background()); err != nil {
		lis.Close()
		return nil, err
	}

	p, err := pool.New(pool.Config{Store: st, Logger: cfg.Logger.With("component", "pool"), HeartbeatWriteAfter: heartbeatWriteAfter(cfg)})
	if err != nil {
		lis.Close()
		return nil, err
	}
	s.inv, err = inventory.New(cfg.Limits.Timeline.inventoryConfig(inventory.Config{Store: st, Logger: cfg.Logger.With("component", "inventory"), MaxDiscovered: cfg.Boot.MaxDiscovered, MaxUnaccepted: cfg.Boot.MaxUnaccepted,
		FactCaps: cfg.Limits.Reports, ReportRefused: s.obs.ReportRefused(), Warm: s.agentHere, LLDPLabels: cfg.Lifecycle.LLDPLabels}))
	if err != nil {
		lis.Close()
		return nil, err
	}
	s.pool = p
	ic := &auth.Interceptor{Tokens: s.tokens, Logger: cfg.Logger.With("component", "auth"), NodeCertificates: true, Certificates: s.revocations}
	tlsCfg := &tls.Config{
		Certificates: []tls.Certificate{s.cert},
		ClientCAs:    s.ca.Pool(),
		ClientAuth:   tls.VerifyClientCertIfGiven,
		MinVersion:   tls.VersionTLS12,
	}
	if err := s.initAudit(); err != nil {
		lis.Close()
		return nil, fmt.Errorf("audit: %w", err)
	}
	mu, ms := s.obs.Interceptors()
	au, as := s.audit.Interceptors()
	al := newAgentLimiter(cfg.Limits.Agent, cfg.Logger.With("component", "agent-limits"))
	al.countInto(s.obs)
	s.grpc = grpc.NewServer(append(cfg.Limits.GRPC.serverOptions(cfg.Logger.With("component", "grpc")),
		grpc.Creds(credentialsFromTLS(tlsCfg)),
		grpc.ChainUnaryInterceptor(nonNil(recoverUnary(s.log), mu, logUnary(s.log), au, ic.Unary(), al.unary(), nodeIdentity())...),
		grpc.ChainStreamInterceptor(nonNil(recoverStream(s.log), ms, as, ic.Stream(), al.stream())...),
	)...)
	if err := s.initBMC(); err != nil {
		lis.Close()
		return nil, fmt.Errorf("bmc: %w", err)
	}
	pool.Register(s.grpc, p)
	s.audit.Register(s.grpc)
	s.initPKI()
	if err := s.initLifecycle(p); err != nil {
		lis.Close()
		return nil, fmt.Errorf("lifecycle: %w", err)
	}
	if err := s.initStandby(); err != nil {
		lis.Close()
		return nil, fmt.Errorf("standby pools: %w", err)
	}
	if err := s.initWebhooks(); err != nil {
		lis.Close()
		return nil, fmt.Errorf("webhooks: %w", err)
	}
	s.addSingleton("token-purge", s.purgeTokens)
	machines := &inventory.MachineServer{Inv: s.inv, Lifecycle: s.lifecycle, Caller: machineCaller}
	if s.bmc != nil {
		machines.BMC = s.bmc
	}
	inventory.Register(s.grpc, machines)
	inventory.RegisterCommission(s.grpc, &inventory.CommissionServer{Inv: s.inv, Lifecycle: s.lifecycle, Caller: machineCaller})
	if err := s.initHypervisor(p); err != nil {
		lis.Close()
		return nil, fmt.Errorf("hypervisor services: %w", err)
	}
	if err := s.initConsole(); err != nil {
		lis.Close()
		return nil, fmt.Errorf("console: %w", err)
	}
	ekRoots, err := tpmid.LoadCAs(cfg.Lifecycle.TPMEKCAs)
	if err != nil {
		lis.Close()
		return nil, fmt.Errorf("--tpm-ek-ca: %w", err)
	}
	lifecycle.RegisterAgent(s.grpc, &lifecycle.AgentServer{Lifecycle: s.lifecycle, JoinFunc: s.join, Caller: agentCaller,
		TPM: tpmid.New(tpmid.Config{EKRoots: ekRoots})})
	s.initArtifacts()
	if err := s.initOSImages(); err != nil {
		lis.Close()
		return nil, fmt.Errorf("os images: %w", err)
	}
	if err := s.initFleet(s.selfAppliance(), cfg.Store.Kind != StoreEtcd); err != nil {
		lis.Close()
		return nil, err
	}
	if err := s.initBoot(); err != nil {
		lis.Close()
		return nil, fmt.Errorf("boot: %w", err)
	}
	s.health = health.NewServer()
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	s.initBackup()
	if err := s.initWeb(); err != nil {
		lis.Close()
		return nil, fmt.Errorf("web: %w", err)
	}
	if err := s.startMetrics(); err != nil {
		lis.Close()
		return nil, fmt.Errorf("health: %w", err)
	}
	ok = true
	return s, nil
}

const authRoleNode = authv1.Role_ROLE_NODE

// heartbeatWriteAfter is how old a node's stored heartbeat may grow while
// its unchanged ApplyNode beats are kept in memory only (inventory/pool,
// beats.go): alone on bbolt this appliance's sweep sees every beat, so the
// record is refreshed only every 5 minutes (for backups and restarts); in
// a fleet the leader's sweep may see only the stored heartbeat, so it is
// written once half the heartbeat timeout has passed (a node beating every
// 10 s then never looks silent for 30 s).
func heartbeatWriteAfter(cfg Config) time.Duration {
	if cfg.Store.Kind == StoreEtcd {
		return cmp.Or(cfg.Lifecycle.NodeHeartbeatTimeout, pool.DefaultHeartbeatTimeout) / 2
	}
	return 5 * time.Minute
}

func isUnspecified(h string) bool {
	ip := net.ParseIP(h)
	return ip != nil && ip.IsUnspecified()
}

// Addr is the bound API address.
func (s *Server) Addr() net.Addr { return s.lis.Addr() }

// CA returns the appliance CA.
func (s *Server) CA() *pki.CA { return s.ca }

// Tokens returns the token store.
func (s *Server) Tokens() *auth.Tokens { return s.tokens }

// endpoint is the host:port written to admin.conf.
func (s *Server) endpoint() string {
	host, _, _ := net.SplitHostPort(s.cfg.APIListen)
	_, port, _ := net.SplitHostPort(s.lis.Addr().String())
	if host == "" || isUnspecified(host) {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

// ensureAdminConfig creates the first admin token and admin.conf when the
// store has no tokens yet (first start).
func (s *Server) ensureAdminConfig(ctx context.Context) error {
	path := filepath.Join(s.cfg.DataDir, AdminConfigFile)
	existing, err := s.tokens.List(ctx)
	if err != nil {
		return err
	}
	if len(existing) > 0 {
		cc, err := clientconfig.Load(path)
		switch {
		case errors.Is(err, os.ErrNotExist):
			s.log.Warn("admin.conf is missing but tokens exist; create one with `corrald token create --role admin`", "path", path)
		case err != nil:
			s.log.Warn("admin.conf is unreadable; leaving it alone", "path", path, "err", err)
		case cc.Endpoint != s.endpoint() || cc.CACert != string(s.ca.CertPEM()):
			// Keep the token; follow the listen address and CA.
			cc.Endpoint, cc.CACert = s.endpoint(), string(s.ca.CertPEM())
			if err := cc.Write(path); err != nil {
				return err
			}
			s.log.Info("updated admin client config endpoint", "path", path, "endpoint", cc.Endpoint)
		}
		return nil
	}
	tok, err := s.tokens.Create(ctx, authv1.Role_ROLE_ADMIN, "first admin (admin.conf)", 0)
	if err != nil {
		return err
	}
	cc := &clientconfig.Config{Endpoint: s.endpoint(), CACert: string(s.ca.CertPEM()), Token: tok}
	if err := cc.Write(path); err != nil {
		return err
	}
	s.log.Info("first start: wrote admin client config", "path", path, "endpoint", cc.Endpoint)
	return nil
}

// Run serves until ctx ends, then stops gracefully (bounded by
// ShutdownGrace), waits for every component, and closes the store. It
// returns nil on a clean shutdown.
func (s *Server) Run(ctx context.Context) error {
	s.log.Info("serving gRPC API", "addr", s.lis.Addr().String(), "data_dir", s.cfg.DataDir, "store", storeName(s.cfg), "appliance", s.cfg.Fleet.Name)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.inv.Run(gctx) })
	g.Go(func() error { return s.runSingletons(gctx) })
	for _, c := range s.components {
		g.Go(func() error {
			if err := c.run(gctx); err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			return nil
		})
	}
	g.Go(func() error {
		err := s.grpc.Serve(s.lis)
		if errors.Is(err, grpc.ErrServerStopped) {
			return nil
		}
		return err
	})
	g.Go(func() error {
		<-gctx.Done()
		s.log.Info("shutting down")
		// REST calls run in s.grpc through ServeHTTP, whose transports
		// GracefulStop cannot drain (grpc panics "Drain() is not
		// implemented"): the web listener, whose requests end with ctx,
		// is shut down first; should it outlast the grace, Stop, which
		// closes them.
		if s.webDone != nil {
			select {
			case <-s.webDone:
			case <-time.After(s.cfg.ShutdownGrace):
				s.log.Warn("web shutdown timed out; stopping the API", "grace", s.cfg.ShutdownGrace.String())
				s.grpc.Stop()
				return nil
			}
		}
		done := make(chan struct{})
		go func() { s.grpc.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-time.After(s.cfg.ShutdownGrace):
			s.log.Warn("graceful shutdown timed out; stopping", "grace", s.cfg.ShutdownGrace.String())
			s.grpc.Stop()
		}
		return nil
	})
	err := g.Wait()
	if cerr := s.store.Close(); cerr != nil && err == nil {
		err = cerr
	}
	return err
}

// Lifecycle returns the machine lifecycle controller.
func (s *Server) Lifecycle() *lifecycle.Lifecycle { return s.lifecycle }

// Inventory returns the machine inventory.
func (s *Server) Inventory() *inventory.Inventory { return s.inv }

// Close releases a Server that will not Run.
func (s *Server) Close() error {
	s.lis.Close()
	return s.store.Close()
}
