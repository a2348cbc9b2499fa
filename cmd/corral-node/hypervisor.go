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
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/corralhq/corral/agent/cmdline"
	"github.com/corralhq/corral/agent/coldplug"
	"github.com/corralhq/corral/agent/discover"
	"github.com/corralhq/corral/agent/hvboot"
	"github.com/corralhq/corral/hypervisor/node"
	"github.com/corralhq/corral/hypervisor/vm"
	"github.com/spf13/pflag"
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
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	adv := *advertise
	if adv == "" {
		if h, _, err := net.SplitHostPort(*listen); err == nil && h != "" && !net.ParseIP(h).IsUnspecified() {
			adv = h
		}
	}
	return serveNode(ctx, appliances, node.EnrolConfig{Name: *name, DataDir: *dataDir, Token: *token, CACertPEM: caPEM}, node.Config{
		Name: *name, DataDir: *dataDir, Listen: *listen, Advertise: adv,
		Uplink: *uplink, Rack: *rack, Datacenter: *datacenter, Labels: labels.m,
		Accel: *accel, Logger: log,
	})
}

// serveNode enrols (or loads the stored identity) and runs the node until
// ctx ends, renewing its certificate at two thirds of its lifetime (the
// HypervisorService and the appliance connection then present the new
// one). The appliance dials the node by name: its certificate carries the
// name only. Enrolment, heartbeats and renewals go to the first of
// appliances that answers and fail over along the list (node.Appliances,
// which logs the appliance the node is on).
func serveNode(ctx context.Context, appliances []string, ec node.EnrolConfig, nc node.Config) error {
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
// on the identity agent/install stored on the data partition. With accel
// auto the KVM probe (it boots a one-sector guest: milliseconds with a
// working KVM, its 3 s timeout where nested KVM hangs) starts as soon as
// /dev/kvm appears (coldplug's first round loads the kvm modules) and runs
// beside the rest of coldplug, DHCP and the data partition's mount; the
// node starts serving and heartbeating once it has the answer.
func runHypervisorBoot(ctx context.Context, cmdlineFile, dataDir, accel string, level slog.Level, stdout, stderr io.Writer) error {
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	console := consoleWriter(stdout)
	probe := &accelProbe{done: make(chan struct{})}
	if accel != "auto" {
		probe.accel = accel
		close(probe.done)
	}
	var startProbe sync.Once
	probing := false // set by startProbe only
	start := func() { startProbe.Do(func() { probing = true; go probe.run(ctx, log) }) }
	err := hvboot.Run(ctx, hvboot.Config{
		CmdlineFile: cmdlineFile, DataDir: dataDir, Version: version,
		Console: console, Logger: log,
		Coldplug: func(ctx context.Context, w *coldplug.Watch) error {
			if accel != "auto" {
				_, err := discover.Coldplug(ctx, "/", w, console, log)
				return err
			}
			// The probe starts as soon as a coldplug round has made
			// /dev/kvm (the node waits for its answer), else after
			// coldplug.
			watched := make(chan struct{})
			go func() {
				defer close(watched)
				if w.Wait(ctx, kvmExists) == nil {
					start()
				}
			}()
			_, err := discover.Coldplug(ctx, "/", w, console, log)
			<-watched
			start()
			return err
		},
		Hypervisor: func(ctx context.Context, n hvboot.Node) error {
			a, err := probe.wait(ctx)
			if err != nil {
				return err
			}
			return serveNode(ctx, n.Join, node.EnrolConfig{Name: n.Name, DataDir: n.DataDir, CACertPEM: n.CACertPEM}, node.Config{
				Name: n.Name, DataDir: n.DataDir, Listen: n.Listen, Advertise: n.Advertise,
				Accel: a, Logger: log,
			})
		},
	})
	startProbe.Do(func() {}) // no probe from here on
	if probing {
		<-probe.done
	}
	return err
}

// kvmExists reports whether /dev/kvm is there (the kvm modules are in).
func kvmExists() bool {
	_, err := os.Stat("/dev/kvm")
	return err == nil
}

// accelProbe is vm.DetectAccel run once in the background; accel is its
// answer ("kvm" or "tcg") once done is closed.
type accelProbe struct {
	done  chan struct{}
	accel string
}

func (p *accelProbe) run(ctx context.Context, log *slog.Logger) {
	defer close(p.done)
	start := time.Now()
	a, why := vm.DetectAccel(ctx, "qemu-system-x86_64", nil, os.TempDir())
	p.accel = string(a)
	log.Info("accelerator probed", "accel", p.accel, "reason", why, "took", time.Since(start).Round(time.Millisecond))
}

func (p *accelProbe) wait(ctx context.Context) (string, error) {
	select {
	case <-p.done:
		return p.accel, nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
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
