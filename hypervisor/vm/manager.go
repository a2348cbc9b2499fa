package vm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/corralhq/corral/hypervisor/internal/durable"
	"github.com/corralhq/corral/hypervisor/internal/namelock"
	"github.com/corralhq/corral/hypervisor/internal/safename"
	"github.com/corralhq/corral/hypervisor/netdev"
	"github.com/corralhq/corral/internal/apierr"
)

// Network creates and removes the taps of VM NICs (netdev.Manager
// implements it).
type Network interface {
	CreateTap(netdev.Tap) error
	DeleteTap(name string) error
}

// Config configures a Manager.
type Config struct {
	// Dir holds one directory per VM; created with mode 0700.
	Dir string
	// QEMU is the emulator binary (default DefaultQEMU of Arch).
	QEMU string
	// Arch is the architecture of the guests (default the node's own,
	// runtime.GOARCH); tests run arm64 guests on an amd64 host.
	Arch string
	// Firmware is the UEFI firmware arm64 guests without a kernel boot
	// through (default DefaultARM64Firmware); amd64 guests use SeaBIOS.
	Firmware string
	// Accel is "auto" (default: probe KVM, fall back to TCG), "kvm" or
	// "tcg".
	Accel string
	// AccelProbe, when set, decides instead of Accel, in the background:
	// New does not wait for it; a VM start does (within StartTimeout).
	AccelProbe *AccelProbe
	// Wrapper prefixes the QEMU command line (tests run QEMU in a network
	// namespace with "ip netns exec NS").
	Wrapper []string
	// Vhost enables vhost-net on taps (netdev.VhostAvailable()).
	Vhost bool
	// Net creates taps; nil refuses VMs with NICs.
	Net Network
	// ShutdownTimeout is how long an ACPI shutdown may take before the VM
	// is stopped hard (default 60 s).
	ShutdownTimeout time.Duration
	// StartTimeout bounds starting QEMU and resuming it (default 60 s).
	StartTimeout time.Duration
	// Logger; nil discards.
	Logger *slog.Logger
}

// State is a VM's run state as the node sees it.
type State int

// States.
const (
	StateUnspecified State = iota
	Running
	Shutdown
	Paused
	Failed
)

func (s State) String() string {
	switch s {
	case Running:
		return "running"
	case Shutdown:
		return "shutdown"
	case Paused:
		return "paused"
	case Failed:
		return "failed"
	default: // StateUnspecified and values out of range
		return "unspecified"
	}
}

// VM is one VM as found on the node.
type VM struct {
	Spec  Spec
	State State
	// Reason explains Failed and Paused states (QEMU's status, or that the
	// process is gone).
	Reason string
	PID    int
	// Console is the VNC endpoint ("unix:/path/vnc.sock").
	Console string
	// SerialLog is the file the serial console is logged to.
	SerialLog string
	// Serial is the serial port's unix socket (QEMU's chardev server,
	// one connection at a time).
	Serial string
}

// Manager starts, stops and inspects the VMs of one node. Operations on
// one VM are serialised; different VMs proceed in parallel. All state is on
// disk, so several Managers over one directory in sequence (agent
// restarts) see the same VMs.
type Manager struct {
	cfg   Config
	log   *slog.Logger
	accel Accel

	locks namelock.Table
}

// New validates cfg, creates the directory and decides the accelerator
// (which may take a few seconds: see DetectAccel). It logs the VMs it
// finds.
func New(ctx context.Context, cfg Config) (*Manager, error) {
	if cfg.Dir == "" {
		return nil, apierr.Invalidf("vm: Dir is required")
	}
	abs, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, err
	}
	cfg.Dir = abs
	if cfg.Arch == "" {
		cfg.Arch = runtime.GOARCH
	}
	if cfg.QEMU == "" {
		cfg.QEMU = DefaultQEMU(cfg.Arch)
	}
	if cfg.Firmware == "" && cfg.Arch == "arm64" {
		cfg.Firmware = DefaultARM64Firmware
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 60 * time.Second
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 60 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("vm: create %s: %w", cfg.Dir, err)
	}
	// VM directories a crash caught halfway through Delete.
	if swept, err := durable.SweepTrash(cfg.Dir); err != nil {
		log.Warn("removing deleted vm directories left by a crash", "dir", cfg.Dir, "err", err)
	} else if len(swept) > 0 {
		log.Info("removed deleted vm directories left by a crash", "dir", cfg.Dir, "count", len(swept))
	}
	if err := CheckAccel(cfg.Accel); err != nil {
		return nil, err
	}
	m := &Manager{cfg: cfg, log: log}
	switch {
	case cfg.AccelProbe != nil:
		log.Info("accelerator decided in the background: VM starts wait for it")
	case cfg.Accel == "", cfg.Accel == "auto":
		var why string
		m.accel, why = DetectAccel(ctx, cfg.QEMU, cfg.Wrapper, cfg.Dir)
		if m.accel == TCG {
			log.Warn("KVM unusable, VMs run under TCG emulation (slow)", "accel", "tcg", "reason", why)
		} else {
			log.Info("using KVM", "accel", "kvm", "reason", why)
		}
	case cfg.Accel == "kvm":
		m.accel = KVM
	case cfg.Accel == "tcg":
		m.accel = TCG
		log.Info("TCG emulation forced by configuration", "accel", "tcg")
	}
	vms, err := m.List(ctx)
	if err != nil {
		return nil, err
	}
	for _, v := range vms {
		log.Info("vm found", "vm", v.Spec.Name, "state", v.State.String(), "pid", v.PID, "reason", v.Reason)
	}
	return m, nil
}

// Accel returns the accelerator VMs are started with; "" while
// Config.AccelProbe has not decided.
func (m *Manager) Accel() Accel {
	if p := m.cfg.AccelProbe; p != nil {
		a, _, _ := p.Result()
		return a
	}
	return m.accel
}

// startAccel is the accelerator for a VM start: Config.AccelProbe's
// answer (waited for within ctx), else the one New decided.
func (m *Manager) startAccel(ctx context.Context) (Accel, error) {
	p := m.cfg.AccelProbe
	if p == nil {
		return m.accel, nil
	}
	if _, _, ok := p.Result(); !ok {
		m.log.Info("vm start waits for the accelerator probe")
	}
	a, _, err := p.Wait(ctx) // the probe's owner logs its answer
	if err != nil {
		return "", fmt.Errorf("accelerator not decided: %w", err)
	}
	return a, nil
}

func (m *Manager) dir(name string) string { return filepath.Join(m.cfg.Dir, name) }

const (
	specFile    = "spec.json"
	desiredFile = "desired"
)

// Boot creates and starts the VM of spec, or starts an existing one: a
// VM whose QEMU is running is resumed (and reset first if the guest had
// powered off); a VM whose QEMU is gone is started again with spec. On a
// failed start nothing is left behind: no tap, no pid file and, for a new
// VM, no directory.
func (m *Manager) Boot(ctx context.Context, spec Spec) (VM, error) {
	if err := spec.Validate(); err != nil {
		return VM{}, err
	}
	if len(spec.NICs) > 0 && m.cfg.Net == nil {
		return VM{}, apierr.Invalidf("vm %q: this node has no network manager for NICs", spec.Name)
	}
	defer m.locks.Lock(spec.Name)()
	dir := m.dir(spec.Name)
	p := PathsFor(dir)
	if m.cfg.Arch == "arm64" && spec.Kernel == "" {
		if _, err := os.Stat(m.cfg.Firmware); err != nil {
			return VM{}, apierr.Preconditionf("vm %q: an arm64 guest without a kernel boots through UEFI firmware, and this node has none: %v (Debian's qemu-efi-aarch64)", spec.Name, err)
		}
		p.Firmware = m.cfg.Firmware
	}
	_, statErr := os.Stat(dir)
	isNew := os.IsNotExist(statErr)
	if !isNew {
		if pid, ok := processAlive(p.PIDFile, spec.Name); ok {
			if old, err := m.readSpec(spec.Name); err == nil && !sameSpec(old, spec) {
				m.log.Info("vm already running: spec changes apply at its next start", "vm", spec.Name)
			}
			return m.resume(ctx, spec.Name, p, pid)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, m.cfg.StartTimeout)
	defer cancel()
	start := time.Now()
	accel, err := m.startAccel(ctx)
	if err != nil {
		return VM{}, fmt.Errorf("vm %q: %w", spec.Name, err)
	}
	var undo []func()
	rollback := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	if isNew {
		if err := os.Mkdir(dir, 0o700); err != nil {
			return VM{}, fmt.Errorf("vm %q: %w", spec.Name, err)
		}
		undo = append(undo, func() {
			if err := durable.RemoveAll(dir); err != nil {
				m.log.Warn("rollback: remove vm directory", "vm", spec.Name, "err", err)
			}
		})
		if err := durable.SyncDir(filepath.Dir(dir)); err != nil {
			return VM{}, fmt.Errorf("vm %q: %w", spec.Name, err)
		}
	}
	spec.NICs = slices.Clone(spec.NICs)
	for i := range spec.NICs {
		spec.NICs[i].Tap = netdev.TapName(spec.Name, i)
	}
	if spec.Seed != nil {
		if err := writeSeed(p.Seed, spec.Seed); err != nil {
			rollback()
			return VM{}, fmt.Errorf("vm %q: %w", spec.Name, err)
		}
		if !isNew {
			undo = append(undo, func() { os.Remove(p.Seed) })
		}
	}
	for i, n := range spec.NICs {
		if err := m.cfg.Net.CreateTap(netdev.Tap{Name: n.Tap, Network: n.Network, Owner: spec.Name + "/" + strconv.Itoa(i)}); err != nil {
			rollback()
			return VM{}, fmt.Errorf("vm %q: nic %d: %w", spec.Name, i, err)
		}
		tap := n.Tap
		undo = append(undo, func() {
			if err := m.cfg.Net.DeleteTap(tap); err != nil {
				m.log.Warn("rollback: delete tap", "vm", spec.Name, "tap", tap, "err", err)
			}
		})
	}
	for _, f := range []string{p.PIDFile, p.QMP, p.Serial, p.VNC} {
		os.Remove(f)
	}
	undo = append(undo, func() {
		if pid, ok := processAlive(p.PIDFile, spec.Name); ok {
			killWait(pid, spec.Name, 5*time.Second)
		}
		for _, f := range []string{p.PIDFile, p.QMP, p.Serial, p.VNC} {
			os.Remove(f)
		}
	})
	args := append(append(slices.Clone(m.cfg.Wrapper), m.cfg.QEMU), ArgsFor(m.cfg.Arch, spec, p, accel, m.cfg.Vhost)...)
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		rollback()
		return VM{}, fmt.Errorf("vm %q: qemu failed to start: %v: %s", spec.Name, err, strings.TrimSpace(out.String()))
	}
	pid, ok := processAlive(p.PIDFile, spec.Name)
	if !ok {
		rollback()
		return VM{}, fmt.Errorf("vm %q: qemu exited right after starting: %s", spec.Name, strings.TrimSpace(out.String()))
	}
	if _, err := qmpRun(ctx, p.QMP, "cont", nil); err != nil {
		rollback()
		return VM{}, fmt.Errorf("vm %q: resume over QMP: %w", spec.Name, err)
	}
	if err := writeFileAtomic(filepath.Join(dir, specFile), mustJSON(spec)); err != nil {
		rollback()
		return VM{}, fmt.Errorf("vm %q: %w", spec.Name, err)
	}
	if err := writeFileAtomic(filepath.Join(dir, desiredFile), []byte("running\n")); err != nil {
		rollback()
		return VM{}, fmt.Errorf("vm %q: %w", spec.Name, err)
	}
	m.log.Info("vm started", "vm", spec.Name, "pid", pid, "accel", string(accel), "vcpus", spec.VCPUs,
		"memory_bytes", spec.MemoryBytes, "duration", time.Since(start).Round(time.Millisecond))
	return m.get(ctx, spec.Name)
}

// resume continues a VM whose QEMU runs: reset first if the guest powered
// off, then cont.
func (m *Manager) resume(ctx context.Context, name string, p Paths, pid int) (VM, error) {
	st, err := queryStatus(ctx, p.QMP)
	if err != nil {
		return VM{}, apierr.Unavailablef("vm %q: qemu pid %d does not answer QMP: %v", name, pid, err)
	}
	if st == "shutdown" || st == "guest-panicked" || st == "internal-error" {
		if _, err := qmpRun(ctx, p.QMP, "system_reset", nil); err != nil {
			return VM{}, fmt.Errorf("vm %q: %w", name, err)
		}
	}
	if st != "running" {
		if _, err := qmpRun(ctx, p.QMP, "cont", nil); err != nil {
			return VM{}, fmt.Errorf("vm %q: %w", name, err)
		}
		m.log.Info("vm resumed", "vm", name, "was", st)
	}
	if err := writeFileAtomic(filepath.Join(p.Dir, desiredFile), []byte("running\n")); err != nil {
		return VM{}, err
	}
	return m.get(ctx, name)
}

// Reboot restarts the guest: hard is a reset, otherwise Ctrl-Alt-Del is
// sent (Linux guests reboot cleanly). The VM's QEMU must be running.
func (m *Manager) Reboot(ctx context.Context, name string, hard bool) (VM, error) {
	if err := safename.Check("vm", name); err != nil {
		return VM{}, err
	}
	defer m.locks.Lock(name)()
	v, err := m.get(ctx, name)
	if err != nil {
		return VM{}, err
	}
	if v.State != Running {
		return VM{}, apierr.Preconditionf("vm %q is %s, not running", name, v.State)
	}
	p := PathsFor(m.dir(name))
	if hard {
		_, err = qmpRun(ctx, p.QMP, "system_reset", nil)
	} else {
		_, err = qmpRun(ctx, p.QMP, "send-key", map[string]any{"keys": []map[string]string{
			{"type": "qcode", "data": "ctrl"}, {"type": "qcode", "data": "alt"}, {"type": "qcode", "data": "delete"}}})
	}
	if err != nil {
		return VM{}, fmt.Errorf("vm %q: reboot: %w", name, err)
	}
	m.log.Info("vm rebooted", "vm", name, "hard", hard)
	return m.get(ctx, name)
}

// Shutdown powers the VM off and ends its QEMU process. Without hard the
// ACPI power button is pressed first and the guest gets ShutdownTimeout
// (or until ctx ends) to power off before QEMU is stopped anyway. The VM
// stays defined (state Shutdown) until Delete.
func (m *Manager) Shutdown(ctx context.Context, name string, hard bool) (VM, error) {
	if err := safename.Check("vm", name); err != nil {
		return VM{}, err
	}
	defer m.locks.Lock(name)()
	if _, err := m.readSpec(name); err != nil {
		return VM{}, err
	}
	p := PathsFor(m.dir(name))
	if err := writeFileAtomic(filepath.Join(p.Dir, desiredFile), []byte("shutdown\n")); err != nil {
		return VM{}, err
	}
	pid, ok := processAlive(p.PIDFile, name)
	if ok {
		if !hard {
			m.acpiShutdown(ctx, name, p)
		}
		m.stop(ctx, name, p, pid)
	}
	return m.get(ctx, name)
}

// acpiShutdown presses the power button and waits for the guest to power
// off (QEMU's status "shutdown", thanks to -no-shutdown).
func (m *Manager) acpiShutdown(ctx context.Context, name string, p Paths) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.ShutdownTimeout)
	defer cancel()
	if _, err := qmpRun(ctx, p.QMP, "system_powerdown", nil); err != nil {
		m.log.Warn("acpi shutdown failed; stopping hard", "vm", name, "err", err)
		return
	}
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			m.log.Warn("guest did not power off in time; stopping hard", "vm", name, "timeout", m.cfg.ShutdownTimeout)
			return
		case <-t.C:
		}
		st, err := queryStatus(ctx, p.QMP)
		switch {
		case ctx.Err() != nil:
			m.log.Warn("guest did not power off in time; stopping hard", "vm", name, "timeout", m.cfg.ShutdownTimeout)
			return
		case err != nil:
			m.log.Info("qemu stopped answering during shutdown", "vm", name, "err", err)
			return
		case st == "shutdown":
			m.log.Info("guest powered off", "vm", name)
			return
		}
	}
}

// stop ends the QEMU process: QMP quit, then SIGKILL if it lingers.
func (m *Manager) stop(ctx context.Context, name string, p Paths, pid int) {
	qctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, err := qmpRun(qctx, p.QMP, "quit", nil)
	cancel()
	if err != nil {
		m.log.Debug("qmp quit", "vm", name, "err", err)
	}
	killWait(pid, name, 10*time.Second)
	for _, f := range []string{p.PIDFile, p.QMP, p.Serial, p.VNC} {
		os.Remove(f)
	}
	m.log.Info("vm stopped", "vm", name, "pid", pid)
}

// Delete stops the VM hard, removes its taps and its directory, and
// returns its spec (the caller frees what it reserved). apierr.ErrNotFound if the
// VM does not exist.
func (m *Manager) Delete(ctx context.Context, name string) (Spec, error) {
	if err := safename.Check("vm", name); err != nil {
		return Spec{}, err
	}
	defer m.locks.Lock(name)()
	dir := m.dir(name)
	spec, err := m.readSpec(name)
	if err != nil && !errors.Is(err, apierr.ErrNotFound) {
		return Spec{}, err
	}
	if errors.Is(err, apierr.ErrNotFound) {
		if _, serr := os.Stat(dir); serr != nil {
			return Spec{}, err
		}
		spec = Spec{Name: name} // directory without spec: clean it anyway
	}
	p := PathsFor(dir)
	if pid, ok := processAlive(p.PIDFile, name); ok {
		m.stop(ctx, name, p, pid)
	}
	var errs []error
	for _, n := range spec.NICs {
		if n.Tap == "" || m.cfg.Net == nil {
			continue
		}
		if err := m.cfg.Net.DeleteTap(n.Tap); err != nil {
			errs = append(errs, err)
		}
	}
	// Durable and all-or-nothing: the directory is moved aside and that
	// synced before it is removed, so a power cut can neither bring the
	// VM back (Restore would start it again) nor leave half of it.
	if err := durable.RemoveAll(dir); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return spec, fmt.Errorf("vm %q: delete: %w", name, err)
	}
	m.log.Info("vm deleted", "vm", name)
	return spec, nil
}

// Get returns one VM (apierr.ErrNotFound if it does not exist).
func (m *Manager) Get(ctx context.Context, name string) (VM, error) {
	if err := safename.Check("vm", name); err != nil {
		return VM{}, err
	}
	defer m.locks.Lock(name)()
	return m.get(ctx, name)
}

// List returns every VM, sorted by name.
func (m *Manager) List(ctx context.Context) ([]VM, error) {
	entries, err := os.ReadDir(m.cfg.Dir)
	if err != nil {
		return nil, err
	}
	var out []VM
	for _, e := range entries {
		if !e.IsDir() || safename.Check("vm", e.Name()) != nil {
			continue
		}
		v, err := m.Get(ctx, e.Name())
		if errors.Is(err, apierr.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

func (m *Manager) readSpec(name string) (Spec, error) {
	b, err := os.ReadFile(filepath.Join(m.dir(name), specFile))
	if os.IsNotExist(err) {
		return Spec{}, apierr.NotFoundf("vm %q", name)
	}
	if err != nil {
		return Spec{}, err
	}
	var s Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return Spec{}, fmt.Errorf("vm %q: %s: %w", name, specFile, err)
	}
	return s, nil
}

// get computes the state of a VM from its files and its QEMU. The caller
// holds the VM's lock.
func (m *Manager) get(ctx context.Context, name string) (VM, error) {
	spec, err := m.readSpec(name)
	if err != nil {
		return VM{}, err
	}
	p := PathsFor(m.dir(name))
	v := VM{Spec: spec, Console: "unix:" + p.VNC, SerialLog: p.Console, Serial: p.Serial}
	pid, alive := processAlive(p.PIDFile, name)
	if !alive {
		desired, _ := os.ReadFile(filepath.Join(p.Dir, desiredFile))
		if strings.TrimSpace(string(desired)) == "shutdown" {
			v.State = Shutdown
		} else {
			v.State, v.Reason = Failed, "qemu is not running (exited or killed)"
		}
		return v, nil
	}
	v.PID = pid
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := queryStatus(qctx, p.QMP)
	if err != nil {
		v.State, v.Reason = Failed, "qmp: "+err.Error()
		return v, nil
	}
	switch st {
	case "running":
		v.State = Running
	case "shutdown":
		v.State, v.Reason = Shutdown, "guest powered off"
	case "internal-error", "io-error", "guest-panicked":
		v.State, v.Reason = Failed, st
	default:
		v.State, v.Reason = Paused, st
	}
	return v, nil
}

// processAlive reads a pid file and checks that the process exists, is
// not a zombie and is the QEMU of VM name (pids are reused).
func processAlive(pidFile, name string) (int, bool) {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, false
	}
	return pid, pidIsVM(pid, name)
}

func pidIsVM(pid int, name string) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	if i := bytes.LastIndexByte(stat, ')'); i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' || stat[i+2] == 'X' {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	return bytes.Contains(cmdline, []byte("\x00guest="+guestMarker(name)+",debug-threads=on\x00"))
}

// killWait sends SIGTERM, then SIGKILL after half of wait, and waits for
// the process to be gone.
func killWait(pid int, name string, wait time.Duration) {
	deadline := time.Now().Add(wait)
	killed := false
	for pidIsVM(pid, name) {
		// A failed kill (the process just went) shows in pidIsVM.
		if !killed && time.Now().After(deadline.Add(-wait/2)) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			killed = true
		} else if time.Now().After(deadline) {
			return
		}
		if !killed {
			_ = syscall.Kill(pid, syscall.SIGTERM)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// sameSpec compares specs ignoring the taps the Manager fills in.
func sameSpec(a, b Spec) bool {
	a.NICs, b.NICs = slices.Clone(a.NICs), slices.Clone(b.NICs)
	for i := range a.NICs {
		a.NICs[i].Tap = ""
	}
	for i := range b.NICs {
		b.NICs[i].Tap = ""
	}
	return bytes.Equal(mustJSON(a), mustJSON(b))
}

func mustJSON(v any) []byte {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		panic(err) // Spec always marshals
	}
	return b
}

// writeFileAtomic writes VM state durably: a node may lose power right
// after a call returns, and its VMs must come back after the reboot.
// It is readable by the node's user only (0600).
func writeFileAtomic(path string, data []byte) error {
	return durable.WriteFile(path, data, 0o600)
}
