package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/imagecache"

	"github.com/corralhq/corral/images/discovery"
	"github.com/corralhq/corral/testsupport/require"
)

var (
	binDir   string // corrald, corral
	srcDir   string // module root
	buildErr error

	imgOnce sync.Once
	img     discovery.Result
	imgErr  error
	imgSkip string
)

// imageCache is where the discovery image is cached between runs: the
// machine-wide cache corrald images build and corral-lab use too.
func imageCache() string {
	if d := os.Getenv("CORRAL_IMAGE_CACHE"); d != "" {
		return d
	}
	return imagecache.Default()
}

func TestMain(m *testing.M) {
	flag.Parse()
	code := func() int {
		if testing.Short() || os.Geteuid() != 0 {
			return m.Run()
		}
		dir, err := os.MkdirTemp("", "corral-discovery-e2e")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		binDir = dir
		cmd := exec.Command("go", "build", "-o", dir+"/", "github.com/corralhq/corral/cmd/corrald", "github.com/corralhq/corral/cmd/corral")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("build corrald: %v\n%s", err, out)
		}
		wd, _ := os.Getwd()
		srcDir = filepath.Clean(filepath.Join(wd, "../.."))
		return m.Run()
	}()
	os.Exit(code)
}

// need skips unless root and every named tool exists.
func need(t *testing.T, tools ...string) {
	t.Helper()
	if testing.Short() {
		t.Skip("discovery end-to-end: skipped with -short")
	}
	require.Root(t, "discovery end-to-end: network namespaces, apt")
	require.Tool(t, tools...)
	if buildErr != nil {
		t.Fatal(buildErr)
	}
}

// image builds (or takes from the cache) the discovery image once per run.
func image(t *testing.T) discovery.Result {
	t.Helper()
	imgOnce.Do(func() {
		for _, tool := range []string{"apt-get", "apt-cache", "dpkg-deb", "xz", "zstd", "go"} {
			if _, err := exec.LookPath(tool); err != nil {
				imgSkip = tool + " not installed: cannot build the discovery image"
				return
			}
		}
		if _, err := exec.LookPath("depmod"); err != nil {
			if _, err := os.Stat("/usr/sbin/depmod"); err != nil {
				imgSkip = "depmod not installed (kmod): cannot build the discovery image"
				return
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
		defer cancel()
		start := time.Now()
		log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		img, imgErr = discovery.Build(ctx, discovery.Options{SourceDir: srcDir, CacheDir: imageCache(), Logger: log})
		if imgErr == nil {
			how := "built"
			if img.Cached {
				how = "cached"
			}
			fmt.Fprintf(os.Stderr, "discovery image %s in %s: initrd %d bytes, kernel %d bytes (%s)\n",
				how, time.Since(start).Round(100*time.Millisecond), img.InitrdSize, img.KernelSize, img.Release)
		}
	})
	if imgSkip != "" {
		require.Missing(t, "%s", imgSkip)
	}
	if imgErr != nil {
		t.Fatalf("discovery image: %v", imgErr)
	}
	return img
}

// lab is one network namespace with a bridge; everything it creates is
// removed when the test ends.
type lab struct {
	t      *testing.T
	id     string
	ns     string
	bridge string
	subnet string // e.g. "10.78.1"
	dir    string
}

var subnetSeq struct {
	sync.Mutex
	n int
}

func newLab(t *testing.T) *lab {
	t.Helper()
	b := make([]byte, 3)
	rand.Read(b)
	id := hex.EncodeToString(b)
	subnetSeq.Lock()
	subnetSeq.n++
	n := subnetSeq.n
	subnetSeq.Unlock()
	l := &lab{t: t, id: id, ns: "cdi" + id, bridge: "bd" + id[:4], subnet: fmt.Sprintf("10.78.%d", n), dir: t.TempDir()}
	l.ip("netns", "add", l.ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", l.ns).Run() })
	l.ipn("link", "set", "lo", "up")
	l.ipn("link", "add", l.bridge, "type", "bridge")
	l.ipn("addr", "add", l.subnet+".1/24", "dev", l.bridge)
	l.ipn("link", "set", l.bridge, "up")
	return l
}

func (l *lab) ip(args ...string) {
	l.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		l.t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func (l *lab) ipn(args ...string) { l.t.Helper(); l.ip(append([]string{"-n", l.ns}, args...)...) }

// tap adds a tap on the bridge for a VM.
func (l *lab) tap(name string) string {
	l.t.Helper()
	l.ipn("tuntap", "add", name, "mode", "tap")
	l.ipn("link", "set", name, "master", l.bridge)
	l.ipn("link", "set", name, "up")
	return name
}

// proc is a process the test started; it is stopped by its pid.
type proc struct {
	cmd     *exec.Cmd
	log     string
	done    chan struct{}
	console *consoleLog
}

type consoleLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (c *consoleLog) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.Write(p)
}

func (c *consoleLog) String() string { c.mu.Lock(); defer c.mu.Unlock(); return c.buf.String() }

// start runs name with args, output to dir/logName, stopped at cleanup.
func start(t *testing.T, dir, logName, name string, args ...string) *proc {
	t.Helper()
	logPath := filepath.Join(dir, logName)
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cons := &consoleLog{}
	cmd := exec.Command(name, args...)
	w := &teeWriter{f, cons}
	cmd.Stdout, cmd.Stderr = w, w
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{cmd: cmd, log: logPath, done: make(chan struct{}), console: cons}
	go func() { cmd.Wait(); f.Close(); close(p.done) }()
	t.Cleanup(func() { p.stop(t) })
	return p
}

type teeWriter struct {
	a, b interface{ Write([]byte) (int, error) }
}

func (t *teeWriter) Write(p []byte) (int, error) { t.a.Write(p); return t.b.Write(p) }

func (p *proc) stop(t *testing.T) {
	select {
	case <-p.done:
	default:
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
		}
	}
	if t.Failed() || os.Getenv("CORRAL_TEST_LOG") != "" {
		t.Logf("--- %s (last 6 KiB)\n%s", filepath.Base(p.log), tail(p.console.String(), 6<<10))
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// corrald is a running appliance; cli runs the corral CLI against it
// (inside ns when set).
type corrald struct {
	*proc
	t       *testing.T
	ns      string
	dataDir string
}

func (c *corrald) cli(args ...string) ([]byte, error) {
	full := append([]string{filepath.Join(binDir, "corral"), "--config", filepath.Join(c.dataDir, "admin.conf")}, args...)
	if c.ns != "" {
		full = append([]string{"netns", "exec", c.ns}, full...)
		return exec.Command("ip", full...).CombinedOutput()
	}
	return exec.Command(full[0], full[1:]...).CombinedOutput()
}

// startCorrald runs `corrald serve` (in ns when set) and waits until its
// API answers.
func startCorrald(t *testing.T, dir, ns, dataDir string, args ...string) *corrald {
	t.Helper()
	full := append([]string{filepath.Join(binDir, "corrald"), "serve", "--data-dir", dataDir, "--log-level", "debug"}, args...)
	var p *proc
	if ns != "" {
		p = start(t, dir, "corrald.log", "ip", append([]string{"netns", "exec", ns}, full...)...)
	} else {
		p = start(t, dir, "corrald.log", full[0], full[1:]...)
	}
	c := &corrald{proc: p, t: t, ns: ns, dataDir: dataDir}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(dataDir, "admin.conf")); err == nil {
			if _, err := c.cli("get", "machines"); err == nil {
				return c
			}
		}
		select {
		case <-p.done:
			t.Fatalf("corrald exited:\n%s", tail(p.console.String(), 4096))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("corrald did not come up in 60s:\n%s", tail(p.console.String(), 4096))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// machine is the part of `corral get machines -o json` the tests check
// (proto field names; 64-bit integers are JSON strings).
type machine struct {
	Name       string   `json:"name"`
	Serial     string   `json:"serial"`
	SystemUUID string   `json:"system_uuid"`
	MACs       []string `json:"macs"`
	BootMAC    string   `json:"boot_mac"`
	State      string   `json:"state"`
	Flags      []string `json:"flags"`
	EKIdentity string   `json:"ek_identity"`
	Conflict   struct {
		Machine string `json:"machine"`
		Reason  string `json:"reason"`
	} `json:"conflict"`
	FactHistory []struct {
		Path   string `json:"path"`
		Before string `json:"before"`
		After  string `json:"after"`
	} `json:"fact_history"`
	Facts struct {
		System struct {
			Vendor, Product, Serial, UUID string
		} `json:"system"`
		CPU struct {
			Sockets uint32 `json:"sockets"`
			Cores   uint32 `json:"cores"`
			Threads uint32 `json:"threads"`
		} `json:"cpu"`
		Memory struct {
			TotalBytes string `json:"total_bytes"`
		} `json:"memory"`
		Disks []struct {
			Name      string `json:"name"`
			Serial    string `json:"serial"`
			SizeBytes string `json:"size_bytes"`
		} `json:"disks"`
		NICs []struct {
			Name   string `json:"name"`
			MAC    string `json:"mac"`
			Driver string `json:"driver"`
		} `json:"nics"`
		BMC struct {
			Channel     uint32 `json:"channel"`
			IPv4Address string `json:"ipv4_address"`
			MAC         string `json:"mac"`
		} `json:"bmc"`
		MissingDrivers []json.RawMessage `json:"missing_drivers"`
		SecureBoot     string            `json:"secure_boot"`
		Lockdown       string            `json:"lockdown"`
		Kernel         string            `json:"kernel"`
		Architecture   string            `json:"architecture"`
	} `json:"facts"`
}

func (c *corrald) machines() []machine {
	c.t.Helper()
	out, err := c.cli("get", "machines", "-o", "json")
	if err != nil {
		c.t.Fatalf("corral get machines: %v\n%s", err, out)
	}
	var ms []machine
	if err := json.Unmarshal(out, &ms); err != nil {
		c.t.Fatalf("get machines json: %v\n%s", err, out)
	}
	return ms
}

// waitMachine polls `corral get machines -o json` until ok accepts a
// machine, or fails the test after timeout with the VM console's tail.
func (c *corrald) waitMachine(vm *proc, timeout time.Duration, what string, ok func(machine) bool) machine {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for _, m := range c.machines() {
			if ok(m) {
				return m
			}
		}
		select {
		case <-vm.done:
			c.t.Fatalf("VM exited before %s; console:\n%s", what, tail(vm.console.String(), 6<<10))
		default:
		}
		if time.Now().After(deadline) {
			out, _ := c.cli("get", "machines", "-o", "json")
			c.t.Fatalf("no machine %s after %s; machines:\n%s\nconsole:\n%s", what, timeout, out, tail(vm.console.String(), 6<<10))
		}
		time.Sleep(time.Second)
	}
}

// disks makes n sparse raw disk files and returns their QEMU arguments:
// virtio-blk devices with the given serials.
func disks(t *testing.T, dir string, serials ...string) []string {
	t.Helper()
	var args []string
	for i, s := range serials {
		p := filepath.Join(dir, fmt.Sprintf("disk%d.raw", i))
		if _, err := os.Stat(p); err != nil {
			f, err := os.Create(p)
			if err != nil {
				t.Fatal(err)
			}
			f.Truncate(int64(i+1) << 30)
			f.Close()
		}
		args = append(args, "-drive", fmt.Sprintf("if=none,id=d%d,format=raw,file=%s", i, p),
			"-device", fmt.Sprintf("virtio-blk-pci,drive=d%d,serial=%s", i, s))
	}
	return args
}

// varsCopy copies a firmware variable store template into the lab's
// directory as name (the firmware writes to its store) and returns the copy.
func (l *lab) varsCopy(template, name string) string {
	l.t.Helper()
	b, err := os.ReadFile(template)
	if err != nil {
		l.t.Fatal(err)
	}
	path := filepath.Join(l.dir, name)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		l.t.Fatal(err)
	}
	return path
}
