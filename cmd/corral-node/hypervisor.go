//go:build !corral_discovery

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/corralhq/corral/agent/cmdline"
	"github.com/corralhq/corral/agent/coldplug"
	"github.com/corralhq/corral/agent/discover"
	"github.com/corralhq/corral/agent/hvboot"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/hypervisor/netdev"
	"github.com/corralhq/corral/hypervisor/node"
	"github.com/corralhq/corral/hypervisor/vm"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
)

// runHypervisor is `corral-node hypervisor`: enrol with the appliance once
// (token → node certificate, kept in the data dir), then serve the
// HypervisorService over mTLS and register + heartbeat the Node. With
// --boot it is the hypervisor image's init (agent/hvboot): everything
// comes from the kernel command line and the data partition.
func runHypervisor(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("hypervisor", stderr)
	boot := fs.Bool("boot", false, "run as the hypervisor image's init: read /proc/cmdline, mount the data partition, take the identity agent/install wrote")
	cmdlineFile := fs.String("cmdline", "/proc/cmdline", "with --boot: kernel command line carrying corral.* parameters")
	name := fs.String("name", hostname(), "node name in the pool (env CORRAL_NAME, or CORRAL_NODE_NAME)")
	join := fs.String("join", "", "appliance API host:port; in a fleet several, comma-separated, in the order to try them (env CORRAL_JOIN)")
	token := fs.String("token", "", "node token from 'corrald token create --role node', needed only for the first start (env CORRAL_TOKEN)")
	caCert := fs.String("ca-cert", "", "appliance CA certificate file (env CORRAL_CA_CERT)")
	dataDir := fs.String("data-dir", "/var/lib/corral-node", "node data directory: identity, volumes, VMs (env CORRAL_DATA_DIR)")
	listen := fs.String("listen", ":20181", "HypervisorService listen address (env CORRAL_LISTEN)")
	advertise := fs.String("advertise", "", "address the appliance dials this node on (default: the host of --listen, or when that is every address the one this node reaches the appliance from) (env CORRAL_ADVERTISE)")
	uplink := fs.String("uplink", "", "interface for VLAN sub-interfaces; empty = host-local networks only (env CORRAL_UPLINK)")
	bond := fs.String("bond", "", "bond NICs into the uplink: NAME=NIC,NIC[,mode=active-backup|802.3ad][,miimon=MS][,primary=NIC] (2-8 NICs, miimon 10-10000, default active-backup and 100); the uplink is the bond unless --uplink names another (env CORRAL_BOND)")
	rack := fs.String("rack", "", "rack label (scheduling spreads across racks) (env CORRAL_RACK)")
	datacenter := fs.String("datacenter", "", "datacenter (env CORRAL_DATACENTER)")
	accel := fs.String("accel", "auto", "accelerator: auto (KVM when it works, else TCG), kvm or tcg (env CORRAL_ACCEL)")
	var labels labelFlag
	fs.Var(&labels, "label", "label KEY=VALUE on the Node, repeatable (env CORRAL_LABEL, comma-separated)")
	verbose := fs.BoolP("verbose", "v", false, "debug logging")
	// CORRAL_NODE_NAME predates the CORRAL_<FLAG> rule.
	if err := parse(fs, args, map[string][]string{"name": {"CORRAL_NODE_NAME"}}); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	if *boot {
		return runHypervisorBoot(ctx, *cmdlineFile, *dataDir, *accel, level, stdout, stderr)
	}
	if *join == "" || *caCert == "" {
		return errors.New("hypervisor: --join and --ca-cert are required")
	}
	appliances, err := cmdline.ParseEndpoints(*join)
	if err != nil {
		return fmt.Errorf("hypervisor: --join: %w", err)
	}
	caPEM, err := os.ReadFile(*caCert)
	if err != nil {
		return fmt.Errorf("hypervisor: --ca-cert: %w", err)
	}
	var bondCfg *netdev.Bond
	if *bond != "" {
		b, err := netdev.ParseBond(*bond)
		if err != nil {
			return fmt.Errorf("hypervisor: --bond: %w", err)
		}
		bondCfg = &b
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	adv := *advertise
	if adv == "" {
		if h, _, err := net.SplitHostPort(*listen); err == nil && h != "" && !net.ParseIP(h).IsUnspecified() {
			adv = h
		}
	}
	return serveNode(ctx, appliances, node.EnrolConfig{Name: *name, DataDir: *dataDir, Token: *token, CACertPEM: caPEM}, node.Config{
		Name: *name, DataDir: *dataDir, Listen: *listen, Advertise: adv,
		Uplink: *uplink, Bond: bondCfg, Rack: *rack, Datacenter: *datacenter, Labels: labels.m,
		Accel: *accel, Logger: log,
	}, nil)
}

// serveNode enrols (or loads the stored identity) and runs the node until
// ctx ends, renewing its certificate at two thirds of its lifetime (the
// HypervisorService and the appliance connection then present the new
// one). The appliance dials the node by name: its certificate carries the
// name only. Enrolment, heartbeats and renewals go to the first of
// appliances that answers and fail over along the list (node.Appliances,
// which logs the appliance the node is on). registered (may be nil) is
// called once, after the first ApplyNode the appliance accepted.
func serveNode(ctx context.Context, appliances []string, ec node.EnrolConfig, nc node.Config, registered func()) error {
	apps, err := node.NewAppliances(appliances, nc.Logger)
	if err != nil {
		return fmt.Errorf("hypervisor: %w", err)
	}
	ec.Appliances = apps
	id, err := node.Enrol(ctx, ec)
	if err != nil {
		return fmt.Errorf("hypervisor: enrol with %s: %w", strings.Join(apps.List(), ", "), err)
	}
	reg, err := id.RegistryOn(apps)
	if err != nil {
		return fmt.Errorf("hypervisor: dial %s: %w", apps.Current(), err)
	}
	defer reg.Close()
	nc.CAPool, nc.Certificate, nc.GetCertificate = id.CAPool, id.Certificate, id.GetCertificate
	nc.Registry = reg
	if registered != nil {
		nc.Registry = &firstApply{Registry: reg, then: registered}
	}
	withAddress(ctx, &nc, apps.Current)
	rctx, cancel := context.WithCancel(ctx)
	renewed := make(chan error, 1)
	go func() { renewed <- id.Renew(rctx, node.RenewConfig{Appliances: apps, Logger: nc.Logger}) }()
	err = node.Run(ctx, nc)
	cancel()
	return errors.Join(err, <-renewed)
}

// runHypervisorBoot is `corral-node hypervisor --boot`, the uinit of the
// hypervisor image: agent/hvboot prepares the machine, then the node runs
// on the identity agent/install stored on the data partition. Coldplug
// holds the kvm modules back (hvboot.KVMModules): the node serves and
// registers without them, and under emulation they load for seconds
// beside the drivers the boot needs. After the node's first accepted
// ApplyNode (it is READY) they load and the accelerator is decided (with
// accel auto vm.DetectAccel: milliseconds with a working KVM, its 3 s
// timeout where nested KVM hangs); a VM start that comes first starts
// both and waits for the answer (vm.AccelProbe).
func runHypervisorBoot(ctx context.Context, cmdlineFile, dataDir, accel string, level slog.Level, stdout, stderr io.Writer) error {
	// The probe decides with this setting after the node is READY, where
	// vm.New no longer sees it: refuse a wrong one before anything runs.
	if err := vm.CheckAccel(accel); err != nil {
		return fmt.Errorf("hypervisor: --accel: %w", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	console := consoleWriter(stdout)
	var held heldModules
	probe := vm.NewAccelProbe(func(ctx context.Context) (vm.Accel, string) {
		start := time.Now()
		held.load(console, log)
		a, why := vm.Accel(accel), "set by --accel"
		if accel == "auto" {
			probed := time.Now()
			a, why = vm.DetectAccel(ctx, vm.DefaultQEMU(runtime.GOARCH), nil, os.TempDir())
			log.Info("accelerator probed", "accel", string(a), "reason", why, "took", time.Since(probed).Round(time.Millisecond))
		}
		fmt.Fprintf(console, "corral: accelerator %s (%s), decided in %s\n", a, why, time.Since(start).Round(time.Millisecond))
		return a, why
	})
	err := hvboot.Run(ctx, hvboot.Config{
		CmdlineFile: cmdlineFile, DataDir: dataDir, Version: version,
		Console: console, Logger: log,
		Coldplug: func(ctx context.Context, w *coldplug.Watch) error {
			res, err := discover.Coldplug(ctx, "/", w, isKVMModule, console, log)
			held.add(res.Held)
			return err
		},
		Hypervisor: func(ctx context.Context, n hvboot.Node) error {
			return serveNode(ctx, n.Join, node.EnrolConfig{Name: n.Name, DataDir: n.DataDir, CACertPEM: n.CACertPEM}, node.Config{
				Name: n.Name, DataDir: n.DataDir, Listen: n.Listen, Advertise: n.Advertise,
				AccelProbe: probe, Logger: log,
			}, func() { probe.Start(ctx) })
		},
	})
	probe.Close() // a decision under way ends within its bounds
	return err
}

// isKVMModule: coldplug holds the kvm modules back in the hypervisor boot.
func isKVMModule(m string) bool { return slices.Contains(hvboot.KVMModules, m) }

// heldModules are the modules coldplug held back, loaded by the
// accelerator probe.
type heldModules struct {
	mu   sync.Mutex
	mods []string
}

func (h *heldModules) add(mods []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.mods = append(h.mods, mods...)
}

// load loads the held modules (each with its dependencies) and forgets
// them; failures are printed and ignored (no KVM: the probe says so).
func (h *heldModules) load(console io.Writer, log *slog.Logger) {
	h.mu.Lock()
	mods := h.mods
	h.mods = nil
	h.mu.Unlock()
	for _, m := range mods {
		start := time.Now()
		if err := (coldplug.KernelLoader{}).Load(m); err != nil {
			fmt.Fprintf(console, "corral: module %s: %v (ignored)\n", m, err)
			log.Warn("module load failed", "module", m, "err", err)
			continue
		}
		log.Info("module loaded", "module", m, "took_ms", time.Since(start).Milliseconds(), "held", true)
	}
}

// firstApply is a node.Registry that calls then once, after the first
// ApplyNode that succeeded.
type firstApply struct {
	node.Registry
	once sync.Once
	then func()
}

func (r *firstApply) ApplyNode(ctx context.Context, in *poolv1.ApplyNodeRequest, opts ...grpc.CallOption) (*poolv1.Node, error) {
	out, err := r.Registry.ApplyNode(ctx, in, opts...)
	if err == nil {
		r.once.Do(r.then)
	}
	return out, err
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}

// labelFlag collects repeatable KEY=VALUE flags. It is a
// pflag.SliceValue, so CORRAL_LABEL (comma-separated) sets several.
type labelFlag struct{ m map[string]string }

func (l *labelFlag) String() string { return strings.Join(l.GetSlice(), ",") }

func (l *labelFlag) Type() string { return "KEY=VALUE" }

func (l *labelFlag) Set(v string) error { return l.Append(v) }

// Append adds one KEY=VALUE.
func (l *labelFlag) Append(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("label %q: want KEY=VALUE", v)
	}
	if l.m == nil {
		l.m = map[string]string{}
	}
	l.m[k] = val
	return nil
}

// Replace sets the labels to vs.
func (l *labelFlag) Replace(vs []string) error {
	l.m = nil
	for _, v := range vs {
		if err := l.Append(v); err != nil {
			return err
		}
	}
	return nil
}

// GetSlice returns the labels as sorted KEY=VALUE items.
func (l *labelFlag) GetSlice() []string {
	out := make([]string, 0, len(l.m))
	for k, v := range l.m {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}
