// Package discover is `corral-node discover`, the u-root init program of
// the discovery image: it reads the kernel command line (agent/cmdline),
// loads drivers by modalias (agent/coldplug), DHCPs on the boot NIC
// (agent/netup), collects facts (agent/facts), the in-band BMC LAN
// address (agent/bmc) and the NICs' LLDP neighbours (agent/lldp), then registers and keeps a session with the
// appliance (agent/session), which carries out install and wipe plans
// with agent/install and, after an install, boots the hypervisor image
// with agent/kexec when the appliance sends a KexecPlan, and deploys an
// operating system onto the disk with agent/deploy, and runs
// commissioning tests with agent/commission. With DryRun it only collects facts under
// Root and prints them as JSON. It must not import store/, boot/, ipmi/,
// bbolt, etcd or bmclib.
package discover

import (
	"cmp"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/corralhq/corral/agent/bmc"
	"github.com/corralhq/corral/agent/cmdline"
	"github.com/corralhq/corral/agent/coldplug"
	"github.com/corralhq/corral/agent/commission"
	"github.com/corralhq/corral/agent/deploy"
	"github.com/corralhq/corral/agent/erase"
	"github.com/corralhq/corral/agent/facts"
	"github.com/corralhq/corral/agent/install"
	"github.com/corralhq/corral/agent/kexec"
	"github.com/corralhq/corral/agent/lldp"
	"github.com/corralhq/corral/agent/netup"
	"github.com/corralhq/corral/agent/session"
	"github.com/corralhq/corral/agent/tpm"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
)

// Config configures Run.
type Config struct {
	Root        string // facts are read under it; "" means "/"
	CmdlineFile string // default /proc/cmdline
	// CAFile is an optional PEM bundle (e.g. from a second initrd) whose
	// certificates are CA candidates besides the server's chain; only one
	// matching the pinned fingerprint is trusted. Default
	// /etc/corral/ca.crt; a missing file is fine.
	CAFile  string
	DryRun  bool
	Version string
	Stdout  io.Writer // JSON output of DryRun
	Console io.Writer // human progress and every failure
	Logger  *slog.Logger
	Power   session.Power // default: the reboot(2) syscall
	// Installer carries out install and wipe plans; default agent/install
	// on the disks under Root.
	Installer session.Installer
	// Kexec boots the hypervisor image after a successful install when
	// the appliance sends a KexecPlan; default agent/kexec (the real
	// syscalls). NoKexec leaves it out: the agent does not advertise the
	// capability and the appliance reboots the machine the old way.
	Kexec   session.Kexec
	NoKexec bool
	// Deployer carries out deploy plans; default agent/deploy on the
	// disks under Root. Eraser carries out erase plans; default
	// agent/erase on the disks under Root.
	Deployer session.Deployer
	Eraser   session.Eraser
	// Commissioner carries out commissioning plans; default
	// agent/commission under Root.
	Commissioner session.Commissioner
	// OpenTPM opens the machine's TPM for the EK proof at Register;
	// default agent/tpm.Open when Root is "/" (none otherwise). An error
	// (agent/tpm.ErrNoTPM: no TPM) registers without a proof.
	OpenTPM func() (session.TPM, error)
	// LLDP hears the NICs' LLDP neighbours once they are up, beside the
	// rest of the facts; default agent/lldp.Listen when Root is "/" (none
	// otherwise). LLDPWindow bounds its wait: default DefaultLLDPWindow,
	// or corral.lldp on the kernel command line (agent/cmdline.KeyLLDP).
	LLDP       func(ctx context.Context, cfg lldp.Config) (map[string][]lldp.Neighbor, error)
	LLDPWindow time.Duration
	// Network and Session override netup.Up and session.Run (tests).
	Network func(ctx context.Context, cfg netup.Config) (*netup.Lease, error)
	Session func(ctx context.Context, cfg session.Config) error
}

func (c *Config) defaults() {
	if c.Root == "" {
		c.Root = "/"
	}
	if c.CmdlineFile == "" {
		c.CmdlineFile = "/proc/cmdline"
	}
	if c.CAFile == "" {
		c.CAFile = "/etc/corral/ca.crt"
	}
	if c.Stdout == nil {
		c.Stdout = io.Discard
	}
	if c.Console == nil {
		c.Console = io.Discard
	}
	// Coldplug and DHCP print at the same time.
	c.Console = &lockedWriter{w: c.Console}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Power == nil {
		c.Power = SyscallPower{}
	}
	if c.Installer == nil {
		c.Installer = install.New(install.Config{Root: c.Root, Modules: coldplug.KernelLoader{}, Logger: c.Logger})
	}
	if c.Deployer == nil {
		c.Deployer = deploy.New(deploy.Config{Root: c.Root, Console: c.Console, Logger: c.Logger})
	}
	if c.Eraser == nil {
		c.Eraser = erase.New(erase.Config{Root: c.Root, Console: c.Console, Logger: c.Logger})
	}
	if c.Commissioner == nil {
		c.Commissioner = commission.New(commission.Config{Root: c.Root, Console: c.Console, Logger: c.Logger})
	}
	if c.Kexec == nil && !c.NoKexec {
		c.Kexec = kexec.NewBooter(kexec.Config{Console: c.Console, Logger: c.Logger})
	}
	if c.NoKexec {
		c.Kexec = nil
	}
	if c.OpenTPM == nil && c.Root == "/" {
		c.OpenTPM = func() (session.TPM, error) { return tpm.Open() }
	}
	if c.LLDP == nil && c.Root == "/" {
		c.LLDP = lldp.Listen
	}
	if c.Network == nil {
		c.Network = netup.Up
	}
	if c.Session == nil {
		c.Session = session.Run
	}
}

// Run performs discovery. In DryRun mode it returns after printing the
// facts. Otherwise it returns only when ctx ends (nil) or the command line
// is unusable (error, also printed on the console): network and
// registration failures are printed and retried forever.
func Run(ctx context.Context, cfg Config) error {
	cfg.defaults()
	if cfg.DryRun {
		f, err := facts.Collect(ctx, facts.Options{Root: cfg.Root, Logger: cfg.Logger})
		if err != nil {
			fmt.Fprintf(cfg.Console, "corral: facts incomplete: %v\n", err)
		}
		b, merr := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(f)
		if merr != nil {
			return merr
		}
		_, werr := fmt.Fprintf(cfg.Stdout, "%s\n", b)
		return werr
	}

	raw, err := os.ReadFile(cfg.CmdlineFile)
	if err != nil {
		return report(cfg.Console, fmt.Errorf("read kernel command line: %w", err))
	}
	params, err := cmdline.Parse(string(raw))
	if err != nil {
		return report(cfg.Console, fmt.Errorf("kernel command line %s: %w", cfg.CmdlineFile, err))
	}
	fmt.Fprintf(cfg.Console, "corral: discovery agent %s, %s %s, boot MAC %s\n", cfg.Version,
		plural(len(params.Endpoints), "appliance", "appliances"), strings.Join(params.Endpoints, ", "), params.MAC)

	// Drivers. DHCP starts as soon as the boot NIC's driver is in and
	// runs beside the rest of coldplug (its wait for late devices, the
	// BMC device); the facts wait for all of it.
	watch := coldplug.NewWatch()
	plugged := make(chan struct{})
	coldplugged := make(chan struct{})
	go func() {
		defer close(coldplugged)
		_, _ = Coldplug(ctx, cfg.Root, watch, nil, cfg.Console, cfg.Logger)
	}()
	go func() {
		// The BMC's device node as soon as its interface driver is in,
		// beside the rest of coldplug.
		defer close(plugged)
		if watch.Wait(ctx, func() bool { return bmcDriverLoaded(cfg.Root) }) == nil && bmcDriverLoaded(cfg.Root) {
			ipmiDevice(ctx, cfg)
		}
		<-coldplugged
	}()
	// Wait fails only when ctx ends, and an agent told to stop stops
	// quietly, here as at the waits below.
	_ = watch.Wait(ctx, func() bool { return netup.HasLink(cfg.Root, params.MAC) })
	select {
	case <-ctx.Done():
		<-plugged
		return nil
	default:
	}

	// Network, retried until it works.
	for attempt := 0; ; attempt++ {
		lease, err := cfg.Network(ctx, netup.Config{BootMAC: params.MAC, IPv6: cmdline.IPv6Only(params.Endpoints), Console: cfg.Console, Logger: cfg.Logger})
		if err == nil {
			fmt.Fprintf(cfg.Console, "corral: %s has %s\n", lease.Interface, lease.Address)
			break
		}
		fmt.Fprintf(cfg.Console, "corral: network (attempt %d): %v\n", attempt+1, err)
		if missing := missingDrivers(cfg.Root); missing != "" {
			fmt.Fprintf(cfg.Console, "corral: PCI devices without a driver: %s\n", missing)
		}
		select {
		case <-ctx.Done():
			<-plugged
			return nil
		case <-time.After(session.Backoff{Initial: 2 * time.Second, Max: 30 * time.Second}.Delay(attempt)):
		}
	}

	// LLDP neighbours, heard while the rest of the facts are gathered.
	heard := make(chan map[string][]lldp.Neighbor, 1)
	go func() { heard <- listenLLDP(ctx, cfg, string(raw)) }()

	// Facts, once: they describe the machine as booted, every driver in.
	select {
	case <-plugged:
	case <-ctx.Done():
		<-plugged
		<-heard
		return nil
	}
	f, err := facts.Collect(ctx, facts.Options{Root: cfg.Root, Logger: cfg.Logger})
	if err != nil {
		fmt.Fprintf(cfg.Console, "corral: facts incomplete: %v\n", err)
	}
	if _, err := os.Stat(filepath.Join(cfg.Root, "dev/ipmi0")); err == nil {
		if lan, err := readBMC(ctx); err == nil {
			f.Bmc = lan
		} else {
			fmt.Fprintf(cfg.Console, "corral: BMC: %v\n", err)
		}
	}
	lldp.Attach(f, <-heard)
	facts.Cap(f)
	var dev session.TPM
	if cfg.OpenTPM != nil {
		var err error
		if dev, err = cfg.OpenTPM(); err != nil {
			fmt.Fprintf(cfg.Console, "corral: TPM: %v\n", err)
			dev = nil
		}
	}

	return cfg.Session(ctx, session.Config{
		Endpoints: params.Endpoints, Token: params.Token, CAFingerprint: params.CAFingerprint,
		ExtraCAs: loadCAs(cfg.CAFile), BootMAC: params.MAC, AgentVersion: cfg.Version,
		Facts:        func(context.Context) *inventoryv1.Facts { return f },
		Power:        cfg.Power,
		Installer:    cfg.Installer,
		Kexec:        cfg.Kexec,
		Deployer:     cfg.Deployer,
		Eraser:       cfg.Eraser,
		Commissioner: cfg.Commissioner,
		TPM:          dev,
		Console:      cfg.Console,
		Logger:       cfg.Logger,
	})
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func report(console io.Writer, err error) error {
	fmt.Fprintf(console, "corral: cannot start discovery: %v\n", err)
	return err
}

// Coldplug loads the drivers of the devices under root (agent/coldplug
// with the kernel loader and root/lib/modules/$(uname -r)), bounded to two
// minutes, and prints a summary or the error on console. watch (may be
// nil) is signalled after every round and finished when it returns. hold
// (may be nil) keeps modules back (coldplug.Config.Hold): they are in the
// result's Held for the caller to load.
func Coldplug(ctx context.Context, root string, watch *coldplug.Watch, hold func(module string) bool, console io.Writer, log *slog.Logger) (coldplug.Result, error) {
	defer watch.Finish()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	start := time.Now()
	res, err := coldplug.Run(ctx, coldplug.Config{
		Root: root, ModulesDir: modulesDir(root), Loader: coldplug.KernelLoader{}, Watch: watch, Hold: hold, Logger: log,
	})
	log.Info("coldplug done", "took_ms", time.Since(start).Milliseconds(), "rounds", res.Rounds, "loaded", len(res.Loaded), "failed", len(res.Failed), "held", len(res.Held))
	if err != nil {
		fmt.Fprintf(console, "corral: coldplug: %v\n", err)
		return res, err
	}
	if len(res.Held) > 0 {
		fmt.Fprintf(console, "corral: coldplug loaded %d modules in %d rounds (%d failed; held back: %s)\n", len(res.Loaded), res.Rounds, len(res.Failed), strings.Join(res.Held, " "))
		return res, nil
	}
	fmt.Fprintf(console, "corral: coldplug loaded %d modules in %d rounds (%d failed)\n", len(res.Loaded), res.Rounds, len(res.Failed))
	return res, nil
}

// bmcDriverLoaded reports whether a BMC interface driver (ipmi_si,
// ipmi_ssif) is in the kernel: coldplug loads it by the BMC's modalias.
func bmcDriverLoaded(root string) bool {
	for _, m := range []string{"ipmi_si", "ipmi_ssif"} {
		if _, err := os.Stat(filepath.Join(root, "sys/module", m)); err == nil {
			return true
		}
	}
	return false
}

// ipmiDevice loads ipmi_devintf once a BMC interface driver is in:
// ipmi_devintf has no modalias, so coldplug never loads it, and without
// it /dev/ipmi0 never appears. It then waits up to 10 s for the device
// node (devtmpfs creates it once the interface registers).
func ipmiDevice(ctx context.Context, cfg Config) {
	if err := (coldplug.KernelLoader{}).Load("ipmi_devintf"); err != nil {
		fmt.Fprintf(cfg.Console, "corral: BMC: load ipmi_devintf: %v\n", err)
		return
	}
	dev := filepath.Join(cfg.Root, "dev/ipmi0")
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(dev); err == nil {
			return
		}
	}
	fmt.Fprintf(cfg.Console, "corral: BMC: %s did not appear after loading ipmi_devintf\n", dev)
}

// readBMC reads the BMC LAN settings with a 30 s bound.
func readBMC(ctx context.Context) (*inventoryv1.Facts_BmcLan, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	dev, err := bmc.Open(ctx)
	if err != nil {
		return nil, err
	}
	defer dev.Close(ctx)
	return bmc.Read(ctx, dev)
}

// modulesDir is Root/lib/modules/$(uname -r).
func modulesDir(root string) string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return filepath.Join(root, "lib/modules")
	}
	return filepath.Join(root, "lib/modules", unix.ByteSliceToString(u.Release[:]))
}

// missingDrivers summarises PCI devices without a driver for the console.
func missingDrivers(root string) string {
	_, missing, _ := facts.PCIDevices(facts.Options{Root: root})
	var parts []string
	for _, d := range missing {
		parts = append(parts, fmt.Sprintf("%s [%s:%s] %s", d.GetAddress(), d.GetVendorId(), d.GetProductId(), d.GetClass()))
	}
	return strings.Join(parts, ", ")
}

// loadCAs parses the certificates in a PEM file; a missing or bad file
// yields none.
func loadCAs(path string) []*x509.Certificate {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []*x509.Certificate
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			return out
		}
		if c, err := x509.ParseCertificate(block.Bytes); err == nil {
			out = append(out, c)
		}
	}
}

// lockedWriter serialises writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// SyscallPower powers off or reboots with reboot(2) after syncing disks.
type SyscallPower struct{}

// PowerOff implements session.Power.
func (SyscallPower) PowerOff() error {
	unix.Sync()
	return unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
}

// Reboot implements session.Power.
func (SyscallPower) Reboot() error {
	unix.Sync()
	return unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
}

// DefaultLLDPWindow is how long discovery waits for LLDP neighbours
// after its NICs come up when the kernel command line does not say
// (corral.lldp): long enough for a neighbour that announces itself when a
// link comes up, short enough that a rack without LLDP boots at its usual
// pace. A switch that sends every 30 s needs corral.lldp=35s
// (docs/operator-guide.md, "LLDP neighbours").
const DefaultLLDPWindow = 5 * time.Second

// listenLLDP hears the LLDP neighbours of the NICs with carrier for the
// window the command line or cfg gives, printing each on the console. It
// returns nil when LLDP is off.
func listenLLDP(ctx context.Context, cfg Config, cmdlineText string) map[string][]lldp.Neighbor {
	if cfg.LLDP == nil {
		return nil
	}
	window := cmp.Or(cfg.LLDPWindow, DefaultLLDPWindow)
	if d, ok, err := cmdline.LLDPWindow(cmdlineText); err != nil {
		fmt.Fprintf(cfg.Console, "corral: %v (listening %v)\n", err, window)
	} else if ok {
		window = d
	}
	if window == 0 {
		return nil
	}
	nics := lldp.Carrier(cfg.Root)
	start := time.Now()
	heard, err := cfg.LLDP(ctx, lldp.Config{Interfaces: nics, Window: window, Logger: cfg.Logger})
	if err != nil {
		fmt.Fprintf(cfg.Console, "corral: LLDP: %v\n", err)
	}
	for _, name := range nics {
		for _, n := range heard[name] {
			vlan := ""
			if n.VLAN != 0 {
				vlan = fmt.Sprintf(", VLAN %d", n.VLAN)
			}
			fmt.Fprintf(cfg.Console, "corral: LLDP on %s: %s port %s%s\n", name, cmp.Or(n.SystemName, n.ChassisID), n.PortID, vlan)
		}
	}
	cfg.Logger.Info("lldp", "nics", len(nics), "heard", len(heard), "took_ms", time.Since(start).Milliseconds())
	return heard
}
