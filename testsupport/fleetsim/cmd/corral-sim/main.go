// Command corral-sim powers on a simulated row of machines and hypervisor
// nodes against a real corrald (testsupport/fleetsim) and prints the
// storm's figures; its last line is the summary scripts read:
//
//	fleet: <inventoried>/<N> inventoried, <lost> lost, <dups> duplicate addresses, <flaps> NOT_READY flaps, <seconds> s
//
// It needs root (it makes and removes two network namespaces). `make
// bench-fleet MACHINES=N NODES=M` builds corrald and corral-sim and runs
// it. With -baseline FILE it prints the figures beside the ones recorded
// for the same size; -record writes this run's into FILE. It exits 1 when
// the storm was not correct (a machine lost, a duplicate address, a
// NOT_READY flap), 2 on bad flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/corralhq/corral/testsupport/fleetsim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	var ee exitError
	switch {
	case errors.As(err, &ee):
		os.Exit(int(ee))
	case err != nil:
		fmt.Fprintln(os.Stderr, "corral-sim:", err)
		os.Exit(1)
	}
}

type exitError int

func (e exitError) Error() string { return fmt.Sprintf("exit %d", int(e)) }

type stringsFlag []string

func (s *stringsFlag) String() string     { return fmt.Sprint(*s) }
func (s *stringsFlag) Set(v string) error { *s = append(*s, v); return nil }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("corral-sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c fleetsim.Config
	var extra stringsFlag
	fs.IntVar(&c.Machines, "machines", 1000, "simulated machines powered on (N)")
	fs.IntVar(&c.Nodes, "nodes", 1000, "simulated hypervisor nodes heartbeating (M): the first installed machines, then nodes that join with the admin token")
	fs.DurationVar(&c.Stagger, "stagger", 60*time.Second, "power-on times spread uniformly over this (the ramp)")
	fs.StringVar(&c.Corrald, "corrald", "", "the corrald binary (required)")
	fs.IntVar(&c.Appliances, "appliances", 1, "corrald processes: 1 runs one on its bbolt file; 2-8 run a fleet on a three-member etcd cluster the run starts (needs etcd-server), each appliance in its own namespace on the one boot segment")
	applianceDHCP := fs.String("appliance-dhcp", "all", "in a fleet, which appliances serve DHCP and TFTP: all (one shared range, leases compare-and-swapped in etcd) or first")
	fs.Var(&extra, "corrald-arg", "extra `flag` for corrald serve, repeatable (e.g. --corrald-arg=--grpc-max-conns=20000)")
	fs.Float64Var(&c.RelayShare, "relay-share", 0.5, "share of machines behind a DHCP relay (giaddr); 0 none")
	fs.Float64Var(&c.UEFIShare, "uefi-share", 0.3, "share of machines booting as x86-64 UEFI (option 93 = 7); 0 none")
	fs.Float64Var(&c.LargeShare, "large-share", 0.25, "share of large machines (2 sockets, 24 DIMMs, 12 disks, 4 NICs); 0 none")
	fs.DurationVar(&c.BootRetry, "boot-retry", 5*time.Second, "wait (±40 %) before a machine whose network boot failed (TFTP busy, script 503) boots again; a firmware that POSTs again waits 30-60 s")
	fs.BoolVar(&c.NoTFTP, "no-tftp", false, "leave out the firmware's TFTP fetch of the iPXE binary")
	fs.Float64Var(&c.KexecShare, "kexec-share", 0.5, "share of machines whose agent offers kexec (the appliance kexecs them into the hypervisor image instead of a firmware reboot); 0 none")
	fs.Float64Var(&c.FullFetchShare, "full-fetch", 0, "share of machines fetching kernel and initramfs whole (the rest fetch 64 KiB of each)")
	fs.Int64Var(&c.KernelBytes, "kernel-bytes", 8<<20, "stand-in kernel size")
	fs.Int64Var(&c.InitrdBytes, "initrd-bytes", 40<<20, "stand-in initramfs size (discovery and hypervisor)")
	fs.DurationVar(&c.AgentHeartbeat, "agent-heartbeat", 10*time.Second, "discovery agents' heartbeat interval")
	fs.DurationVar(&c.NodeHeartbeat, "node-heartbeat", 10*time.Second, "nodes' ApplyNode interval")
	fs.DurationVar(&c.NodeHeartbeatTimeout, "node-heartbeat-timeout", 0, "passed to corrald when set (keep it in proportion to -node-heartbeat)")
	fs.DurationVar(&c.NodeSweepInterval, "node-sweep-interval", 0, "passed to corrald when set")
	fs.DurationVar(&c.Soak, "soak", 0, "keep the nodes beating this long after the last machine is done (default 3 heartbeats + the timeout)")
	fs.DurationVar(&c.Timeout, "timeout", 30*time.Minute, "give up on machines not done after this")
	fs.IntVar(&c.ProfileSeconds, "profile", 0, "record corrald with perf for this many `seconds` from the middle of the power-on and print its hottest functions (needs perf)")
	fs.StringVar(&c.WorkDir, "work-dir", "", "keep corrald's data dir, log and metrics here (default a temporary directory, removed)")
	baseline := fs.String("baseline", "", "JSON file of recorded figures to print this run beside")
	record := fs.Bool("record", false, "write this run's figures into -baseline")
	quiet := fs.Bool("q", false, "no progress lines on stderr")
	if err := fs.Parse(args); err != nil {
		return exitError(2)
	}
	if c.Corrald == "" {
		fmt.Fprintln(stderr, "corral-sim: -corrald is required")
		return exitError(2)
	}
	switch *applianceDHCP {
	case "all":
	case "first":
		c.FirstDHCPOnly = true
	default:
		fmt.Fprintf(stderr, "corral-sim: -appliance-dhcp %q: want all or first\n", *applianceDHCP)
		return exitError(2)
	}
	c.CorraldArgs = extra
	c.Keep = c.WorkDir != ""
	if !*quiet {
		c.Log = stderr
	}
	if c.WorkDir != "" {
		if err := os.MkdirAll(c.WorkDir, 0o755); err != nil {
			return err
		}
	}
	var bs fleetsim.Baselines
	if *baseline != "" {
		var err error
		if bs, err = fleetsim.LoadBaselines(*baseline); err != nil {
			return err
		}
	}
	r, err := fleetsim.Run(ctx, c)
	if err != nil {
		return err
	}
	var base *fleetsim.Baseline
	if b, ok := bs[r.BaselineKey()]; ok {
		base = &b
	}
	if *record && *baseline != "" && ctx.Err() == nil {
		bs.Record(r)
		if err := bs.Write(*baseline); err != nil {
			return err
		}
	}
	r.Print(stdout, base)
	if !r.OK() {
		return exitError(1)
	}
	return nil
}
