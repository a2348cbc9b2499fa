package appliance

import (
	"context"
	"fmt"
	"time"

	"github.com/corralhq/corral/fleet"
	"github.com/corralhq/corral/inventory/pool"
	"github.com/corralhq/corral/lifecycle"
)

// LifecycleConfig configures the machine lifecycle (docs/architecture.md: the
// walk, steps 6-7, and the machine lifecycle): install workflow, timers and the node heartbeat sweep. Zero
// values take the defaults.
type LifecycleConfig struct {
	// ReconcileInterval is the lifecycle reconciler period (default 10s).
	ReconcileInterval time.Duration
	// InstallTimeout fails an install without progress (default 15m).
	InstallTimeout time.Duration
	// EraseTimeout fails a release's disk erase not finished within it
	// (default 6h; no progress for 30 min fails it sooner).
	EraseTimeout time.Duration
	// BootWatchdog is how long a machine the appliance powered on has to
	// boot (default 300s; negative disables), BootWatchdogCycles how many
	// power cycles it gets before FAILED (default 3).
	BootWatchdog       time.Duration
	BootWatchdogCycles int
	// AutoAccept accepts machines that become INVENTORIED and match every
	// AutoAcceptSelectors selector (disk auto).
	AutoAccept          bool
	AutoAcceptSelectors []string
	// AutoAcceptSerials, when not empty, limits auto-accept to machines
	// whose serial is on it (--auto-accept-serials, --auto-accept-serials-file).
	AutoAcceptSerials []string
	// LLDPLabels sets a machine's switch labels (corral.dev/switch,
	// corral.dev/switch-port, corral.dev/switch-vlan) from the LLDP
	// neighbour its discovery heard (--lldp-labels; inventory.Config).
	LLDPLabels bool
	// Agents bounds the agent edge: session liveness, session ids,
	// progress sizes (--agent-*; zero fields take the defaults).
	Agents lifecycle.AgentLimits
	// TPMEKCAs are PEM files of TPM manufacturers' CAs (--tpm-ek-ca): when
	// set, a TPM proof counts only for an EK whose certificate chains to
	// one of them; empty, credential activation alone proves the EK.
	TPMEKCAs []string
	// APIAdvertise is the API endpoint (host:port) install plans name;
	// empty uses the address the machine's discovery agent dialled (the
	// one its boot script gave it).
	APIAdvertise string
	// NodeHeartbeatTimeout and NodeSweepInterval drive NOT_READY (default
	// 30s and 15s).
	NodeHeartbeatTimeout time.Duration
	NodeSweepInterval    time.Duration
	// HypervisorReconcileInterval is the VM/volume reconciler period
	// (default 30s).
	HypervisorReconcileInterval time.Duration
	// KexecTimeout is how long a machine that kexecs from its install
	// into the hypervisor image has to bring its node READY before it is
	// rebooted the old way (default 120s; negative: no kexec, installs
	// reboot through the BMC or the Reboot command).
	KexecTimeout time.Duration
	// StandbyInterval is the standby pool controller's period (0 or
	// less: 5s; lifecycle/standby). Tests shorten it.
	StandbyInterval time.Duration
	// DeployTimeout fails an OS deploy whose agent reports no progress
	// for that long while it writes (--deploy-timeout, default 30m);
	// DeployBootTimeout one whose OS does not phone home that long after
	// it was written (--deploy-boot-timeout, default 15m).
	DeployTimeout     time.Duration
	DeployBootTimeout time.Duration
}

func (c LifecycleConfig) validate() error {
	for name, d := range map[string]time.Duration{
		"--reconcile-interval": c.ReconcileInterval, "--install-timeout": c.InstallTimeout,
		"--node-heartbeat-timeout": c.NodeHeartbeatTimeout, "--node-sweep-interval": c.NodeSweepInterval,
		"--hypervisor-reconcile-interval": c.HypervisorReconcileInterval,
		"--deploy-timeout":                c.DeployTimeout, "--deploy-boot-timeout": c.DeployBootTimeout,
	} {
		if d < 0 {
			return fmt.Errorf("%s %s: must not be negative", name, d)
		}
	}
	for name, d := range map[string]time.Duration{"--deploy-timeout": c.DeployTimeout, "--deploy-boot-timeout": c.DeployBootTimeout} {
		if d > 0 && d < time.Second {
			return fmt.Errorf("%s %s: give at least 1s", name, d)
		}
	}
	if c.BootWatchdogCycles < 0 {
		return fmt.Errorf("--boot-watchdog-cycles %d: must not be negative", c.BootWatchdogCycles)
	}
	if c.EraseTimeout < 0 {
		return fmt.Errorf("--erase-timeout %s: must not be negative", c.EraseTimeout)
	}
	if err := c.Agents.Validate(); err != nil {
		return err
	}
	return nil
}

// caIdentity signs the certificate requests of installs (the node key is
// made on the machine) with the appliance CA, through the one signing path
// Join uses too (signNodeCert: CN and DNS SAN = node name, O =
// corral:node, the issued serial recorded).
type caIdentity struct{ s *Server }

func (c caIdentity) SignNode(ctx context.Context, name string, csrPEM []byte) ([]byte, error) {
	return c.s.signNodeCert(ctx, name, csrPEM, "install")
}

func (c caIdentity) CACertPEM() []byte { return c.s.ca.CertPEM() }

// initLifecycle wires the lifecycle controller after inventory, pool and
// BMC control exist, and the node heartbeat sweep.
func (s *Server) initLifecycle(p *pool.Pool) error {
	lc := s.cfg.Lifecycle
	if err := lc.validate(); err != nil {
		return err
	}
	var endpoint func(string) string
	if lc.APIAdvertise != "" {
		endpoint = func(string) string { return lc.APIAdvertise }
	}
	cfg := lifecycle.Config{
		Machines: s.inv, Events: s.inv, Nodes: p, Identity: caIdentity{s}, Endpoint: endpoint,
		Certs:    certRevoker{s},
		Logger:   s.log.With("component", "lifecycle"),
		Interval: lc.ReconcileInterval, InstallTimeout: lc.InstallTimeout,
		EraseTimeout: lc.EraseTimeout, EraseDone: s.obs.EraseDone(),
		BootWatchdog: lc.BootWatchdog, BootWatchdogCycles: lc.BootWatchdogCycles,
		AutoAccept: lc.AutoAccept, AutoAcceptSelectors: lc.AutoAcceptSelectors,
		AutoAcceptSerials: lc.AutoAcceptSerials, Agents: lc.Agents,
		WatchMachines: s.inv.WatchMachines, PeerEndpoints: s.peerEndpoints,
		Owns: s.owns,
		// initBoot sets the hypervisor boot agents kexec after an
		// install (SetKexec).
		KexecTimeout: lc.KexecTimeout,
		// initBoot sets the deploy services (SetDeploy) and mounts the
		// phone-home handler on the boot HTTP server.
		DeployTimeout: lc.DeployTimeout, DeployBootTimeout: lc.DeployBootTimeout,
		DeployOutcome: s.obs.DeployOutcome(),
	}
	if s.cfg.Store.Kind == StoreEtcd {
		cfg.Claims = &fleet.SessionClaims{Store: s.store, Self: s.cfg.Fleet.Name}
	}
	if s.bmc != nil {
		cfg.BMC = s.bmc
	}
	l, err := lifecycle.New(cfg)
	if err != nil {
		return err
	}
	s.lifecycle = l
	s.addSingleton("lifecycle", l.Run)
	s.addComponent("lifecycle-delivery", l.Deliver)
	s.addSingleton("node-heartbeat-sweep", (&pool.Sweeper{Pool: p, Timeout: lc.NodeHeartbeatTimeout, Interval: lc.NodeSweepInterval}).Run)
	return nil
}
