package lab

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/corralhq/corral/api/clientconfig"
	"github.com/corralhq/corral/internal/imagecache"
	"github.com/corralhq/corral/internal/sourcetree"
)

// Target is how far Up waits for every machine to get.
type Target string

// The targets, nearest first.
const (
	UntilNone        Target = "none"        // no wait
	UntilInventoried Target = "inventoried" // INVENTORIED, INSTALLING or DEPLOYED
	UntilDeployed    Target = "deployed"    // every machine DEPLOYED
	UntilReady       Target = "ready"       // every machine's node READY
)

// Config configures Up.
type Config struct {
	// Dir holds the state file, binaries and the run's files
	// (default /var/lib/corral-lab).
	Dir string
	// Machines is how many machines to start (default 1).
	Machines int
	// Firmware is cycled over the machines: "bios" or "uefi" (default bios).
	Firmware []string
	// TPM is cycled over the machines: "swtpm" (a TPM 2.0 emulated by a
	// swtpm process of its own) or "none" (default swtpm).
	TPM []string
	// DiskBus is cycled over the machines: "virtio" (two virtio-blk
	// disks) or "nvme" (two NVMe controllers, one namespace each)
	// (default virtio).
	DiskBus []string
	// WithBMC puts each machine behind its own ipmi_sim, enrolled in
	// corrald and powered on through it.
	WithBMC bool
	// Accept passes --auto-accept to corrald (when it knows the flag).
	Accept bool
	// Until is how far Up waits (default ready with Accept, else inventoried).
	Until Target
	// Wait bounds the wait (default 20m).
	Wait time.Duration
	// CorraldArgs are extra `corrald serve` arguments.
	CorraldArgs []string
	// Source is the Corral module root to build binaries from; "" finds
	// it from the working directory, else binaries beside the executable
	// or on PATH are used.
	Source string
	// ImageCache is the image build cache (default DefaultImageCache(),
	// shared with corrald images build; corral-lab's --image-cache reads
	// CORRAL_IMAGE_CACHE).
	ImageCache string
	// MemoryMiB and CPUs size every machine (defaults 2560 and 2).
	MemoryMiB, CPUs int
	// NoPowerOn leaves the machines off (enrolled, with a BMC): the caller
	// powers them on (corral machine power on NAME) when it is ready.
	NoPowerOn bool
	// InstallDeps installs missing Debian packages with apt-get.
	InstallDeps bool
	// Appliances is how many corrald run (default 1: one appliance on its
	// bbolt file, the lab as it always was). Two or more run as a fleet on
	// a three-member etcd cluster the lab starts (fleet.go).
	Appliances int
	// ApplianceDHCP says which appliances of a fleet serve DHCP and TFTP:
	// DHCPFirst (default) or DHCPAll.
	ApplianceDHCP string
	// Out receives progress for people; Log the details.
	Out io.Writer
	Log *slog.Logger
}

// DefaultDir is the default lab directory.
const DefaultDir = "/var/lib/corral-lab"

// DefaultImageCache is the default image build cache: the machine-wide
// one `corrald images build` uses too (imagecache.Default).
func DefaultImageCache() string { return imagecache.Default() }

// APIPort is corrald's API port in the lab.
const APIPort = 20180

// WebPort is where the lab's corrald serves the rack's web page (HTTPS).
const WebPort = 8443

func (c *Config) defaults() error {
	if c.Dir == "" {
		c.Dir = DefaultDir
	}
	abs, err := filepath.Abs(c.Dir)
	if err != nil {
		return err
	}
	c.Dir = abs
	if c.Machines == 0 {
		c.Machines = 1
	}
	if c.Machines < 0 || c.Machines > 32 {
		return fmt.Errorf("--machines %d: want 1-32", c.Machines)
	}
	if c.Appliances == 0 {
		c.Appliances = 1
	}
	if c.Appliances < 0 || c.Appliances > MaxAppliances {
		return fmt.Errorf("--appliances %d: want 1-%d", c.Appliances, MaxAppliances)
	}
	if c.ApplianceDHCP == "" {
		c.ApplianceDHCP = DHCPFirst
	}
	if c.ApplianceDHCP != DHCPFirst && c.ApplianceDHCP != DHCPAll {
		return fmt.Errorf("--appliance-dhcp %q: want %s or %s", c.ApplianceDHCP, DHCPFirst, DHCPAll)
	}
	if len(c.Firmware) == 0 {
		c.Firmware = []string{"bios"}
	}
	for _, f := range c.Firmware {
		if f != "bios" && f != "uefi" {
			return fmt.Errorf("firmware %q: want bios or uefi", f)
		}
	}
	for _, b := range c.DiskBus {
		if b != "virtio" && b != "nvme" {
			return fmt.Errorf("disk bus %q: want virtio or nvme", b)
		}
	}
	for _, t := range c.TPM {
		if t != "swtpm" && t != "none" {
			return fmt.Errorf("tpm %q: want swtpm or none", t)
		}
	}
	if c.Until == "" {
		c.Until = UntilInventoried
		if c.Accept {
			c.Until = UntilReady
		}
	}
	switch c.Until {
	case UntilNone, UntilInventoried, UntilDeployed, UntilReady:
	default:
		return fmt.Errorf("--until %q: want none, inventoried, deployed or ready", c.Until)
	}
	if c.Wait == 0 {
		c.Wait = 20 * time.Minute
	}
	if c.ImageCache == "" {
		c.ImageCache = DefaultImageCache()
	}
	if c.MemoryMiB == 0 {
		c.MemoryMiB = 2560
	}
	if c.CPUs == 0 {
		c.CPUs = 2
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Up builds what is missing and starts the lab, then waits for the
// machines to reach c.Until, printing their progress. The lab keeps
// running when Up returns (with or without error); Down removes it. Up
// refuses to start over a lab that is still up.
func Up(ctx context.Context, c Config) (*State, error) {
	if err := c.defaults(); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("corral-lab needs root (network namespaces, taps, bridges)")
	}
	if old, err := LoadState(c.Dir); err == nil {
		return nil, fmt.Errorf("a lab (%s, namespace %s) is already set up in %s: corral-lab down first", old.ID, old.Namespace, c.Dir)
	}
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return nil, err
	}
	if err := ensurePackages(ctx, c.InstallDeps, c.Appliances > 1, c.Out); err != nil {
		return nil, err
	}
	// Stages from here on (progress.go): one line each, with the time
	// since up began.
	prog := newUpProgress(c.Out)
	defer prog.Close()
	say := prog.Stagef
	say("building corrald and corral (when inside the source tree)")
	bin, src, err := binaries(ctx, c.Dir, c.Source)
	if err != nil {
		return nil, err
	}
	if src != "" {
		say("built corrald and corral from %s into %s", src, filepath.Dir(bin.Corrald))
	}

	s, err := newState(ctx, c, bin)
	if err != nil {
		return nil, err
	}
	// A previous run's files (store, disks) go; binaries and the image
	// cache stay.
	if err := os.RemoveAll(s.RunDir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(s.RunDir, 0o755); err != nil {
		return nil, err
	}

	// Every appliance serves every boot from its own catalog (the image
	// cache makes the second and later builds copies).
	dataDirs := []string{s.DataDir}
	if s.Fleet() {
		dataDirs = dataDirs[:0]
		for _, a := range s.Appliances {
			dataDirs = append(dataDirs, a.DataDir)
		}
	}
	for i, dataDir := range dataDirs {
		imgArgs := []string{"images", "build", "--data-dir", dataDir, "--image-cache", c.ImageCache}
		if src != "" {
			imgArgs = append(imgArgs, "--source", src)
		}
		say("building images: corrald %s", strings.Join(imgArgs, " "))
		// Its stages (written to stderr) become ours as they happen.
		var out bytes.Buffer
		stages := &stageWriter{prefix: "building images: ", p: prog}
		cmd := exec.CommandContext(ctx, bin.Corrald, imgArgs...)
		cmd.Stdout, cmd.Stderr = &out, stages
		if i > 0 {
			stages.prefix = fmt.Sprintf("building images for %s: ", dataDir)
		}
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("corrald images build: %v\n%s%s", err, stages.Tail(), out.String())
		}
		if i > 0 {
			continue
		}
		for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			if !strings.Contains(line, " level=") {
				say("images: %s", strings.TrimSpace(line))
			}
		}
	}

	if err := s.Save(); err != nil {
		return nil, err
	}
	say("lab %s: namespace %s, bridge %s %s.0/24, host veth %s %s ↔ %s", s.ID, s.Namespace, s.Bridge, s.Subnet, s.VethHost, s.HostAddr, s.NSAddr)
	if err := s.createNetwork(ctx); err != nil {
		return s, err
	}

	if s.Fleet() {
		if err := s.createFleetNetwork(ctx); err != nil {
			return s, err
		}
		say("starting etcd (3 members) in %s", s.Namespace)
		if err := s.startEtcd(ctx); err != nil {
			return s, err
		}
		say("etcd: %d members in %s (from the host: %s), fleet prefix %s", len(s.Etcd), s.Namespace, s.etcdHostEndpoints(), s.EtcdPrefix)
		if err := s.startAppliances(ctx, c, say); err != nil {
			return s, err
		}
	} else {
		say("starting corrald in %s", s.Namespace)
		if err := s.startCorrald(ctx, c); err != nil {
			return s, err
		}
		say("corrald serving in %s (pid %d, log %s)", s.Namespace, s.Corrald.PID, filepath.Join(s.RunDir, "corrald.log"))
	}
	if !s.AutoAccept && c.Accept {
		say("note: this corrald has no --auto-accept; machines stay INVENTORIED until accepted")
		if c.Until == UntilReady || c.Until == UntilDeployed {
			c.Until = UntilInventoried
		}
	}

	a, err := dialAPI(s)
	if err != nil {
		return s, err
	}
	defer a.Close()

	for i := range s.Machines {
		m := &s.Machines[i]
		pw := ""
		if c.WithBMC {
			pw = randHex(8)
		}
		if err := m.prepare(c.WithBMC, pw); err != nil {
			return s, fmt.Errorf("%s: %w", m.Name, err)
		}
		if err := s.addTap(ctx, m.Tap); err != nil {
			return s, err
		}
		if c.WithBMC {
			if err := s.startSim(ctx, m); err != nil {
				return s, err
			}
			if err := s.Save(); err != nil {
				return s, err
			}
			say("%s: ipmi_sim BMC on 127.0.0.1:%d in %s (pid %d)", m.Name, m.BMCPort, s.Namespace, m.Sim.PID)
		}
	}
	for i := range s.Machines {
		m := &s.Machines[i]
		if c.WithBMC {
			args := []string{"machine", "enroll", m.Name, "--bmc", fmt.Sprintf("127.0.0.1:%d", m.BMCPort), "--bmc-user", m.BMCUser,
				"--bmc-password-file", m.BMCPwFile, "--bmc-protocol", "ipmi", "--bmc-cipher", "3", "--mac", m.MAC}
			if err := s.corral(ctx, args...); err != nil {
				return s, err
			}
			if c.NoPowerOn {
				say("%s: enrolled, left off (corral machine power on %s)", m.Name, m.Name)
				continue
			}
			if err := s.corral(ctx, "machine", "power", "on", m.Name); err != nil {
				return s, err
			}
			say("booting %s (%s): enrolled and powered on through corrald (corral machine power on %s)", m.Name, strings.ToUpper(m.Firmware), m.Name)
		} else {
			if c.NoPowerOn {
				say("%s: left off (%s set power 1 in %s)", m.Name, m.Chassis(), s.Namespace)
				continue
			}
			if err := s.chassis(ctx, *m, "set", "power", "1"); err != nil {
				return s, err
			}
			say("booting %s (%s): powered on (no BMC)", m.Name, strings.ToUpper(m.Firmware))
		}
		m.PoweredAt = time.Now()
		if err := s.Save(); err != nil {
			return s, err
		}
		say("%s: %s, serial %s, MAC %s, %s disks %s/%s, %d MiB", m.Name, strings.ToUpper(m.Firmware), m.Serial, m.MAC, cmp.Or(m.Disks[0].Bus, "virtio"), m.Disks[0].Serial, m.Disks[1].Serial, m.MemoryMiB)
	}

	if c.NoPowerOn {
		c.Until = UntilNone
	}
	werr := s.watch(ctx, a, c.Until, c.Wait, say)
	prog.Close()
	s.printUsage(c.Out)
	return s, werr
}

// newState names everything for a new lab.
func newState(ctx context.Context, c Config, bin Binaries) (*State, error) {
	id := randHex(2) // 4 hex digits: interface names stay under 15 bytes
	s := &State{ID: id, Dir: c.Dir, RunDir: filepath.Join(c.Dir, "run"), CreatedAt: time.Now().UTC(), Bin: bin,
		Namespace: "corral-lab-" + id, Bridge: "clbr" + id, VethHost: "clvh" + id, VethNS: "clvn" + id,
		WithBMC: c.WithBMC}
	s.DataDir = filepath.Join(s.RunDir, "data")
	s.ClientConfig = filepath.Join(c.Dir, "lab.conf")
	if linkExists(ctx, s.VethHost) || nsExists(ctx, s.Namespace) {
		return nil, fmt.Errorf("lab names for id %s are taken; run again", id)
	}
	used, err := hostPrefixes(ctx)
	if err != nil {
		return nil, err
	}
	var cands []netip.Prefix
	b := randByte()
	for i := 0; i < 64; i++ {
		third := byte(int(b)+i*7) % 255
		cands = append(cands, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 252, third, 0}), 30))
	}
	p, ok := freePrefix(cands, used)
	if !ok {
		return nil, errors.New("no free /30 in 10.252.0.0/16 for the host veth")
	}
	a := p.Addr().As4()
	a[3] = 1
	s.HostAddr = netip.AddrFrom4(a).String()
	a[3] = 2
	s.NSAddr = netip.AddrFrom4(a).String()
	// The bridge subnet lives only inside the namespace.
	s.Subnet = fmt.Sprintf("10.66.%d", randByte()%250+1)

	idb, _ := hex.DecodeString(id)
	for i := 0; i < c.Machines; i++ {
		n := i + 1
		fw := c.Firmware[i%len(c.Firmware)]
		name := fmt.Sprintf("lab-%d", n)
		dir := filepath.Join(s.RunDir, "machines", name)
		m := Machine{Name: name, Dir: dir, Firmware: fw,
			Serial: fmt.Sprintf("CLAB-%s-%02d", strings.ToUpper(id), n),
			Board:  fmt.Sprintf("CLBB-%s-%02d", strings.ToUpper(id), n),
			UUID:   uuid4(),
			MAC:    fmt.Sprintf("52:54:00:%02x:%02x:%02x", idb[0], idb[1], n),
			Tap:    fmt.Sprintf("clt%s%02d", id, n),
			Disks: []Disk{
				{Path: filepath.Join(dir, "disk-a.raw"), Serial: fmt.Sprintf("CLD%s%02dA", strings.ToUpper(id), n), GiB: 8},
				{Path: filepath.Join(dir, "disk-b.raw"), Serial: fmt.Sprintf("CLD%s%02dB", strings.ToUpper(id), n), GiB: 20},
			},
			MemoryMiB: c.MemoryMiB, CPUs: c.CPUs}
		m.TPM = len(c.TPM) == 0 || c.TPM[i%len(c.TPM)] != "none"
		if len(c.DiskBus) > 0 && c.DiskBus[i%len(c.DiskBus)] == "nvme" {
			for d := range m.Disks {
				m.Disks[d].Bus = "nvme"
			}
		}
		if c.WithBMC {
			m.BMCPort, m.VMPort = 6230+n, 9000+n
			m.BMCUser, m.BMCPwFile = "admin", filepath.Join(dir, "bmc-password")
		}
		s.Machines = append(s.Machines, m)
	}
	if c.Appliances > 1 {
		s.planFleet(c.Appliances, c.ApplianceDHCP)
	}
	return s, nil
}

// binaries builds corrald and corral into dir/bin when inside the
// module (or src is given), else finds them beside the executable or on
// PATH.
func binaries(ctx context.Context, dir, src string) (Binaries, string, error) {
	if src == "" {
		src, _ = findSource()
	}
	if src != "" {
		binDir := filepath.Join(dir, "bin")
		if err := os.MkdirAll(binDir, 0o755); err != nil {
			return Binaries{}, "", err
		}
		cmd := exec.CommandContext(ctx, "go", "build", "-o", binDir+"/", "./cmd/corrald", "./cmd/corral")
		cmd.Dir = src
		if out, err := cmd.CombinedOutput(); err != nil {
			return Binaries{}, "", fmt.Errorf("go build: %v\n%s", err, out)
		}
		return Binaries{Corrald: filepath.Join(binDir, "corrald"), Corral: filepath.Join(binDir, "corral")}, src, nil
	}
	var b Binaries
	for _, p := range []*string{&b.Corrald, &b.Corral} {
		name := "corrald"
		if p == &b.Corral {
			name = "corral"
		}
		if exe, err := os.Executable(); err == nil {
			if cand := filepath.Join(filepath.Dir(exe), name); fileExists(cand) {
				*p = cand
				continue
			}
		}
		lp, err := exec.LookPath(name)
		if err != nil {
			return b, "", fmt.Errorf("%s not found beside corral-lab or on PATH, and not inside the Corral source tree (--source)", name)
		}
		*p, _ = filepath.Abs(lp)
	}
	return b, "", nil
}

// findSource is the Corral source tree around the working directory,
// usable only with a Go toolchain to build it.
func findSource() (string, error) {
	dir, err := sourcetree.FindFromWorkingDir()
	if err != nil {
		return "", err
	}
	if _, err := exec.LookPath("go"); err != nil {
		return "", err
	}
	return dir, nil
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// corraldHas reports whether `corrald serve` knows a flag.
func corraldHas(ctx context.Context, corrald, flag string) bool {
	out, _ := exec.CommandContext(ctx, corrald, "serve", "--help").CombinedOutput()
	return strings.Contains(string(out), "--"+flag+" ")
}

// startCorrald runs corrald in the namespace, detached, and waits until
// its API answers through the host veth.
func (s *State) startCorrald(ctx context.Context, c Config) error {
	args := []string{"netns", "exec", s.Namespace, s.Bin.Corrald, "serve", "--data-dir", s.DataDir,
		"--api-listen", fmt.Sprintf(":%d", APIPort), "--api-san", s.NSAddr,
		"--boot-interface", s.Bridge, "--dhcp-mode", "full",
		"--dhcp-range", s.Subnet + ".100-" + s.Subnet + ".199", "--dhcp-router", s.Subnet + ".1",
		"--bmc-poll-interval", "15s"}
	if corraldHas(ctx, s.Bin.Corrald, "web-listen") {
		args = append(args, "--web-listen", fmt.Sprintf(":%d", WebPort))
		s.Web = true
	}
	if c.Accept && corraldHas(ctx, s.Bin.Corrald, "auto-accept") {
		args = append(args, "--auto-accept")
		s.AutoAccept = true
	}
	args = append(args, c.CorraldArgs...)
	s.CorraldArgs = args[3:]
	pid, err := startDetached(filepath.Join(s.RunDir, "corrald.log"), args...)
	if err != nil {
		return err
	}
	// ip netns exec execs corrald: the pid is corrald's.
	s.Corrald = Process{PID: pid, Marker: s.DataDir}
	if err := s.Save(); err != nil {
		return err
	}
	return s.waitAPI(ctx, s.Corrald, filepath.Join(s.RunDir, "corrald.log"), filepath.Join(s.DataDir, "admin.conf"),
		s.ClientConfig, fmt.Sprintf("%s:%d", s.NSAddr, APIPort))
}

// waitAPI waits until the corrald p answers the API at endpoint (from the
// host) with the credentials of admin (an appliance's admin.conf),
// writing clientConf (admin with endpoint) on the way.
func (s *State) waitAPI(ctx context.Context, p Process, logPath, admin, clientConf, endpoint string) error {
	deadline := time.Now().Add(90 * time.Second)
	for {
		if !alive(p.PID, p.Marker) {
			b, _ := os.ReadFile(logPath)
			return fmt.Errorf("corrald exited:\n%s", tail(string(b), 3000))
		}
		if cfg, err := clientconfig.Load(admin); err == nil {
			cfg.Endpoint = endpoint
			if err := cfg.Write(clientConf); err != nil {
				return err
			}
			if a, err := dialConfig(clientConf); err == nil {
				_, err := a.snapshot(ctx, s)
				a.Close()
				if err == nil {
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("corrald's API did not answer on %s within 90s (log %s)", endpoint, logPath)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// startSim runs a machine's ipmi_sim in the namespace, detached, and
// waits until it answers an RMCP presence ping.
func (s *State) startSim(ctx context.Context, m *Machine) error {
	pid, err := startDetached(filepath.Join(m.Dir, "ipmi_sim.log"), "netns", "exec", s.Namespace, "ipmi_sim",
		"-c", filepath.Join(m.Dir, "lan.conf"), "-f", filepath.Join(m.Dir, "sim.emu"), "-s", filepath.Join(m.Dir, "sim-state"), "-n")
	if err != nil {
		return err
	}
	m.Sim = Process{PID: pid, Marker: filepath.Join(m.Dir, "lan.conf")}
	deadline := time.Now().Add(10 * time.Second)
	for {
		// ipmitool's RMCP+ session proves the BMC, user and cipher work.
		err := exec.CommandContext(ctx, "ip", "netns", "exec", s.Namespace, "ipmitool", "-I", "lanplus", "-C", "3",
			"-H", "127.0.0.1", "-p", fmt.Sprint(m.BMCPort), "-U", m.BMCUser, "-f", m.BMCPwFile, "-R", "1", "-N", "1", "chassis", "power", "status").Run()
		if err == nil {
			return nil
		}
		if !alive(pid, m.Sim.Marker) {
			b, _ := os.ReadFile(filepath.Join(m.Dir, "ipmi_sim.log"))
			return fmt.Errorf("%s: ipmi_sim exited: %s", m.Name, tail(string(b), 2000))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: ipmi_sim did not answer on 127.0.0.1:%d in %s", m.Name, m.BMCPort, s.Namespace)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// chassis runs a machine's chassis program in the namespace.
func (s *State) chassis(ctx context.Context, m Machine, args ...string) error {
	out, err := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", s.Namespace, m.Chassis()}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s chassis %s: %v: %s", m.Name, strings.Join(args, " "), err, out)
	}
	return nil
}

// corral runs the corral CLI against the lab from the host; its error
// carries the CLI's output.
func (s *State) corral(ctx context.Context, args ...string) error {
	full := append([]string{"--config", s.ClientConfig}, args...)
	out, err := exec.CommandContext(ctx, s.Bin.Corral, full...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("corral %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// printUsage tells how to reach the lab.
func (s *State) printUsage(w io.Writer) {
	fmt.Fprintf(w, `
The lab is up (id %s). Point corral at it from this host:

  export CORRAL_CONFIG=%s
  %s get machines
  %s get nodes

or pass --config %s to each call (corrald answers on %s:%d through veth %s).
Inside the namespace (admin.conf talks to 127.0.0.1):

  ip netns exec %s %s --config %s get machines

corral-lab status | report | down (--dir %s)
`, s.ID, s.ClientConfig, s.Bin.Corral, s.Bin.Corral, s.ClientConfig, s.NSAddr, APIPort, s.VethHost,
		s.Namespace, s.Bin.Corral, filepath.Join(s.DataDir, "admin.conf"), s.Dir)
	if s.Web {
		fmt.Fprintf(w, "\nThe rack's web page: https://%s:%d/ (the certificate is signed by the CA in %s;\nsign in with its token). Metrics: http://%s:9180/metrics\n", s.NSAddr, WebPort, s.ClientConfig, s.NSAddr)
	}
	if !s.Fleet() {
		return
	}
	fmt.Fprintf(w, "\nA fleet of %d appliances on etcd (prefix %s); each serves the whole API:\n\n", len(s.Appliances), s.EtcdPrefix)
	for _, a := range s.Appliances {
		what := "HTTP boot, API"
		if a.DHCP {
			what = "DHCP, TFTP, HTTP boot, API"
		}
		fmt.Fprintf(w, "  %-8s %s --config %s get machines    # %s on %s, log %s\n", a.Name, s.Bin.Corral, a.ClientConfig, what, a.Endpoint(), a.Log)
	}
	fmt.Fprintf(w, "\netcd from the host: etcdctl --endpoints %s get --prefix %s --keys-only\n", s.etcdHostEndpoints(), s.EtcdPrefix)
}

// etcdHostEndpoints are the members' client URLs from the host.
func (s *State) etcdHostEndpoints() string {
	var eps []string
	for _, m := range s.Etcd {
		eps = append(eps, m.HostURL)
	}
	return strings.Join(eps, ",")
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func randByte() byte {
	b := make([]byte, 1)
	_, _ = rand.Read(b)
	return b[0]
}

func uuid4() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
