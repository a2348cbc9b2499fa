package main

import (
	"context"
	"time"

	"github.com/corralhq/corral/appliance"
	"github.com/corralhq/corral/inventory/pool"
	"github.com/corralhq/corral/lifecycle"
	"github.com/spf13/cobra"
)

// serveFunc runs the appliance configured by c until ctx ends. corrald
// passes runServer; tests pass one that records c.
type serveFunc func(ctx context.Context, c appliance.Config) error

// runServer prepares and runs the appliance.
func runServer(ctx context.Context, c appliance.Config) error {
	srv, err := appliance.New(c)
	if err != nil {
		return err
	}
	return srv.Run(ctx)
}

// serveFlags are the settings of `corrald serve`, bound to its flags: the
// appliance configuration and what serve derives parts of it from.
type serveFlags struct {
	cfg                   appliance.Config
	config                string // --config, read by flagconf
	autoAcceptSerials     []string
	autoAcceptSerialsFile string
	allowTestImages       bool
}

// Help groups of `corrald serve`, in the order shown.
const (
	groupGeneral       = "General flags"
	groupAPI           = "API, web page and certificate flags"
	groupBoot          = "Network boot flags"
	groupDHCP          = "DHCP flags"
	groupMachines      = "Machine lifecycle, agent and BMC flags"
	groupFleet         = "Store and fleet flags"
	groupLimits        = "Limit flags (0 means the default)"
	groupObservability = "Observability flags"
)

func newServeCmd(g *globals, serve serveFunc) *cobra.Command {
	sf := &serveFlags{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the Corral API (creates CA, certificate and admin.conf on first start)",
		Long: `Serve the Corral API (creates CA, certificate and admin.conf on first start).

Every flag can also be set in the environment as CORRAL_<FLAG> (upper case,
'-' as '_', e.g. CORRAL_DHCP_MODE=full) or in the YAML file named by --config,
whose keys are the flag names and whose list flags take YAML lists:

  # /etc/corral/corrald.yaml
  boot-interface: br0
  dhcp-mode: full
  dhcp-range: 10.0.0.100-10.0.0.199
  dhcp-dns: [10.0.0.1]
  auto-accept: true

The command line wins over the environment, the environment over the file,
the file over the defaults. A key that is no flag, or a value the flag cannot
take, stops corrald with an error naming the key and the file; so does a
setting with a fixed set of values (dhcp-mode, store, log-level, ...) given
one outside it, before anything is opened or written. --config itself has no
environment variable: CORRAL_CONFIG names the corral CLI's client file.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := sf.serveConfig(g, cmd)
			if err != nil {
				return err
			}
			return serve(cmd.Context(), c)
		},
	}
	var groups flagGroups
	gen := groups.set(groupGeneral)
	gen.StringVar(&sf.config, "config", "", "YAML configuration file whose keys are these flags' names, e.g. /etc/corral/corrald.yaml (command line only)")
	api := groups.set(groupAPI)
	api.StringVar(&sf.cfg.APIListen, "api-listen", ":20180", "gRPC API listen address (env CORRAL_API_LISTEN)")
	api.StringSliceVar(&sf.cfg.APISANs, "api-san", nil, "extra host name or address for the server certificate, repeatable (env CORRAL_API_SAN, comma-separated)")
	addBootFlags(&groups, sf)
	addLifecycleFlags(&groups, &sf.cfg.Lifecycle)
	addAgentFlags(&groups, sf)
	addBMCFlags(groups.set(groupMachines), &sf.cfg.BMC)
	addWebFlags(api, &sf.cfg.Web)
	addPKIFlags(api, &sf.cfg.PKI)
	addStoreFlags(groups.set(groupFleet), &sf.cfg)
	addLimitFlags(groups.set(groupLimits), &sf.cfg.Limits)
	addMetricsFlags(groups.set(groupObservability), &sf.cfg.Metrics)
	addAuditFlags(groups.set(groupObservability), &sf.cfg.Audit)
	addWebhookFlags(groups.set(groupObservability), &sf.cfg.Webhooks)
	addOSImageFlags(groups.set(groupBoot), &sf.cfg.OSImages)
	groups.install(cmd)
	return cmd
}

// serveConfig checks the settings of `corrald serve` (already filled from
// the environment and --config by flagconf) and completes the appliance
// configuration. It opens and writes nothing: a bad setting stops corrald
// before the store or the data directory is touched.
func (sf *serveFlags) serveConfig(g *globals, cmd *cobra.Command) (appliance.Config, error) {
	log, err := g.logger(cmd.ErrOrStderr())
	if err != nil {
		return appliance.Config{}, err
	}
	if err := sf.checkEnums(); err != nil {
		return appliance.Config{}, err
	}
	c := sf.cfg
	c.Logger = log
	c.DataDir = g.dataDir
	if err := checkBootConfig(c.Boot); err != nil {
		return c, err
	}
	if err := checkBMCConfig(c.BMC); err != nil {
		return c, err
	}
	if err := sf.agentConfig(&c); err != nil {
		return c, err
	}
	c.Metrics.ListenIsDefault = !cmd.Flags().Changed("metrics-listen")
	if err := sf.checkTestImages(c); err != nil {
		return c, err
	}
	return c, nil
}

// addLifecycleFlags registers the machine lifecycle and timer flags.
func addLifecycleFlags(groups *flagGroups, c *appliance.LifecycleConfig) {
	f := groups.set(groupMachines)
	f.DurationVar(&c.ReconcileInterval, "reconcile-interval", lifecycle.DefaultReconcileInterval, "machine lifecycle reconciler period: install plan delivery, DEPLOYED, timeouts, watchdog (env CORRAL_RECONCILE_INTERVAL)")
	f.DurationVar(&c.InstallTimeout, "install-timeout", lifecycle.DefaultInstallTimeout, "an INSTALLING machine without progress for this long is FAILED (env CORRAL_INSTALL_TIMEOUT)")
	f.DurationVar(&c.EraseTimeout, "erase-timeout", lifecycle.DefaultEraseTimeout, "a released machine's disk erase not finished within this is FAILED (no progress for 30 min fails it sooner) (env CORRAL_ERASE_TIMEOUT)")
	f.DurationVar(&c.BootWatchdog, "boot-watchdog", lifecycle.DefaultBootWatchdog, "a machine the appliance powered on that has not booted (agent registered or node READY) within this is power-cycled; negative disables (env CORRAL_BOOT_WATCHDOG)")
	f.IntVar(&c.BootWatchdogCycles, "boot-watchdog-cycles", lifecycle.DefaultBootWatchdogCycles, "power cycles the boot watchdog makes before the machine is FAILED (env CORRAL_BOOT_WATCHDOG_CYCLES)")
	f.DurationVar(&c.KexecTimeout, "kexec-timeout", lifecycle.DefaultKexecTimeout, "after an install, the discovery agent boots the hypervisor image with kexec (no firmware reboot) when it can; its node not READY within this, the machine is rebooted through the BMC or the Reboot command; negative disables kexec (env CORRAL_KEXEC_TIMEOUT)")
	f.DurationVar(&c.DeployTimeout, "deploy-timeout", lifecycle.DefaultDeployTimeout, "a DEPLOYING machine whose agent reports no progress for this long while it writes the OS is FAILED (env CORRAL_DEPLOY_TIMEOUT)")
	f.DurationVar(&c.DeployBootTimeout, "deploy-boot-timeout", lifecycle.DefaultDeployBootTimeout, "a deployed OS that does not phone home this long after it was written is FAILED (env CORRAL_DEPLOY_BOOT_TIMEOUT)")
	f.BoolVar(&c.AutoAccept, "auto-accept", false, "accept machines that become INVENTORIED and match every --auto-accept-selector, disk auto (env CORRAL_AUTO_ACCEPT)")
	f.BoolVar(&c.LLDPLabels, "lldp-labels", false, "set a machine's corral.dev/switch, corral.dev/switch-port and corral.dev/switch-vlan labels from the LLDP neighbour its discovery agent heard (env CORRAL_LLDP_LABELS)")
	f.StringArrayVar(&c.AutoAcceptSelectors, "auto-accept-selector", nil, `fact selector an auto-accepted machine must match, e.g. "disk.count>=2", repeatable (env CORRAL_AUTO_ACCEPT_SELECTOR, comma-separated)`)
	groups.set(groupAPI).StringVar(&c.APIAdvertise, "api-advertise", "", "API endpoint host:port install plans give nodes, and iPXE scripts give agents when --api-listen is loopback (default: the address the discovery agent dialled) (env CORRAL_API_ADVERTISE)")
	f.DurationVar(&c.NodeHeartbeatTimeout, "node-heartbeat-timeout", pool.DefaultHeartbeatTimeout, "a node silent for this long is NOT_READY (env CORRAL_NODE_HEARTBEAT_TIMEOUT)")
	f.DurationVar(&c.NodeSweepInterval, "node-sweep-interval", pool.DefaultSweepInterval, "how often node heartbeats are checked (env CORRAL_NODE_SWEEP_INTERVAL)")
	f.DurationVar(&c.HypervisorReconcileInterval, "hypervisor-reconcile-interval", 30*time.Second, "VM and volume reconciler period (env CORRAL_HYPERVISOR_RECONCILE_INTERVAL)")
}
