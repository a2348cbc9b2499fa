// Command corral-lab is the virtual rack: `corral-lab up` starts corrald
// in a network namespace with QEMU machines (BIOS or UEFI, optionally each
// behind an ipmi_sim BMC) that PXE-boot from it; status, report and down
// show, measure and remove it. The work is in testsupport/lab.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/corralhq/corral/internal/flagconf"
	"github.com/corralhq/corral/testsupport/lab"
	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "corral-lab: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	root := &cobra.Command{
		Use:   "corral-lab",
		Short: "A virtual rack: corrald plus QEMU machines with BMCs in a network namespace",
		Long: `A virtual rack: corrald plus QEMU machines with BMCs in a network namespace.

A flag not given on the command line is read from CORRAL_<FLAG> (upper case,
'-' as '_', e.g. --image-cache from CORRAL_IMAGE_CACHE; --dir also from
CORRAL_LAB_DIR).`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetArgs(args)
	var dir string
	root.PersistentFlags().StringVar(&dir, "dir", lab.DefaultDir, "lab directory: state file, binaries, run files (env CORRAL_DIR, or CORRAL_LAB_DIR)")
	// Every flag reads CORRAL_<FLAG>; CORRAL_LAB_DIR predates that rule.
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		return flagconf.Apply(cmd.Flags(), flagconf.Options{Aliases: map[string][]string{"dir": {"CORRAL_LAB_DIR"}}})
	}
	root.AddCommand(upCmd(&dir), downCmd(&dir), statusCmd(&dir), reportCmd(&dir), benchCmd(&dir))
	return root.ExecuteContext(ctx)
}

func upCmd(dir *string) *cobra.Command {
	var c lab.Config
	var uefi, powerOn bool
	var firmware, until, diskBus string
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Build what is missing and start the lab; wait until the machines are inventoried (or ready with --accept)",
		Long: `Builds corrald and corral (from the source tree) and the boot images
(corrald images build, cached), creates a network namespace with a bridge
and a veth pair to the host, starts corrald there with full DHCP, and starts
the machines: each a QEMU under TCG with distinct SMBIOS and disk serials,
optionally behind its own ipmi_sim BMC that corrald enrolls and powers on.
Progress is printed as machines move through their states. A previous run's
store and disks in --dir are replaced; the image cache stays.

With --appliances N (2 or more) the lab is a fleet: a three-member etcd
cluster (local processes in the namespace; etcd-server) and N corrald on
--store etcd named lab-a1, lab-a2, ..., each with its own address on the
boot segment (.11, .12, ...) and API port (20180, 20181, ...). The first
initialises the fleet (CA, admin token, cluster key, copied to the others).
Only lab-a1 serves DHCP and TFTP unless --appliance-dhcp all; every
appliance serves HTTP boot and the whole API (lab.conf is lab-a1's,
lab-a2.conf lab-a2's, ...).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c.Dir = *dir
			switch {
			case firmware != "":
				c.Firmware = strings.Split(firmware, ",")
			case uefi:
				c.Firmware = []string{"uefi"}
			}
			c.DiskBus = strings.Split(diskBus, ",")
			c.Until = lab.Target(until)
			c.NoPowerOn = !powerOn
			c.Out = cmd.OutOrStdout()
			c.Log = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
			_, err := lab.Up(cmd.Context(), c)
			return err
		},
	}
	f := cmd.Flags()
	f.IntVar(&c.Machines, "machines", 1, "number of machines")
	f.BoolVar(&uefi, "uefi", false, "all machines boot UEFI (OVMF firmware PXE → TFTP → iPXE)")
	f.StringVar(&firmware, "firmware", "", "firmware per machine, cycled: e.g. bios,uefi (overrides --uefi)")
	f.StringVar(&diskBus, "disk-bus", "virtio", "disk bus per machine, cycled: virtio (two virtio-blk disks) or nvme (two NVMe controllers), e.g. virtio,nvme")
	f.StringSliceVar(&c.TPM, "tpm", []string{"swtpm"}, "TPM per machine, cycled: swtpm (a TPM 2.0 from a swtpm process of its own, started and stopped with the machine) or none, e.g. swtpm,none")
	f.BoolVar(&c.WithBMC, "with-bmc", false, "put each machine behind its own ipmi_sim BMC, enrolled and powered on through corrald")
	f.BoolVar(&c.Accept, "accept", true, "run corrald with --auto-accept (machines install and join the pool)")
	f.BoolVar(&powerOn, "power-on", true, "power the machines on (false: enrolled and left off, e.g. to change the catalog first)")
	f.StringVar(&until, "until", "", "wait until every machine is inventoried, deployed or ready (node READY), or none (default ready with --accept, else inventoried)")
	f.DurationVar(&c.Wait, "wait", 20*time.Minute, "bound on the wait")
	f.StringArrayVar(&c.CorraldArgs, "corrald-arg", nil, "extra `corrald serve` argument, repeatable (e.g. --corrald-arg=--boot-watchdog=90s)")
	f.StringVar(&c.Source, "source", "", "Corral source tree to build from (default: the module containing the working directory)")
	f.StringVar(&c.ImageCache, "image-cache", lab.DefaultImageCache(), "image build cache, shared with corrald images build (env CORRAL_IMAGE_CACHE)")
	f.IntVar(&c.MemoryMiB, "memory", 2560, "MiB of RAM per machine")
	f.IntVar(&c.CPUs, "cpus", 2, "vCPUs per machine")
	f.BoolVar(&c.InstallDeps, "install-deps", true, "apt-get install missing packages ("+strings.Join(lab.Packages, " ")+"; with --appliances 2 or more also "+strings.Join(lab.FleetPackages, " ")+")")
	f.IntVar(&c.Appliances, "appliances", 1, fmt.Sprintf("number of appliances: 1 runs corrald on its bbolt file; 2-%d run a fleet on a three-member etcd cluster the lab starts", lab.MaxAppliances))
	f.StringVar(&c.ApplianceDHCP, "appliance-dhcp", lab.DHCPFirst, "in a fleet, which appliances serve DHCP (full, one shared range: leases are compare-and-swapped in etcd) and TFTP: first or all (all keeps DHCP when any one appliance dies)")
	return cmd
}

func downCmd(dir *string) *cobra.Command {
	return &cobra.Command{
		Use:   "down",
		Short: "Stop the lab's processes and delete its namespace, bridge, taps and veth (images and files stay)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return lab.Down(cmd.Context(), *dir, cmd.OutOrStdout())
		},
	}
}

func statusCmd(dir *string) *cobra.Command {
	var events int
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show each machine's state, power, node readiness and its last timeline entries (and a fleet's appliances and etcd members)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, rows, err := lab.Status(cmd.Context(), *dir, events)
			if s != nil && s.Fleet() {
				// The processes show even when no appliance answers.
				if ferr := lab.PrintFleet(cmd.OutOrStdout(), lab.Fleet(cmd.Context(), s)); ferr != nil {
					return ferr
				}
				fmt.Fprintln(cmd.OutOrStdout())
			}
			if err != nil {
				return err
			}
			return lab.PrintStatus(cmd.OutOrStdout(), s, rows)
		},
	}
	cmd.Flags().IntVar(&events, "events", 5, "timeline entries per machine")
	return cmd
}

func reportCmd(dir *string) *cobra.Command {
	var baseline string
	cmd := &cobra.Command{
		Use:   "report",
		Short: "Time per boot phase per machine from the timeline (DHCP → script → kernel/initrd → agent → install → READY)",
		Long: `Time per boot phase per machine from the timeline (DHCP → script →
kernel/initrd → agent → install → READY), then per firmware the figures
beside the last recorded ones (--baseline, default bench/lab-baseline.json
in the source tree) as before → now.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ms, err := lab.Measure(cmd.Context(), *dir)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if err := lab.PrintReport(w, ms); err != nil {
				return err
			}
			if baseline == "" {
				return nil
			}
			base, err := lab.ReadBaseline(baseline)
			if err != nil {
				// The report stands without it.
				fmt.Fprintf(w, "\n(no baseline: %v)\n", err)
				return nil
			}
			now := &lab.Baseline{Firmware: map[string]map[string]float64{}}
			samples := map[string]map[string][]float64{}
			for _, m := range ms {
				if now.Firmware[m.Firmware] != nil {
					continue // the first machine of each firmware
				}
				now.Firmware[m.Firmware] = m.Figures()
				samples[m.Firmware] = map[string][]float64{}
				for k, v := range now.Firmware[m.Firmware] {
					samples[m.Firmware][k] = []float64{v}
				}
			}
			fmt.Fprintln(w)
			return lab.PrintComparison(w, base, now, samples)
		},
	}
	cmd.Flags().StringVar(&baseline, "baseline", defaultBaseline(), "last recorded figures to compare with (\"\": none)")
	return cmd
}

func benchCmd(dir *string) *cobra.Command {
	var c lab.BenchConfig
	var firmware string
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Rounds of up → READY → report → down; prints each figure's median per firmware beside the baseline",
		Long: `Runs --runs rounds of: corral-lab up (auto-accept, wait until every node
is READY), report, down. Then prints per firmware the median of every figure
(the phases of the discovery and the hypervisor boot, power-on →
INVENTORIED, install done, READY) beside the last recorded figures
(--baseline) as before → now with the ratio, and the load average of each
round. It asserts nothing; --record writes the medians as a new baseline.
The image cache is reused, so rounds measure cached images.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c.Up.Dir = *dir
			c.Up.Firmware = strings.Split(firmware, ",")
			c.Up.Log = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
			c.Out = cmd.OutOrStdout()
			return lab.Bench(cmd.Context(), c)
		},
	}
	f := cmd.Flags()
	f.IntVar(&c.Runs, "runs", 5, "rounds")
	f.IntVar(&c.Up.Machines, "machines", 2, "machines per round")
	f.StringVar(&firmware, "firmware", "bios,uefi", "firmware per machine, cycled")
	f.BoolVar(&c.Up.WithBMC, "with-bmc", true, "each machine behind its own ipmi_sim BMC")
	f.DurationVar(&c.Up.Wait, "wait", 20*time.Minute, "bound on each round's wait for READY")
	f.StringArrayVar(&c.Up.CorraldArgs, "corrald-arg", nil, "extra `corrald serve` argument, repeatable")
	f.StringVar(&c.Up.Source, "source", "", "Corral source tree to build from (default: the module containing the working directory)")
	f.StringVar(&c.Up.ImageCache, "image-cache", lab.DefaultImageCache(), "image build cache (env CORRAL_IMAGE_CACHE)")
	f.BoolVar(&c.Up.InstallDeps, "install-deps", true, "apt-get install missing packages")
	f.StringVar(&c.Baseline, "baseline", defaultBaseline(), "last recorded figures to compare with (\"\": none)")
	f.StringVar(&c.Record, "record", "", "write the medians to this file as a new baseline")
	return cmd
}

// defaultBaseline is bench/lab-baseline.json in the source tree holding
// the working directory, "" outside one.
func defaultBaseline() string {
	dir, err := os.Getwd()
	for err == nil {
		if _, serr := os.Stat(filepath.Join(dir, "go.mod")); serr == nil {
			return filepath.Join(dir, "bench", "lab-baseline.json")
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	return ""
}
