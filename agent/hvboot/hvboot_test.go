package hvboot

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/corralhq/corral/agent/coldplug"
	"github.com/corralhq/corral/agent/install"
	"github.com/corralhq/corral/agent/netup"
	"github.com/corralhq/corral/agent/session"
	"github.com/corralhq/corral/testsupport/syncbuf"
)

func write(t *testing.T, path string, content []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, content, 0o644); err != nil {
		t.Fatal(err)
	}
}

// blockDev adds a block device to a fake root: its uevent and a /dev file,
// with an ext4 superblock labelled label when label is not empty.
func blockDev(t *testing.T, root, name, devtype, partname, label string) {
	t.Helper()
	ev := "MAJOR=253\nMINOR=1\nDEVNAME=" + name + "\nDEVTYPE=" + devtype + "\n"
	if partname != "" {
		ev += "PARTN=1\nPARTNAME=" + partname + "\n"
	}
	write(t, filepath.Join(root, "sys/class/block", name, "uevent"), []byte(ev))
	img := make([]byte, 4096)
	if label != "" {
		binary.LittleEndian.PutUint16(img[1024+0x38:], 0xEF53)
		copy(img[1024+0x78:], label)
	}
	write(t, filepath.Join(root, "dev", name), img)
}

func TestFindDataPartition(t *testing.T) {
	for name, tc := range map[string]struct {
		setup   func(t *testing.T, root string)
		want    string
		wantErr string
	}{
		"by GPT partition name": {setup: func(t *testing.T, root string) {
			blockDev(t, root, "vda", "disk", "", "")
			blockDev(t, root, "vda1", "partition", "EFI", "")
			blockDev(t, root, "vdb", "disk", "", "")
			blockDev(t, root, "vdb1", "partition", "corral-data", "")
		}, want: "vdb1"},
		"name wins over label": {setup: func(t *testing.T, root string) {
			blockDev(t, root, "sda1", "partition", "corral-data", "")
			blockDev(t, root, "sdb", "disk", "", "corral-data")
		}, want: "sda1"},
		"by ext4 label": {setup: func(t *testing.T, root string) {
			blockDev(t, root, "nvme0n1", "disk", "", "")
			blockDev(t, root, "nvme0n1p1", "partition", "", "corral-data")
			blockDev(t, root, "nvme0n1p2", "partition", "", "other")
		}, want: "nvme0n1p1"},
		"none": {setup: func(t *testing.T, root string) {
			blockDev(t, root, "vda", "disk", "", "")
			blockDev(t, root, "vda1", "partition", "root", "root")
		}, wantErr: `no block device has GPT partition name or ext4 label "corral-data" (was this machine installed? block devices: vda, vda1)`},
		"two": {setup: func(t *testing.T, root string) {
			blockDev(t, root, "vda1", "partition", "corral-data", "")
			blockDev(t, root, "vdb1", "partition", "corral-data", "")
		}, wantErr: `several data partitions named "corral-data": vda1, vdb1`},
		"no device node": {setup: func(t *testing.T, root string) {
			blockDev(t, root, "vdb1", "partition", "corral-data", "")
			os.Remove(filepath.Join(root, "dev/vdb1"))
		}, wantErr: "data partition vdb1:"},
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			tc.setup(t, root)
			got, err := FindDataPartition(root)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("FindDataPartition = %q, %v; want error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != filepath.Join(root, "dev", tc.want) {
				t.Fatalf("FindDataPartition = %q, %v; want %s", got, err, tc.want)
			}
		})
	}
}

// newCA returns a self-signed CA certificate (PEM) and its fingerprint.
func newCA(t *testing.T) ([]byte, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ca"}, IsCA: true, BasicConstraintsValid: true,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(der)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), hex.EncodeToString(sum[:])
}

// dataDir writes what agent/install leaves on the data partition.
func dataDir(t *testing.T, caPEM []byte) string {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "identity/appliance.json"), []byte(`{"endpoint":"10.0.0.1:20180","node_name":"node-7","machine_name":"m-7","install_id":"i-7","installed_at":"2026-11-21T12:00:00Z"}`))
	write(t, filepath.Join(dir, "identity/ca.crt"), caPEM)
	return dir
}

func TestCheckData(t *testing.T) {
	caPEM, fp := newCA(t)
	_, otherFP := newCA(t)
	dir := dataDir(t, caPEM)
	app, ca, err := CheckData(dir, fp)
	if err != nil || app.NodeName != "node-7" || !bytes.Equal(ca, caPEM) {
		t.Fatalf("CheckData = %+v, %v", app, err)
	}
	_, _, err = CheckData(dir, otherFP)
	if !errors.Is(err, ErrOtherAppliance) || !strings.Contains(err.Error(), "the disk was installed by another appliance; reprovision it") || !strings.Contains(err.Error(), fp) {
		t.Errorf("CheckData with another CA pinned = %v, want ErrOtherAppliance naming the disk's CA", err)
	}
	os.Remove(filepath.Join(dir, "identity/ca.crt"))
	if _, _, err := CheckData(dir, fp); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("CheckData without ca.crt = %v", err)
	}
}

// syncBuffer is a buffer safe for concurrent writers and the test.
type syncBuffer = syncbuf.Buffer

type loader struct {
	mu     sync.Mutex
	loaded []string
}

func (l *loader) Load(name string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.loaded = append(l.loaded, name)
	if name == "8021q" {
		return errors.New("not found")
	}
	return nil
}

// bootConfig is a Config over a fake machine: one data partition vdb1,
// the data directory pre-filled (mount is recorded, not done).
func bootConfig(t *testing.T, fp, mode string, data string, console *syncBuffer) (Config, *[]string) {
	root := t.TempDir()
	blockDev(t, root, "vdb1", "partition", "corral-data", "")
	write(t, filepath.Join(root, "proc/mounts"), []byte("rootfs / rootfs rw 0 0\n"))
	line := "console=ttyS0 corral.endpoint=10.0.0.1:20180 corral.token=tok corral.ca=" + fp + " corral.mac=52:54:00:aa:bb:cc"
	if mode != "" {
		line += " corral.mode=" + mode
	}
	write(t, filepath.Join(root, "cmdline"), []byte(line+"\n"))
	var calls []string
	var mu sync.Mutex
	rec := func(s string) { mu.Lock(); calls = append(calls, s); mu.Unlock() }
	return Config{
		Root: root, CmdlineFile: filepath.Join(root, "cmdline"), DataDir: data, Version: "v-test", Console: console,
		Backoff:  session.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond},
		Coldplug: func(context.Context, *coldplug.Watch) error { rec("coldplug"); return nil },
		Loader:   &loader{},
		Network: func(_ context.Context, c netup.Config) (*netup.Lease, error) {
			rec("dhcp " + c.BootMAC)
			return &netup.Lease{Interface: "eno1", MAC: c.BootMAC, Address: "10.0.0.57/24"}, nil
		},
		Mount:    func(dev, dir string) error { rec("mount " + filepath.Base(dev) + " " + dir); return nil },
		Hostname: func(name string) error { rec("hostname " + name); return nil },
	}, &calls
}

func TestRunStartsHypervisor(t *testing.T) {
	caPEM, fp := newCA(t)
	data := dataDir(t, caPEM)
	console := &syncBuffer{}
	cfg, calls := bootConfig(t, fp, "hypervisor", data, console)
	got := make(chan Node, 1)
	failures := 0
	cfg.Hypervisor = func(ctx context.Context, n Node) error {
		if failures == 0 {
			failures++
			return errors.New("enrol: appliance unreachable")
		}
		got <- n
		<-ctx.Done()
		return nil
	}
	t.Setenv("PATH", "/nowhere")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()
	var n Node
	select {
	case n = <-got:
	case <-time.After(20 * time.Second):
		t.Fatalf("hypervisor not started; console:\n%s", console)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v", err)
	}
	want := Node{Name: "node-7", Join: []string{"10.0.0.1:20180"}, DataDir: data, Listen: ":20181", Advertise: "10.0.0.57", CACertPEM: caPEM,
		Appliance: install.Appliance{Endpoint: "10.0.0.1:20180", NodeName: "node-7", MachineName: "m-7", InstallID: "i-7"}}
	if diff := cmp.Diff(want, n, cmpopts.IgnoreFields(install.Appliance{}, "InstalledAt")); diff != "" {
		t.Errorf("node (-want +got):\n%s", diff)
	}
	// No boot NIC in the fake sysfs: DHCP waits for coldplug's end. The
	// data partition is there from the start: the mount need not wait.
	if i, j := slices.Index(*calls, "coldplug"), slices.Index(*calls, "dhcp 52:54:00:aa:bb:cc"); i < 0 || j < i {
		t.Errorf("calls = %q: want coldplug before DHCP (the NIC's driver)", *calls)
	}
	wantCalls := []string{"coldplug", "dhcp 52:54:00:aa:bb:cc", "hostname node-7", "mount vdb1 " + data}
	if diff := cmp.Diff(wantCalls, *calls, cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(Modules, cfg.Loader.(*loader).loaded, cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
		t.Errorf("modules (-want +got):\n%s", diff)
	}
	// The mount's modules load in order (crc32c_generic before ext4).
	var mount []string
	for _, m := range cfg.Loader.(*loader).loaded {
		if slices.Contains(MountModules, m) {
			mount = append(mount, m)
		}
	}
	if diff := cmp.Diff(MountModules, mount); diff != "" {
		t.Errorf("mount modules in load order (-want +got):\n%s", diff)
	}
	for _, want := range []string{"module 8021q: not found (ignored)", "hypervisor agent (attempt 1): enrol: appliance unreachable", "node node-7 (machine m-7, install i-7)"} {
		if !strings.Contains(console.String(), want) {
			t.Errorf("console lacks %q:\n%s", want, console)
		}
	}
	if p := os.Getenv("PATH"); p != "/nowhere:/usr/bin:/usr/sbin:/bin:/sbin" {
		t.Errorf("PATH = %q", p)
	}
}

// TestRunOverlapsColdplug: DHCP starts once coldplug has brought up the
// boot NIC and the mount once the data partition is there, while
// coldplug still waits for late devices, and neither waits for /dev/kvm;
// the hypervisor agent starts only after coldplug has ended.
func TestRunOverlapsColdplug(t *testing.T) {
	caPEM, fp := newCA(t)
	data := dataDir(t, caPEM)
	console := &syncBuffer{}
	cfg, calls := bootConfig(t, fp, "hypervisor", data, console)
	var mu sync.Mutex
	rec := func(s string) { mu.Lock(); *calls = append(*calls, s); mu.Unlock() }
	seen := func(s string) bool { mu.Lock(); defer mu.Unlock(); return slices.Contains(*calls, s) }
	cfg.Network = func(ctx context.Context, c netup.Config) (*netup.Lease, error) {
		rec("dhcp done")
		return &netup.Lease{Interface: "eth0", MAC: c.BootMAC, Address: "10.0.0.57/24"}, nil
	}
	cfg.Mount = func(dev, dir string) error { rec("mount"); return nil }
	cfg.Hostname = func(string) error { return nil }
	cfg.Coldplug = func(ctx context.Context, w *coldplug.Watch) error {
		// Round 1 brings up the boot NIC; then coldplug waits for late
		// devices until DHCP and the mount are done (or 5 s pass).
		// No /dev/kvm: the kvm modules are held back until the node
		// has registered, and nothing here waits for them.
		write(t, filepath.Join(cfg.Root, "sys/class/net/eth0/address"), []byte("52:54:00:AA:BB:CC\n"))
		w.Signal()
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end) && !(seen("dhcp done") && seen("mount")); {
			time.Sleep(5 * time.Millisecond)
		}
		rec("coldplug done")
		return nil
	}
	started := make(chan struct{}, 1)
	cfg.Hypervisor = func(ctx context.Context, n Node) error {
		rec("hypervisor")
		started <- struct{}{}
		<-ctx.Done()
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()
	select {
	case <-started:
	case <-time.After(20 * time.Second):
		t.Fatalf("hypervisor not started; console:\n%s", console)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	at := func(s string) int { return slices.Index(*calls, s) }
	if at("dhcp done") < 0 || at("dhcp done") > at("coldplug done") || at("mount") > at("coldplug done") {
		t.Errorf("calls = %q: want DHCP and the mount done before coldplug ends", *calls)
	}
	if at("hypervisor") < at("coldplug done") {
		t.Errorf("calls = %q: want the hypervisor agent after coldplug", *calls)
	}
}

// TestRunJoinsTheFleet: the node dials the command line's appliances
// first (the fleet now), then those of its install not among them.
func TestRunJoinsTheFleet(t *testing.T) {
	caPEM, fp := newCA(t)
	data := dataDir(t, caPEM)
	write(t, filepath.Join(data, "identity/appliance.json"), []byte(`{"endpoint":"10.0.0.1:20180","endpoints":["10.0.0.1:20180","10.0.0.3:20180"],"node_name":"node-7"}`))
	console := &syncBuffer{}
	cfg, _ := bootConfig(t, fp, "hypervisor", data, console)
	write(t, cfg.CmdlineFile, []byte("corral.endpoint=10.0.0.2:20180,10.0.0.1:20180 corral.token=none corral.ca="+fp+" corral.mac=52:54:00:aa:bb:cc corral.mode=hypervisor\n"))
	ctx, cancel := context.WithCancel(context.Background())
	var got []string
	cfg.Hypervisor = func(_ context.Context, n Node) error { got = n.Join; cancel(); return nil }
	if err := Run(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"10.0.0.2:20180", "10.0.0.1:20180", "10.0.0.3:20180"}, got); diff != "" {
		t.Errorf("join (-want +got):\n%s", diff)
	}
	if want := "appliances 10.0.0.2:20180, 10.0.0.1:20180, 10.0.0.3:20180"; !strings.Contains(console.String(), want) {
		t.Errorf("console lacks %q:\n%s", want, console)
	}
}

func TestJoinList(t *testing.T) {
	eight := []string{"a:1", "b:1", "c:1", "d:1", "e:1", "f:1", "g:1", "h:1"}
	for name, tc := range map[string]struct {
		cmdline, installed []string
		want, dropped      []string
	}{
		"same":                 {cmdline: []string{"a:1"}, installed: []string{"a:1"}, want: []string{"a:1"}},
		"moved appliance":      {cmdline: []string{"b:1"}, installed: []string{"a:1"}, want: []string{"b:1", "a:1"}},
		"union, cmdline first": {cmdline: []string{"b:1", "a:1"}, installed: []string{"a:1", "c:1", "b:1"}, want: []string{"b:1", "a:1", "c:1"}},
		"bounded":              {cmdline: eight, installed: []string{"a:1", "x:1", "y:1"}, want: eight, dropped: []string{"x:1", "y:1"}},
	} {
		t.Run(name, func(t *testing.T) {
			got, dropped := joinList(tc.cmdline, tc.installed)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("join (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.dropped, dropped); diff != "" {
				t.Errorf("dropped (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRunRefuses(t *testing.T) {
	caPEM, fp := newCA(t)
	_, otherFP := newCA(t)
	for name, tc := range map[string]struct {
		fp, mode string
		want     string
	}{
		"disk from another appliance": {otherFP, "hypervisor", "data disk (attempt 2): the disk was installed by another appliance; reprovision it"},
		"discovery mode":              {fp, "", `kernel command line (attempt 2): corral.mode="": this is the hypervisor image`},
	} {
		t.Run(name, func(t *testing.T) {
			console := &syncBuffer{}
			cfg, _ := bootConfig(t, tc.fp, tc.mode, dataDir(t, caPEM), console)
			started := false
			cfg.Hypervisor = func(context.Context, Node) error { started = true; return nil }
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- Run(ctx, cfg) }()
			deadline := time.Now().Add(20 * time.Second)
			for !strings.Contains(console.String(), tc.want) {
				if time.Now().After(deadline) {
					t.Fatalf("console lacks %q:\n%s", tc.want, console)
				}
				time.Sleep(5 * time.Millisecond)
			}
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run = %v", err)
			}
			if started {
				t.Error("the hypervisor was started")
			}
		})
	}
}

// TestRunKeepsMountedDataDir: when the data directory is already a mount
// point (the agent restarted), nothing is mounted again.
func TestRunKeepsMountedDataDir(t *testing.T) {
	caPEM, fp := newCA(t)
	data := dataDir(t, caPEM)
	console := &syncBuffer{}
	cfg, calls := bootConfig(t, fp, "hypervisor", data, console)
	write(t, filepath.Join(cfg.Root, "proc/mounts"), []byte("/dev/vdb1 "+data+" ext4 rw 0 0\n"))
	ctx, cancel := context.WithCancel(context.Background())
	cfg.Hypervisor = func(context.Context, Node) error { cancel(); return nil }
	if err := Run(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	for _, c := range *calls {
		if strings.HasPrefix(c, "mount") {
			t.Errorf("mounted again: %q", c)
		}
	}
}
