package main

import (
	"time"

	"github.com/corralhq/corral/internal/server"
	"github.com/corralhq/corral/inventory/pool"
	"github.com/corralhq/corral/lifecycle"
	"github.com/spf13/cobra"
)

func newServeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the Corral API (creates CA, certificate and admin.conf on first start)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(cmd)
			if err != nil {
				return err
			}
			dataDir, _ := cmd.Flags().GetString("data-dir")
			listen, _ := cmd.Flags().GetString("api-listen")
			sans, _ := cmd.Flags().GetStringSlice("api-san")
			boot, err := bootConfig(cmd)
			if err != nil {
				return err
			}
			bmc, err := bmcConfig(cmd)
			if err != nil {
				return err
			}
			lc := lifecycleConfig(cmd)
			srv, err := server.New(server.Config{DataDir: dataDir, APIListen: listen, APISANs: sans, Logger: log, Boot: boot, BMC: bmc, Lifecycle: lc})
			if err != nil {
				return err
			}
			return srv.Run(cmd.Context())
		},
	}
	cmd.Flags().String("api-listen", ":20180", "gRPC API listen address (env CORRAL_API_LISTEN)")
	cmd.Flags().StringSlice("api-san", nil, "extra host name or address for the server certificate, repeatable (env CORRAL_API_SAN, comma-separated)")
	addBootFlags(cmd)
	addBMCFlags(cmd)
	addLifecycleFlags(cmd)
	return cmd
}

// addLifecycleFlags registers the machine lifecycle and timer flags.
func addLifecycleFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.Duration("reconcile-interval", lifecycle.DefaultReconcileInterval, "machine lifecycle reconciler period: install plan delivery, DEPLOYED, timeouts, watchdog (env CORRAL_RECONCILE_INTERVAL)")
	f.Duration("install-timeout", lifecycle.DefaultInstallTimeout, "an INSTALLING machine without progress for this long is FAILED (env CORRAL_INSTALL_TIMEOUT)")
	f.Duration("boot-watchdog", lifecycle.DefaultBootWatchdog, "a machine the appliance powered on that has not booted (agent registered or node READY) within this is power-cycled; negative disables (env CORRAL_BOOT_WATCHDOG)")
	f.Int("boot-watchdog-cycles", lifecycle.DefaultBootWatchdogCycles, "power cycles the boot watchdog makes before the machine is FAILED (env CORRAL_BOOT_WATCHDOG_CYCLES)")
	f.Bool("auto-accept", false, "accept machines that become INVENTORIED and match every --auto-accept-selector, disk auto (env CORRAL_AUTO_ACCEPT)")
	f.StringArray("auto-accept-selector", nil, `fact selector an auto-accepted machine must match, e.g. "disk.count>=2", repeatable (env CORRAL_AUTO_ACCEPT_SELECTOR, comma-separated)`)
	f.String("api-advertise", "", "API endpoint host:port install plans give nodes (default: the address the discovery agent dialled) (env CORRAL_API_ADVERTISE)")
	f.Duration("node-heartbeat-timeout", pool.DefaultHeartbeatTimeout, "a node silent for this long is NOT_READY (env CORRAL_NODE_HEARTBEAT_TIMEOUT)")
	f.Duration("node-sweep-interval", pool.DefaultSweepInterval, "how often node heartbeats are checked (env CORRAL_NODE_SWEEP_INTERVAL)")
	f.Duration("hypervisor-reconcile-interval", 30*time.Second, "VM and volume reconciler period (env CORRAL_HYPERVISOR_RECONCILE_INTERVAL)")
}

// lifecycleConfig reads the lifecycle flags (server validates them).
func lifecycleConfig(cmd *cobra.Command) server.LifecycleConfig {
	f := cmd.Flags()
	var c server.LifecycleConfig
	c.ReconcileInterval, _ = f.GetDuration("reconcile-interval")
	c.InstallTimeout, _ = f.GetDuration("install-timeout")
	c.BootWatchdog, _ = f.GetDuration("boot-watchdog")
	c.BootWatchdogCycles, _ = f.GetInt("boot-watchdog-cycles")
	c.AutoAccept, _ = f.GetBool("auto-accept")
	c.AutoAcceptSelectors, _ = f.GetStringArray("auto-accept-selector")
	c.APIAdvertise, _ = f.GetString("api-advertise")
	c.NodeHeartbeatTimeout, _ = f.GetDuration("node-heartbeat-timeout")
	c.NodeSweepInterval, _ = f.GetDuration("node-sweep-interval")
	c.HypervisorReconcileInterval, _ = f.GetDuration("hypervisor-reconcile-interval")
	return c
}
