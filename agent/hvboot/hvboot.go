// Package hvboot is `corral-node hypervisor --boot`, the u-root init
// program of the hypervisor image: it reads the kernel command line
// (agent/cmdline; corral.mode must be hypervisor), loads drivers
// (coldplug, and the modules the hypervisor needs that have no modalias),
// finds the data partition agent/install wrote (GPT partition name or ext4
// label "corral-data"), mounts it on the data directory, checks that its
// CA is the one the command line pins and sets the hostname, brings up the
// boot NIC with DHCP, and hands over to the hypervisor agent
// (Config.Hypervisor: hypervisor/node Enrol + Run, wired by
// cmd/corral-node). Coldplug runs in the background: DHCP starts once the
// boot NIC exists and the mount once the data partition does
// (coldplug.Watch); the agent starts when all of it is done. The kvm
// modules (KVMModules) are not needed for that: cmd/corral-node's coldplug
// holds them back and loads them, then probes KVM, once the node has
// registered (under emulation they load for seconds). Every failure is
// printed on the console and retried with backoff; it never gives up.
//
// It must not import store/, boot/, ipmi/, bbolt, etcd or bmclib, nor
// hypervisor/ (cmd/corral-node wires that in).
package hvboot

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corralhq/corral/agent/cmdline"
	"github.com/corralhq/corral/agent/coldplug"
	"github.com/corralhq/corral/agent/discover"
	"github.com/corralhq/corral/agent/install"
	"github.com/corralhq/corral/agent/netup"
	"github.com/corralhq/corral/agent/session"
)

// DefaultDataDir is where the data partition is mounted: the hypervisor
// agent's data directory.
const DefaultDataDir = "/var/lib/corral-node"

// MountModules and NodeModules are loaded beside coldplug: the
// hypervisor needs them and no device modalias names them. Failures are
// printed and ignored (the module may be built in). MountModules load in
// order once the data partition is there, before it is mounted;
// crc32c_generic comes first: ext4 needs it for metadata_csum as a soft
// dependency, which nothing else loads. NodeModules (taps, bridges,
// vhost-net, VLANs) load each on its own once the data partition is there
// (as the mount's, they are not needed earlier) and are in before the
// hypervisor agent starts.
//
// KVMModules are the kvm modules, which coldplug loads by the CPU's
// modalias: the node serves and registers without them (a VM start waits
// for the accelerator's answer), so the hypervisor boot holds them back
// until then (cmd/corral-node).
var (
	KVMModules   = []string{"kvm", "kvm_amd", "kvm_intel"}
	MountModules = []string{"crc32c_generic", "ext4"}
	NodeModules  = []string{"tun", "bridge", "vhost_net", "8021q"}
	// Modules are all of them, in load order.
	Modules = slices.Concat(MountModules, NodeModules)
)

// Node is what the hypervisor agent is started with.
type Node struct {
	Name string // node name (appliance.json node_name)
	// Join are the appliances' API host:port in the order to dial them:
	// corral.endpoint's (the fleet as the appliance that served this boot
	// sees it, itself first), then appliance.json's not already listed
	// (the fleet at install time), at most cmdline.MaxEndpoints.
	Join      []string
	DataDir   string // the mounted data partition
	Listen    string // HypervisorService address, ":20181"
	Advertise string // the boot NIC's leased address
	CACertPEM []byte // identity/ca.crt, verified against corral.ca
	Appliance install.Appliance
}

// Config configures Run. Hypervisor is required.
type Config struct {
	Root        string // sys and dev are read under it; "" means "/"
	CmdlineFile string // default /proc/cmdline
	DataDir     string // default DefaultDataDir
	Version     string
	Console     io.Writer // human progress and every failure
	Logger      *slog.Logger
	// Hypervisor runs the hypervisor agent; it blocks until ctx ends. An
	// error (or a return before ctx ends) is printed and retried.
	Hypervisor func(ctx context.Context, n Node) error
	Backoff    session.Backoff // default 2 s initial, 60 s cap

	// Hooks for tests; defaults are the real system calls. Coldplug must
	// signal w after every round (coldplug.Run does); Run finishes w
	// when it returns.
	Coldplug func(ctx context.Context, w *coldplug.Watch) error
	Loader   coldplug.Loader
	Network  func(ctx context.Context, cfg netup.Config) (*netup.Lease, error)
	Mount    func(dev, dir string) error
	Hostname func(name string) error
}

func (c *Config) defaults() error {
	if c.Hypervisor == nil {
		return errors.New("hvboot: Hypervisor is required")
	}
	if c.Root == "" {
		c.Root = "/"
	}
	if c.CmdlineFile == "" {
		c.CmdlineFile = "/proc/cmdline"
	}
	if c.DataDir == "" {
		c.DataDir = DefaultDataDir
	}
	if c.Console == nil {
		c.Console = io.Discard
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Backoff == (session.Backoff{}) {
		c.Backoff = session.Backoff{Initial: 2 * time.Second, Max: time.Minute}
	}
	if c.Coldplug == nil {
		c.Coldplug = func(ctx context.Context, w *coldplug.Watch) error {
			_, err := discover.Coldplug(ctx, c.Root, w, nil, c.Console, c.Logger)
			return err
		}
	}
	if c.Loader == nil {
		c.Loader = coldplug.KernelLoader{}
	}
	if c.Network == nil {
		c.Network = netup.Up
	}
	if c.Mount == nil {
		c.Mount = mountExt4
	}
	if c.Hostname == nil {
		c.Hostname = func(name string) error { return unix.Sethostname([]byte(name)) }
	}
	return nil
}

// ErrOtherAppliance means the data partition's CA is not the one the kernel
// command line pins.
var ErrOtherAppliance = errors.New("the disk was installed by another appliance; reprovision it")

// Run boots the machine into hypervisor mode and runs the hypervisor
// agent until ctx ends; then it returns nil. Each stage (command line,
// data partition, network, hypervisor) is retried with backoff after a
// failure, which is printed on the console. It returns an error only for
// an invalid Config.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.defaults(); err != nil {
		return err
	}
	EnsurePath()
	fmt.Fprintf(cfg.Console, "corral: hypervisor boot %s\n", cfg.Version)

	params, ok := retry(ctx, &cfg, "kernel command line", func() (cmdline.Params, error) { return readCmdline(cfg.CmdlineFile) })
	if !ok {
		return nil
	}
	fmt.Fprintf(cfg.Console, "corral: appliance %s, boot MAC %s\n", strings.Join(params.Endpoints, ", "), params.MAC)

	// Coldplug runs in the background; each stage waits for the device
	// it needs, not for the whole of it: DHCP for the boot NIC, the mount
	// (and the ext4 chain) and the node's modules for the data partition.
	// The hypervisor agent starts once all of it is done.
	start := time.Now()
	stage := func(what string) {
		cfg.Logger.Info("hypervisor boot stage done", "stage", what, "at_ms", time.Since(start).Milliseconds())
	}
	watch := coldplug.NewWatch()
	plugged := make(chan struct{})
	go func() {
		defer close(plugged)
		defer watch.Finish()
		_ = cfg.Coldplug(ctx, watch) // prints its own summary or error
		stage("coldplug")
	}()

	type netResult struct {
		lease *netup.Lease
		ok    bool
	}
	netDone := make(chan netResult, 1)
	go func() {
		if watch.Wait(ctx, func() bool { return netup.HasLink(cfg.Root, params.MAC) }) != nil {
			netDone <- netResult{}
			return
		}
		lease, ok := retry(ctx, &cfg, "network", func() (*netup.Lease, error) {
			l, err := cfg.Network(ctx, netup.Config{BootMAC: params.MAC, IPv6: cmdline.IPv6Only(params.Endpoints), Console: cfg.Console, Logger: cfg.Logger})
			if err != nil {
				return nil, err
			}
			fmt.Fprintf(cfg.Console, "corral: %s has %s\n", l.Interface, l.Address)
			return l, nil
		})
		stage("network")
		netDone <- netResult{lease, ok}
	}()

	load := func(m string) {
		if err := cfg.Loader.Load(m); err != nil {
			fmt.Fprintf(cfg.Console, "corral: module %s: %v (ignored)\n", m, err)
			cfg.Logger.Warn("module load failed", "module", m, "err", err)
		}
	}
	// The data partition's block device is coldplug's; a disk that never
	// shows up is reported by the mount's retries below. The node's
	// modules are not needed before the hypervisor agent starts: they
	// load, each on its own, once the disk is there, beside the ext4
	// chain (under emulation every load costs CPU the boot NIC's and the
	// disk's drivers need first).
	dataReady := func() bool {
		_, err := FindDataPartition(cfg.Root)
		return err == nil
	}
	var nodeMods sync.WaitGroup
	nodeMods.Add(1)
	go func() {
		defer nodeMods.Done()
		_ = watch.Wait(ctx, dataReady)
		for _, m := range NodeModules {
			nodeMods.Add(1)
			go func() { defer nodeMods.Done(); load(m) }()
		}
	}()
	_ = watch.Wait(ctx, dataReady)
	for _, m := range MountModules {
		load(m)
	}

	type data struct {
		app install.Appliance
		ca  []byte
	}
	d, ok := retry(ctx, &cfg, "data disk", func() (data, error) {
		app, ca, err := mountData(&cfg, params.CAFingerprint)
		return data{app, ca}, err
	})
	if !ok {
		<-netDone // ctx ended: the network retry ends too
		nodeMods.Wait()
		<-plugged
		return nil
	}
	stage("data disk")
	fmt.Fprintf(cfg.Console, "corral: node %s (machine %s, install %s) from %s\n", d.app.NodeName, d.app.MachineName, d.app.InstallID, cfg.DataDir)
	join, dropped := joinList(params.Endpoints, d.app.Appliances())
	if len(dropped) > 0 {
		fmt.Fprintf(cfg.Console, "corral: %d appliances from install time left out (at most %d): %s\n", len(dropped), cmdline.MaxEndpoints, strings.Join(dropped, ", "))
	}
	if !slices.Equal(d.app.Appliances(), params.Endpoints) {
		cfg.Logger.Info("appliance endpoints differ from install time", "installed", strings.Join(d.app.Appliances(), ","),
			"cmdline", strings.Join(params.Endpoints, ","), "join", strings.Join(join, ","))
	}
	if err := cfg.Hostname(d.app.NodeName); err != nil {
		fmt.Fprintf(cfg.Console, "corral: set hostname %s: %v\n", d.app.NodeName, err)
	}

	nr := <-netDone
	nodeMods.Wait()
	<-plugged
	if !nr.ok {
		return nil
	}
	lease := nr.lease
	ip, _, err := net.ParseCIDR(lease.Address)
	adv := ""
	if err == nil {
		adv = ip.String()
	} else if p := net.ParseIP(lease.Address); p != nil {
		adv = p.String()
	}

	n := Node{
		Name: d.app.NodeName, Join: join, DataDir: cfg.DataDir, Listen: ":20181",
		Advertise: adv, CACertPEM: d.ca, Appliance: d.app,
	}
	for attempt := 0; ; attempt++ {
		fmt.Fprintf(cfg.Console, "corral: starting hypervisor agent %s on %s, appliances %s\n", n.Name, n.Advertise, strings.Join(n.Join, ", "))
		err := cfg.Hypervisor(ctx, n)
		select {
		case <-ctx.Done():
			return nil // told to stop: whatever the agent returned is the stop itself
		default:
		}
		if err == nil {
			err = errors.New("stopped")
		}
		fmt.Fprintf(cfg.Console, "corral: hypervisor agent (attempt %d): %v\n", attempt+1, err)
		cfg.Logger.Error("hypervisor agent failed", "attempt", attempt+1, "err", err)
		if !sleep(ctx, cfg.Backoff.Delay(attempt)) {
			return nil
		}
	}
}

// joinList is the command line's endpoints, then the install-time ones not
// among them, at most cmdline.MaxEndpoints; dropped are those left out.
func joinList(cmdlineEPs, installed []string) (join, dropped []string) {
	join = slices.Clone(cmdlineEPs)
	for _, e := range installed {
		switch {
		case slices.Contains(join, e):
		case len(join) == cmdline.MaxEndpoints:
			dropped = append(dropped, e)
		default:
			join = append(join, e)
		}
	}
	return join, dropped
}

// retry runs f until it succeeds (true) or ctx ends (false), printing
// every failure.
func retry[T any](ctx context.Context, cfg *Config, what string, f func() (T, error)) (T, bool) {
	for attempt := 0; ; attempt++ {
		v, err := f()
		if err == nil {
			return v, true
		}
		fmt.Fprintf(cfg.Console, "corral: %s (attempt %d): %v\n", what, attempt+1, err)
		cfg.Logger.Error("hypervisor boot stage failed", "stage", what, "attempt", attempt+1, "err", err)
		if !sleep(ctx, cfg.Backoff.Delay(attempt)) {
			var zero T
			return zero, false
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

func readCmdline(path string) (cmdline.Params, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return cmdline.Params{}, err
	}
	p, err := cmdline.Parse(string(raw))
	if err != nil {
		return p, fmt.Errorf("%s: %w", path, err)
	}
	if p.Mode != "hypervisor" {
		return p, fmt.Errorf("%s=%q: this is the hypervisor image, booted without %s=hypervisor", cmdline.KeyMode, p.Mode, cmdline.KeyMode)
	}
	return p, nil
}

// mountData finds the data partition, mounts it on cfg.DataDir (unless
// something is mounted there already), reads appliance.json and checks
// that identity/ca.crt is the CA whose fingerprint the command line pins.
func mountData(cfg *Config, fingerprint string) (install.Appliance, []byte, error) {
	if !mounted(cfg.Root, cfg.DataDir) {
		dev, err := FindDataPartition(cfg.Root)
		if err != nil {
			return install.Appliance{}, nil, err
		}
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return install.Appliance{}, nil, err
		}
		if err := cfg.Mount(dev, cfg.DataDir); err != nil {
			return install.Appliance{}, nil, fmt.Errorf("mount %s on %s: %w", dev, cfg.DataDir, err)
		}
		fmt.Fprintf(cfg.Console, "corral: mounted %s on %s\n", dev, cfg.DataDir)
	}
	return CheckData(cfg.DataDir, fingerprint)
}

// CheckData reads dataDir/identity/appliance.json and ca.crt and checks
// that the CA's SHA-256 (DER) is fingerprint; a mismatch wraps
// ErrOtherAppliance.
func CheckData(dataDir, fingerprint string) (install.Appliance, []byte, error) {
	app, err := install.ReadAppliance(dataDir)
	if err != nil {
		return install.Appliance{}, nil, fmt.Errorf("data disk identity: %w", err)
	}
	ca, err := os.ReadFile(filepath.Join(dataDir, install.IdentityDir, install.CACertFile))
	if err != nil {
		return install.Appliance{}, nil, fmt.Errorf("data disk identity: %w", err)
	}
	got, err := install.CAFingerprint(ca)
	if err != nil {
		return install.Appliance{}, nil, fmt.Errorf("data disk identity: %s: %w", install.CACertFile, err)
	}
	if got != strings.ToLower(fingerprint) {
		return install.Appliance{}, nil, fmt.Errorf("%w (its CA is sha256:%s, this appliance's is sha256:%s; installed by %s as %s)",
			ErrOtherAppliance, got, fingerprint, app.Endpoint, app.NodeName)
	}
	return app, ca, nil
}

func mountExt4(dev, dir string) error {
	return unix.Mount(dev, dir, "ext4", unix.MS_NOATIME, "")
}

// mounted reports whether root/proc/mounts lists dir as a mount point.
func mounted(root, dir string) bool {
	b, err := os.ReadFile(filepath.Join(root, "proc/mounts"))
	if err != nil {
		return false
	}
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) > 1 && f[1] == dir {
			return true
		}
	}
	return false
}

// EnsurePath puts /usr/bin, /usr/sbin, /bin and /sbin on PATH (the image
// keeps qemu-system-x86_64 or qemu-system-aarch64 and qemu-img there; u-root's init may not).
func EnsurePath() {
	have := filepath.SplitList(os.Getenv("PATH"))
	for _, d := range []string{"/usr/bin", "/usr/sbin", "/bin", "/sbin"} {
		found := false
		for _, h := range have {
			found = found || h == d
		}
		if !found {
			have = append(have, d)
		}
	}
	os.Setenv("PATH", strings.Join(have, string(os.PathListSeparator)))
}
