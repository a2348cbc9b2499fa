package vm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corralhq/corral/hypervisor/cloudinit"
	"github.com/corralhq/corral/hypervisor/netdev"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/testsupport/require"
)

func needQEMU(t *testing.T) {
	t.Helper()
	require.Root(t, "taps, network namespaces")
	require.Tool(t, "qemu-system-x86_64", "qemu-img", "ip")
}

func testNetNS(t *testing.T) string {
	t.Helper()
	name := fmt.Sprintf("crl-vm-%d-%d", os.Getpid(), time.Now().UnixNano()%100000)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	return name
}

// syncBuf is a log sink tests can read while the manager writes.
type syncBuf struct {
	mu  chan struct{}
	buf bytes.Buffer
}

func newSyncBuf() *syncBuf { return &syncBuf{mu: make(chan struct{}, 1)} }
func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu <- struct{}{}
	defer func() { <-s.mu }()
	return s.buf.Write(p)
}
func (s *syncBuf) String() string {
	s.mu <- struct{}{}
	defer func() { <-s.mu }()
	return s.buf.String()
}

func waitConsole(t *testing.T, path, want string, count int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(path)
		if strings.Count(string(b), want) >= count {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
	b, _ := os.ReadFile(path)
	t.Fatalf("console never showed %q x%d within %v; console:\n%s", want, count, timeout, tail(string(b), 3000))
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// TestRealVM drives one tiny guest under QEMU through the whole life
// cycle: boot with a NoCloud seed on virtio-scsi and a NIC on a tap in a
// namespace, console check, soft and hard reboot, ACPI shutdown, restart,
// QEMU killed by hand, a new Manager rediscovering the VM, delete with
// nothing left behind.
func TestRealVM(t *testing.T) {
	needQEMU(t)
	ctx := context.Background()
	work := t.TempDir()
	kernel, initrd := tinyGuest(t, work)

	ns := testNetNS(t)
	nets, err := netdev.NewManager(netdev.Config{NetNSPath: "/var/run/netns/" + ns})
	if err != nil {
		t.Fatal(err)
	}
	network := "tn-" + ns
	if _, err := nets.ApplyNetwork(netdev.Network{Name: network, GatewayCIDR: "10.99.0.1/24"}); err != nil {
		t.Fatal(err)
	}
	logs := newSyncBuf()
	cfg := Config{
		Dir:             filepath.Join(work, "vms"),
		Wrapper:         []string{"ip", "netns", "exec", ns},
		Vhost:           netdev.VhostAvailable(),
		Net:             nets,
		ShutdownTimeout: 30 * time.Second,
		StartTimeout:    60 * time.Second,
		Logger:          slog.New(slog.NewTextHandler(logs, nil)),
	}
	t.Logf("vhost-net available: %v", cfg.Vhost)
	start := time.Now()
	m, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("accelerator %s decided in %v; log: %s", m.Accel(), time.Since(start).Round(time.Millisecond), firstLineWith(logs.String(), "accel"))

	rootDisk := filepath.Join(work, "root.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", rootDisk, "64M").CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	host := "tiny-" + fmt.Sprint(time.Now().UnixNano()%100000)
	spec := Spec{
		Name: "tiny", UUID: "3f2a6c1e-0000-4000-8000-0000000000aa", VCPUs: 1, MemoryBytes: 256 << 20,
		Disks:  []Disk{{Volume: "root", Path: rootDisk, BootIndex: 1}},
		NICs:   []NIC{{Network: network, MAC: "52:54:00:c0:ff:ee"}},
		Seed:   &cloudinit.Seed{InstanceID: "tiny-1", Hostname: host, NICs: []cloudinit.NIC{{MAC: "52:54:00:c0:ff:ee"}}},
		Kernel: kernel, Initrd: initrd, Append: "console=ttyS0 loglevel=4 panic=-1",
	}
	start = time.Now()
	v, err := m.Boot(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("BENCH boot to QEMU running: %v (pid %d, console %s)", time.Since(start).Round(time.Millisecond), v.PID, v.Console)
	if v.State != Running {
		t.Fatalf("state %v %s", v.State, v.Reason)
	}
	waitConsole(t, v.SerialLog, "CORRAL-TINY seed=/dev/sr0", 1, 180*time.Second)
	waitConsole(t, v.SerialLog, "CORRAL-TINY hostname="+host+" ", 1, 60*time.Second)
	waitConsole(t, v.SerialLog, "CORRAL-TINY cloud-init done", 1, 60*time.Second)
	t.Logf("BENCH boot to guest read its seed: %v", time.Since(start).Round(time.Millisecond))
	if b, _ := os.ReadFile(v.SerialLog); !strings.Contains(string(b), "mac=52:54:00:c0:ff:ee") {
		t.Errorf("guest does not see its NIC; console:\n%s", tail(string(b), 2000))
	}
	links, _ := nets.Links()
	if !hasLink(links, netdev.TapName("tiny", 0), netdev.BridgeName(network)) {
		t.Errorf("tap not on bridge: %+v", links)
	}

	// Soft reboot: Ctrl-Alt-Del (the tiny init leaves the kernel's default
	// C-A-D action, an immediate restart).
	if _, err := m.Reboot(ctx, "tiny", false); err != nil {
		t.Fatal(err)
	}
	waitConsole(t, v.SerialLog, "CORRAL-TINY cloud-init done", 2, 180*time.Second)
	// Hard reboot.
	if _, err := m.Reboot(ctx, "tiny", true); err != nil {
		t.Fatal(err)
	}
	waitConsole(t, v.SerialLog, "CORRAL-TINY cloud-init done", 3, 180*time.Second)

	// ACPI shutdown: the guest sees the power button and powers off.
	start = time.Now()
	if v, err = m.Shutdown(ctx, "tiny", false); err != nil {
		t.Fatal(err)
	}
	t.Logf("ACPI shutdown took %v", time.Since(start).Round(time.Millisecond))
	if v.State != Shutdown {
		t.Fatalf("after shutdown: %v %s", v.State, v.Reason)
	}
	waitConsole(t, v.SerialLog, "CORRAL-TINY poweroff", 1, time.Second)
	if !strings.Contains(logs.String(), "guest powered off") {
		t.Errorf("shutdown was not clean; logs:\n%s", logs.String())
	}
	if _, err := m.Reboot(ctx, "tiny", false); err == nil {
		t.Errorf("reboot of a shut down VM succeeded")
	}

	// Boot again (QEMU restarted from the stored directory).
	if v, err = m.Boot(ctx, spec); err != nil || v.State != Running {
		t.Fatalf("boot after shutdown: %+v %v", v, err)
	}
	waitConsole(t, v.SerialLog, "CORRAL-TINY cloud-init done", 4, 180*time.Second)

	// Kill QEMU by hand: the VM shows as failed, not running.
	if err := syscall.Kill(v.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, _ := m.Get(ctx, "tiny")
		if got.State == Failed {
			t.Logf("after kill -9: %v (%s)", got.State, got.Reason)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after kill: state %v", got.State)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if v, err = m.Boot(ctx, spec); err != nil || v.State != Running {
		t.Fatalf("boot after kill: %+v %v", v, err)
	}
	pid := v.PID

	// A new manager over the same directory (agent restart) finds it.
	cfg.Accel = "tcg"
	m2, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	vms, err := m2.List(ctx)
	if err != nil || len(vms) != 1 || vms[0].State != Running || vms[0].PID != pid || vms[0].Spec.Seed.Hostname != host {
		t.Fatalf("rediscovered %+v %v", vms, err)
	}
	if !strings.Contains(logs.String(), "vm found") {
		t.Errorf("restart did not log the VM it found")
	}

	// Delete: process, tap and directory gone; the bridge then deletes.
	if _, err := m2.Delete(ctx, "tiny"); err != nil {
		t.Fatal(err)
	}
	if pidIsVM(pid, "tiny") {
		t.Errorf("qemu pid %d survives delete", pid)
	}
	if _, err := os.Stat(filepath.Join(cfg.Dir, "tiny")); !os.IsNotExist(err) {
		t.Errorf("vm directory left: %v", err)
	}
	if _, err := m2.Get(ctx, "tiny"); !errors.Is(err, apierr.ErrNotFound) {
		t.Errorf("get after delete: %v", err)
	}
	if err := nets.DeleteNetwork(network); err != nil {
		t.Fatal(err)
	}
	if links, _ := nets.Links(); len(links) != 0 {
		t.Errorf("left behind: %+v", links)
	}
}

// TestQEMUStartFailure: QEMU refusing to start leaves nothing behind.
func TestQEMUStartFailure(t *testing.T) {
	needQEMU(t)
	ctx := context.Background()
	work := t.TempDir()
	ns := testNetNS(t)
	nets, _ := netdev.NewManager(netdev.Config{NetNSPath: "/var/run/netns/" + ns})
	network := "tf-" + ns
	if _, err := nets.ApplyNetwork(netdev.Network{Name: network}); err != nil {
		t.Fatal(err)
	}
	m, err := New(ctx, Config{Dir: filepath.Join(work, "vms"), Accel: "tcg", Wrapper: []string{"ip", "netns", "exec", ns}, Net: nets})
	if err != nil {
		t.Fatal(err)
	}
	spec := Spec{Name: "broken", VCPUs: 1, MemoryBytes: 64 << 20,
		Disks: []Disk{{Volume: "gone", Path: filepath.Join(work, "does-not-exist.qcow2")}},
		NICs:  []NIC{{Network: network, MAC: "52:54:00:00:00:02"}},
		Seed:  &cloudinit.Seed{InstanceID: "b", Hostname: "broken"}}
	_, err = m.Boot(ctx, spec)
	if err == nil || !strings.Contains(err.Error(), "qemu failed to start") || !strings.Contains(err.Error(), "does-not-exist.qcow2") {
		t.Fatalf("err %v, want a clear qemu start error", err)
	}
	t.Logf("error: %v", err)
	if _, err := os.Stat(filepath.Join(work, "vms", "broken")); !os.IsNotExist(err) {
		t.Errorf("vm directory left behind: %v", err)
	}
	links, _ := nets.Links()
	if len(links) != 1 { // the bridge only
		t.Errorf("links left: %+v", links)
	}
	// A NIC on a network that was never applied: refused, nothing left.
	spec.Disks = nil
	spec.NICs = []NIC{{Network: "never-applied", MAC: "52:54:00:00:00:03"}}
	if _, err := m.Boot(ctx, spec); !errors.Is(err, apierr.ErrNotFound) {
		t.Errorf("unknown network: %v", err)
	}
	if _, err := os.Stat(filepath.Join(work, "vms", "broken")); !os.IsNotExist(err) {
		t.Errorf("vm directory left behind: %v", err)
	}
	if err := nets.DeleteNetwork(network); err != nil {
		t.Fatal(err)
	}
}

func hasLink(links []netdev.Link, name, master string) bool {
	for _, l := range links {
		if l.Name == name && l.Master == master {
			return true
		}
	}
	return false
}

func firstLineWith(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}
