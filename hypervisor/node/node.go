// Package node is the hypervisor mode of corral-node: it serves
// corral.hypervisor.v1.HypervisorService over mutual TLS on top of the
// node-side packages (hypervisor/volume, hypervisor/vm, hypervisor/netdev,
// hypervisor/cloudinit), registers the Node with the appliance's
// pool.NodeService (ApplyNode with its capacity and labels) and re-applies
// it every heartbeat interval. In a fleet the node knows every appliance
// (Appliances, appliances.go): its heartbeats, its enrolment and its
// renewals go to one and fail over to the next when it stops answering.
//
// The agent is stateless across restarts: volumes, VMs and networks are
// read back from the data directory (volumes/, vms/, networks/) and from
// the running QEMU processes. On start it re-applies the recorded networks
// and starts again the VMs whose desired state is running but whose QEMU
// is gone (the host rebooted).
//
// Enrol obtains the node's certificate once (a CSR exchanged for a
// certificate through AgentService.Join with a bearer token) and keeps it
// in the data directory; Identity.Renew renews it at two thirds of its
// lifetime through Join with the current certificate (identity.go).
//
// Reachable from cmd/corral-node, so it must not import bbolt, etcd,
// bmclib or Corral's store/, ipmi/, boot/; it shares the leaf packages
// internal/apierr (errors reach gRPC codes through apierr.ToStatus in one
// place, server.go's answer) and internal/nodeid (the identity layout and
// the node certificate Organization) with the appliance.
package node

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"time"

	hypervisorv1 "github.com/corralhq/corral/api/hypervisor/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/hypervisor/netdev"
	"github.com/corralhq/corral/hypervisor/vm"
	"github.com/corralhq/corral/hypervisor/volume"
	"github.com/corralhq/corral/internal/nodeid"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// DefaultPort is where HypervisorService listens (n0stack's agent port).
const DefaultPort = 20181

// Registry is where the node registers itself; poolv1.NodeServiceClient
// satisfies it.
type Registry interface {
	ApplyNode(ctx context.Context, in *poolv1.ApplyNodeRequest, opts ...grpc.CallOption) (*poolv1.Node, error)
}

// Config configures Run. Name, DataDir, CAPool and Certificate are
// required.
type Config struct {
	// Name is the Node's name in the pool.
	Name string
	// DataDir holds volumes/, vms/, networks/ (mode 0700).
	DataDir string
	// Listen is the HypervisorService address (default ":20181").
	Listen string
	// Listener, when set, is used instead of Listen (tests).
	Listener net.Listener
	// CAPool verifies callers' client certificates (the appliance CA).
	CAPool *x509.CertPool
	// Certificate is the node's certificate, presented as the TLS server
	// certificate (it needs the server-auth usage and the node's address
	// among its SANs for the appliance to verify it).
	Certificate tls.Certificate
	// GetCertificate, when set, is asked for the certificate at every
	// handshake instead (Identity.GetCertificate: the renewed one).
	GetCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// AllowClient decides, after chain verification, whether a caller's
	// leaf certificate may call the service; nil refuses node
	// certificates (Organization nodeid.Organization) and accepts the rest.
	AllowClient func(*x509.Certificate) error

	// Registry receives ApplyNode every Heartbeat; nil skips registration.
	Registry Registry
	// Heartbeat is the ApplyNode interval (default 10 s).
	Heartbeat time.Duration
	// Advertise is the address the appliance dials (Node.address); default
	// the host part of Listen.
	Advertise string
	// Labels, Datacenter, AvailabilityZone, Cell, Rack, Unit and Serial
	// are copied into the Node.
	Labels                             map[string]string
	Datacenter, AvailabilityZone, Cell string
	Rack, Serial                       string
	Unit                               uint32
	// CPUMilliCores, MemoryBytes and StorageBytes override the measured
	// capacity when non-zero.
	CPUMilliCores uint32
	MemoryBytes   uint64
	StorageBytes  uint64

	// Uplink is the interface VLAN sub-interfaces hang off ("" for
	// host-local networks only).
	Uplink string
	// Bond, when set, is made (netdev.Manager.ApplyBond) before the node
	// serves; the uplink is then the bond unless Uplink names another.
	Bond *netdev.Bond
	// QEMU, QemuImg are the binaries (defaults on PATH); Accel is
	// auto|kvm|tcg.
	QEMU, QemuImg, Accel string
	// AccelProbe, when set, decides the accelerator in the background
	// instead of Accel (vm.Config.AccelProbe): the node serves before it.
	AccelProbe *vm.AccelProbe
	// NetNSPath and QEMUWrapper run the data plane in a network namespace
	// (tests).
	NetNSPath   string
	QEMUWrapper []string
	// ShutdownTimeout is the ACPI grace before a hard stop (default 60 s).
	ShutdownTimeout time.Duration
	// FetchMaxRedirects caps the HTTP redirects one FetchVolume follows
	// (0: volume.DefaultMaxRedirects; negative: none); see
	// volume.Config.MaxRedirects.
	FetchMaxRedirects int
	// SkipRestart disables what Run does by default before serving:
	// re-apply the recorded networks and start the VMs whose desired state
	// is running but whose QEMU is gone (after a host reboot).
	SkipRestart bool

	Logger *slog.Logger
}

func (c *Config) fill() error {
	switch {
	case c.Name == "":
		return errors.New("node: Name is required")
	case c.DataDir == "":
		return errors.New("node: DataDir is required")
	case c.CAPool == nil:
		return errors.New("node: CAPool is required (mTLS)")
	case len(c.Certificate.Certificate) == 0 && c.GetCertificate == nil:
		return errors.New("node: Certificate is required (mTLS)")
	}
	if c.Listen == "" {
		c.Listen = fmt.Sprintf(":%d", DefaultPort)
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.AllowClient == nil {
		c.AllowClient = refuseNodeCerts
	}
	return nil
}

// refuseNodeCerts refuses callers presenting a node certificate: nodes must
// not drive each other.
func refuseNodeCerts(leaf *x509.Certificate) error {
	if slices.Contains(leaf.Subject.Organization, nodeid.Organization) {
		return fmt.Errorf("certificate %q is a node certificate", leaf.Subject.CommonName)
	}
	return nil
}

// Run starts the node's hypervisor service and blocks until ctx ends or
// the server fails; it returns nil after a graceful stop on ctx
// cancellation. Before serving it probes the accelerator (a few seconds
// without KVM; with Config.AccelProbe a VM start waits for it instead),
// re-applies recorded networks and restarts VMs that should
// run. VMs keep running when Run returns.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.fill(); err != nil {
		return err
	}
	log := cfg.Logger.With("node", cfg.Name)
	srv, err := NewServer(ctx, ServerConfig{
		DataDir: cfg.DataDir, Uplink: cfg.Uplink, Bond: cfg.Bond, QEMU: cfg.QEMU, QemuImg: cfg.QemuImg, Accel: cfg.Accel, AccelProbe: cfg.AccelProbe,
		NetNSPath: cfg.NetNSPath, QEMUWrapper: cfg.QEMUWrapper, ShutdownTimeout: cfg.ShutdownTimeout,
		FetchMaxRedirects: cfg.FetchMaxRedirects, Logger: log,
	})
	if err != nil {
		return err
	}
	if !cfg.SkipRestart {
		srv.Restore(ctx)
	}
	lis := cfg.Listener
	if lis == nil {
		lis, err = net.Listen("tcp", cfg.Listen)
		if err != nil {
			return fmt.Errorf("node: listen %s: %w", cfg.Listen, err)
		}
	}
	tlsConf := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cfg.Certificate},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    cfg.CAPool,
	}
	if cfg.GetCertificate != nil {
		tlsConf.Certificates, tlsConf.GetCertificate = nil, cfg.GetCertificate
	}
	gs := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(tlsConf)),
		grpc.ChainUnaryInterceptor(clientCheck(cfg.AllowClient, log)),
		grpc.ChainStreamInterceptor(streamClientCheck(cfg.AllowClient, log)),
	)
	hypervisorv1.RegisterHypervisorServiceServer(gs, srv)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		log.Info("hypervisor service listening", "addr", lis.Addr().String(), "accel", string(srv.vms.Accel()))
		if err := gs.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("node: serve: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		hs.Shutdown()
		stopped := make(chan struct{})
		go func() { gs.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			gs.Stop()
		}
		return nil
	})
	if cfg.Registry != nil {
		if host, _ := advertise(cfg.Advertise, lis.Addr()); host == "" {
			log.Warn("no address to advertise: the appliance cannot dial this node; set Advertise", "listen", lis.Addr().String())
		}
		g.Go(func() error { heartbeat(gctx, cfg, lis.Addr(), log); return nil })
	}
	return g.Wait()
}

// heartbeat applies the Node now and every cfg.Heartbeat until ctx ends.
// Failures are logged and retried at the next beat.
func heartbeat(ctx context.Context, cfg Config, addr net.Addr, log *slog.Logger) {
	t := time.NewTicker(cfg.Heartbeat)
	defer t.Stop()
	failing := false
	for {
		req := nodeRequest(cfg, addr)
		rctx, cancel := context.WithTimeout(ctx, cfg.Heartbeat)
		_, err := cfg.Registry.ApplyNode(rctx, req)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			log.Warn("node registration failed", "err", err)
			failing = true
		case err == nil && failing:
			log.Info("node registration recovered")
			failing = false
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// AnnotationArchitecture is the annotation a node registers its
// architecture under (its GOARCH: amd64, arm64), so an operator and a
// scheduler can tell arm64 nodes from amd64 ones.
const AnnotationArchitecture = "corral/node/architecture"

func nodeRequest(cfg Config, addr net.Addr) *poolv1.ApplyNodeRequest {
	capa := measure(cfg.DataDir)
	if cfg.CPUMilliCores != 0 {
		capa.cpuMilli = cfg.CPUMilliCores
	}
	if cfg.MemoryBytes != 0 {
		capa.memory = cfg.MemoryBytes
	}
	if cfg.StorageBytes != 0 {
		capa.storage = cfg.StorageBytes
	}
	host, port := advertise(cfg.Advertise, addr)
	return &poolv1.ApplyNodeRequest{
		Name: cfg.Name, Labels: cfg.Labels, Address: host, Serial: cfg.Serial,
		Annotations:   map[string]string{AnnotationArchitecture: runtime.GOARCH},
		CpuMilliCores: capa.cpuMilli, MemoryBytes: capa.memory, StorageBytes: capa.storage,
		Datacenter: cfg.Datacenter, AvailabilityZone: cfg.AvailabilityZone, Cell: cfg.Cell,
		Rack: cfg.Rack, Unit: cfg.Unit, HypervisorPort: port,
	}
}

func advertise(adv string, addr net.Addr) (string, uint32) {
	var port uint32
	if ta, ok := addr.(*net.TCPAddr); ok {
		port = uint32(ta.Port)
		if adv == "" && !ta.IP.IsUnspecified() {
			adv = ta.IP.String()
		}
	}
	if h, p, err := net.SplitHostPort(adv); err == nil {
		n, _ := strconv.Atoi(p) // a port that is no number advertises 0, as before
		return h, uint32(n)
	}
	return adv, port
}

// clientCheck applies AllowClient to the verified leaf of every call.
func clientCheck(allow func(*x509.Certificate) error, log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if err := checkPeer(ctx, allow, info.FullMethod, log); err != nil {
			return nil, err
		}
		return h(ctx, req)
	}
}

func streamClientCheck(allow func(*x509.Certificate) error, log *slog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if err := checkPeer(ss.Context(), allow, info.FullMethod, log); err != nil {
			return err
		}
		return h(srv, ss)
	}
}

func checkPeer(ctx context.Context, allow func(*x509.Certificate) error, method string, log *slog.Logger) error {
	if len(method) > 0 && (hasPrefix(method, "/grpc.health.v1.Health/")) {
		return nil
	}
	p, ok := peer.FromContext(ctx)
	if !ok {
		return status.Error(codes.Unauthenticated, "no peer")
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return status.Error(codes.Unauthenticated, "a client certificate issued by the appliance CA is required")
	}
	leaf := info.State.VerifiedChains[0][0]
	if err := allow(leaf); err != nil {
		log.Info("caller refused", "method", method, "subject", leaf.Subject.CommonName, "err", err)
		return status.Errorf(codes.PermissionDenied, "%s: %v", method, err)
	}
	return nil
}

func hasPrefix(s, p string) bool { return len(s) >= len(p) && s[:len(p)] == p }

// ServerConfig configures NewServer (the service without transport); the
// fields are Config's.
type ServerConfig struct {
	DataDir, Uplink, QEMU, QemuImg, Accel string
	Bond                                  *netdev.Bond
	AccelProbe                            *vm.AccelProbe
	NetNSPath                             string
	QEMUWrapper                           []string
	ShutdownTimeout                       time.Duration
	FetchMaxRedirects                     int
	Logger                                *slog.Logger
}

// Server implements HypervisorService over one data directory. Use
// NewServer; the zero value is not usable.
type Server struct {
	hypervisorv1.UnimplementedHypervisorServiceServer
	log      *slog.Logger
	volumes  *volume.Store
	vms      *vm.Manager
	nets     *netdev.Manager
	netDir   string
	bootLock chan struct{} // serialises volume-use checks with boots
}

// NewServer opens the data directory (creating volumes/, vms/, networks/
// with mode 0700) and probes the accelerator.
func NewServer(ctx context.Context, cfg ServerConfig) (*Server, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	vols, err := volume.New(volume.Config{Dir: filepath.Join(cfg.DataDir, "volumes"), QemuImg: cfg.QemuImg,
		MaxRedirects: cfg.FetchMaxRedirects, Logger: log})
	if err != nil {
		return nil, err
	}
	uplink := cfg.Uplink
	if cfg.Bond != nil && uplink == "" {
		uplink = cfg.Bond.Name
	}
	nets, err := netdev.NewManager(netdev.Config{Uplink: uplink, NetNSPath: cfg.NetNSPath, Logger: log})
	if err != nil {
		return nil, err
	}
	if cfg.Bond != nil {
		if err := nets.ApplyBond(*cfg.Bond); err != nil {
			return nil, fmt.Errorf("node: uplink bond: %w", err)
		}
		log.Info("uplink bond applied", "bond", cfg.Bond.Name, "mode", cfg.Bond.Mode, "slaves", cfg.Bond.Slaves)
	}
	vhost := netdev.VhostAvailable()
	if !vhost {
		log.Info("vhost-net not available: taps use vhost=off")
	}
	vms, err := vm.New(ctx, vm.Config{
		Dir: filepath.Join(cfg.DataDir, "vms"), QEMU: cfg.QEMU, Accel: cfg.Accel, AccelProbe: cfg.AccelProbe, Wrapper: cfg.QEMUWrapper,
		Vhost: vhost, Net: nets, ShutdownTimeout: cfg.ShutdownTimeout, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	netDir := filepath.Join(cfg.DataDir, "networks")
	if err := os.MkdirAll(netDir, 0o700); err != nil {
		return nil, err
	}
	s := &Server{log: log, volumes: vols, vms: vms, nets: nets, netDir: netDir, bootLock: make(chan struct{}, 1)}
	return s, nil
}

var _ hypervisorv1.HypervisorServiceServer = (*Server)(nil)

func clone[M proto.Message](m M) M { return proto.Clone(m).(M) }
