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

func newServeCmd(serve serveFunc) *cobra.Command {
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
take, stops corrald with an error naming the key and the file. --config
itself has no environment variable: CORRAL_CONFIG names the corral CLI's
client file.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := serveConfig(cmd)
			if err != nil {
				return err
			}
			return serve(cmd.Context(), c)
		},
	}
	cmd.Flags().String("config", "", "YAML configuration file whose keys are these flags' names, e.g. /etc/corral/corrald.yaml (command line only)")
	cmd.Flags().String("api-listen", ":20180", "gRPC API listen address (env CORRAL_API_LISTEN)")
	cmd.Flags().StringSlice("api-san", nil, "extra host name or address for the server certificate, repeatable (env CORRAL_API_SAN, comma-separated)")
	addBootFlags(cmd)
	addBMCFlags(cmd)
	addLifecycleFlags(cmd)
	addAgentFlags(cmd)
	addLimitFlags(cmd)
	addPKIFlags(cmd)
	addStoreFlags(cmd)
	addWebFlags(cmd)
	addMetricsFlags(cmd)
	addAuditFlags(cmd)
	return cmd
}

// serveConfig reads the flags of `corrald serve` (already filled from the
// environment and --config by flagconf) into the appliance configuration.
func serveConfig(cmd *cobra.Command) (appliance.Config, error) {
	log, err := newLogger(cmd)
	if err != nil {
		return appliance.Config{}, err
	}
	c := appliance.Config{Logger: log}
	c.DataDir, _ = cmd.Flags().GetString("data-dir")
	c.APIListen, _ = cmd.Flags().GetString("api-listen")
	c.APISANs, _ = cmd.Flags().GetStringSlice("api-san")
	if c.Boot, err = bootConfig(cmd); err != nil {
		return c, err
	}
	if c.BMC, err = bmcConfig(cmd); err != nil {
		return c, err
	}
	c.Lifecycle = lifecycleConfig(cmd)
	if err := agentConfig(cmd, &c); err != nil {
		return c, err
	}
	c.Limits = limitsConfig(cmd)
	c.PKI = pkiConfig(cmd)
	storeConfig(cmd, &c)
	c.Web = webConfig(cmd)
	c.Metrics = metricsConfig(cmd)
	c.Audit = auditConfig(cmd)
	return c, nil
}

// addLifecycleFlags registers the machine lifecycle and timer flags.
func addLifecycleFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.Duration("reconcile-interval", lifecycle.DefaultReconcileInterval, "machine lifecycle reconciler period: install plan delivery, DEPLOYED, timeouts, watchdog (env CORRAL_RECONCILE_INTERVAL)")
	f.Duration("install-timeout", lifecycle.DefaultInstallTimeout, "an INSTALLING machine without progress for this long is FAILED (env CORRAL_INSTALL_TIMEOUT)")
	f.Duration("boot-watchdog", lifecycle.DefaultBootWatchdog, "a machine the appliance powered on that has not booted (agent registered or node READY) within this is power-cycled; negative disables (env CORRAL_BOOT_WATCHDOG)")
	f.Int("boot-watchdog-cycles", lifecycle.DefaultBootWatchdogCycles, "power cycles the boot watchdog makes before the machine is FAILED (env CORRAL_BOOT_WATCHDOG_CYCLES)")
	f.Duration("kexec-timeout", lifecycle.DefaultKexecTimeout, "after an install, the discovery agent boots the hypervisor image with kexec (no firmware reboot) when it can; its node not READY within this, the machine is rebooted through the BMC or the Reboot command; negative disables kexec (env CORRAL_KEXEC_TIMEOUT)")
	f.Bool("auto-accept", false, "accept machines that become INVENTORIED and match every --auto-accept-selector, disk auto (env CORRAL_AUTO_ACCEPT)")
	f.StringArray("auto-accept-selector", nil, `fact selector an auto-accepted machine must match, e.g. "disk.count>=2", repeatable (env CORRAL_AUTO_ACCEPT_SELECTOR, comma-separated)`)
	f.String("api-advertise", "", "API endpoint host:port install plans give nodes, and iPXE scripts give agents when --api-listen is loopback (default: the address the discovery agent dialled) (env CORRAL_API_ADVERTISE)")
	f.Duration("node-heartbeat-timeout", pool.DefaultHeartbeatTimeout, "a node silent for this long is NOT_READY (env CORRAL_NODE_HEARTBEAT_TIMEOUT)")
	f.Duration("node-sweep-interval", pool.DefaultSweepInterval, "how often node heartbeats are checked (env CORRAL_NODE_SWEEP_INTERVAL)")
	f.Duration("hypervisor-reconcile-interval", 30*time.Second, "VM and volume reconciler period (env CORRAL_HYPERVISOR_RECONCILE_INTERVAL)")
}

// lifecycleConfig reads the lifecycle flags (server validates them).
func lifecycleConfig(cmd *cobra.Command) appliance.LifecycleConfig {
	f := cmd.Flags()
	var c appliance.LifecycleConfig
	c.ReconcileInterval, _ = f.GetDuration("reconcile-interval")
	c.InstallTimeout, _ = f.GetDuration("install-timeout")
	c.BootWatchdog, _ = f.GetDuration("boot-watchdog")
	c.BootWatchdogCycles, _ = f.GetInt("boot-watchdog-cycles")
	c.KexecTimeout, _ = f.GetDuration("kexec-timeout")
	c.AutoAccept, _ = f.GetBool("auto-accept")
	c.AutoAcceptSelectors, _ = f.GetStringArray("auto-accept-selector")
	c.APIAdvertise, _ = f.GetString("api-advertise")
	c.NodeHeartbeatTimeout, _ = f.GetDuration("node-heartbeat-timeout")
	c.NodeSweepInterval, _ = f.GetDuration("node-sweep-interval")
	c.HypervisorReconcileInterval, _ = f.GetDuration("hypervisor-reconcile-interval")
	return c
}
