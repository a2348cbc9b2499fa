package e2e

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/corralhq/corral/images"
	"github.com/corralhq/corral/testsupport/require"
)

var (
	binDir     string // corrald, corral
	testKernel string // a Linux bzImage, or "" (ipxe.lkrn stands in)
	testInitrd string // initramfs with the test /init
	buildErr   error
)

// DefaultKernelCache is where images/testkernel/fetch.sh puts Debian's
// cloud kernel.
const DefaultKernelCache = "/var/cache/corral/test-kernel/vmlinuz"

func TestMain(m *testing.M) {
	flag.Parse()
	code := func() int {
		if testing.Short() || os.Geteuid() != 0 {
			return m.Run()
		}
		dir, err := os.MkdirTemp("", "corral-boot-e2e")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		binDir = dir
		buildErr = build(dir)
		return m.Run()
	}()
	os.Exit(code)
}

func build(dir string) error {
	cmd := exec.Command("go", "build", "-race", "-o", dir+"/", "github.com/corralhq/corral/cmd/corrald", "github.com/corralhq/corral/cmd/corral")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build corrald: %v\n%s", err, out)
	}
	initBin := filepath.Join(dir, "init")
	cmd = exec.Command("go", "build", "-o", initBin, "./testdata/init")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build test init: %v\n%s", err, out)
	}
	b, err := os.ReadFile(initBin)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := images.WriteInitramfs(&buf, []string{"proc"}, map[string][]byte{"init": b}, map[string]bool{"init": true}); err != nil {
		return err
	}
	testInitrd = filepath.Join(dir, "initrd.cpio")
	if err := os.WriteFile(testInitrd, buf.Bytes(), 0o644); err != nil {
		return err
	}
	for _, k := range []string{os.Getenv("CORRAL_TEST_KERNEL"), DefaultKernelCache} {
		if k == "" {
			continue
		}
		if st, err := os.Stat(k); err == nil && st.Mode().IsRegular() {
			testKernel = k
			break
		}
	}
	return nil
}

// need skips unless root and every named tool exists.
func need(t *testing.T, tools ...string) {
	t.Helper()
	if testing.Short() {
		t.Skip("network-boot end-to-end: skipped with -short")
	}
	require.Root(t, "network-boot end-to-end: network namespaces")
	require.Tool(t, append([]string{"ip"}, tools...)...)
	if buildErr != nil {
		t.Fatal(buildErr)
	}
}

// lab is one network namespace with a bridge; everything it creates is
// removed when the test ends.
type lab struct {
	t      *testing.T
	id     string
	ns     string // corrald's namespace
	bridge string
	subnet string // first three octets, e.g. "10.77.3"
	extra  []string
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
	l := &lab{t: t, id: id, ns: "cbt" + id, bridge: "br" + id[:4], subnet: fmt.Sprintf("10.77.%d", n), dir: t.TempDir()}
	l.ip("netns", "add", l.ns)
	t.Cleanup(func() {
		for _, ns := range append(l.extra, l.ns) {
			exec.Command("ip", "netns", "del", ns).Run()
		}
	})
	l.ipn(l.ns, "link", "set", "lo", "up")
	l.ipn(l.ns, "link", "add", l.bridge, "type", "bridge")
	l.ipn(l.ns, "addr", "add", l.subnet+".1/24", "dev", l.bridge)
	l.ipn(l.ns, "link", "set", l.bridge, "up")
	return l
}

func (l *lab) ip(args ...string) {
	l.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		l.t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func (l *lab) ipn(ns string, args ...string) {
	l.t.Helper()
	l.ip(append([]string{"-n", ns}, args...)...)
}

// tap adds a tap on the bridge for a VM.
func (l *lab) tap(name string) string {
	l.t.Helper()
	l.ipn(l.ns, "tuntap", "add", name, "mode", "tap")
	l.ipn(l.ns, "link", "set", name, "master", l.bridge)
	l.ipn(l.ns, "link", "set", name, "up")
	return name
}

// peer makes another namespace joined to the bridge by a veth, with addr
// (CIDR) on its end, and returns the namespace and its interface name.
func (l *lab) peer(suffix, addr string) (string, string) {
	l.t.Helper()
	ns := "cbt" + l.id + suffix
	l.ip("netns", "add", ns)
	l.extra = append(l.extra, ns)
	l.ipn(ns, "link", "set", "lo", "up")
	host, inner := "v"+l.id[:4]+suffix, "e"+l.id[:4]+suffix
	l.ipn(l.ns, "link", "add", host, "type", "veth", "peer", "name", inner, "netns", ns)
	l.ipn(l.ns, "link", "set", host, "master", l.bridge)
	l.ipn(l.ns, "link", "set", host, "up")
	if addr != "" {
		l.ipn(ns, "addr", "add", addr, "dev", inner)
	}
	l.ipn(ns, "link", "set", inner, "up")
	return ns, inner
}

// proc is a process the test started; it is stopped by its pid.
type proc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func (l *lab) start(name, logName string, args ...string) *proc {
	l.t.Helper()
	logPath := filepath.Join(l.dir, logName)
	f, err := os.Create(logPath)
	if err != nil {
		l.t.Fatal(err)
	}
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		l.t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { cmd.Wait(); f.Close(); close(p.done) }()
	l.t.Cleanup(func() { p.stop(l.t) })
	return p
}

func (p *proc) stop(t *testing.T) {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
	if t.Failed() || os.Getenv("CORRAL_TEST_LOG") != "" {
		b, _ := os.ReadFile(p.log)
		t.Logf("--- %s (last 6 KiB)\n%s", filepath.Base(p.log), tail(b, 6<<10))
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// corrald runs the appliance in the lab namespace.
type corrald struct {
	*proc
	l       *lab
	dataDir string
}

func (l *lab) corrald(args ...string) *corrald {
	l.t.Helper()
	data := filepath.Join(l.dir, "data")
	base := []string{"netns", "exec", l.ns, filepath.Join(binDir, "corrald"), "serve", "--data-dir", data,
		"--api-listen", ":20180", "--boot-interface", l.bridge, "--log-level", "debug", "--boot-initrd", testInitrd, "--allow-test-images"}
	if testKernel != "" {
		base = append(base, "--boot-kernel", testKernel)
	}
	c := &corrald{proc: l.start("ip", "corrald.log", append(base, args...)...), l: l, dataDir: data}
	// Ready when the API answers.
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := c.cli("machine", "timeline", "00:00:00:00:00:01"); err == nil {
			return c
		}
		select {
		case <-c.done:
			b, _ := os.ReadFile(c.log)
			l.t.Fatalf("corrald exited:\n%s", tail(b, 4096))
		default:
		}
		if time.Now().After(deadline) {
			l.t.Fatal("corrald did not come up in 60s")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (c *corrald) cli(args ...string) ([]byte, error) {
	full := append([]string{"netns", "exec", c.l.ns, filepath.Join(binDir, "corral"), "--config", filepath.Join(c.dataDir, "admin.conf")}, args...)
	return exec.Command("ip", full...).CombinedOutput()
}

type entry struct {
	Source     string            `json:"source"`
	Event      string            `json:"event"`
	Detail     string            `json:"detail"`
	Attributes map[string]string `json:"attributes"`
}

func (c *corrald) timeline(mac string) []entry {
	c.l.t.Helper()
	out, err := c.cli("machine", "timeline", mac, "-o", "json", "--limit", "500")
	if err != nil {
		c.l.t.Fatalf("corral machine timeline: %v\n%s", err, out)
	}
	var es []entry
	if err := json.Unmarshal(out, &es); err != nil {
		c.l.t.Fatalf("timeline json: %v\n%s", err, out)
	}
	return es
}

// want is one expected timeline entry: source, event and attributes that
// must match (values are regexps).
type want struct {
	source, event string
	attrs         map[string]string
}

// waitTimeline polls until every wanted entry is on mac's timeline, in
// order.
func (c *corrald) waitTimeline(mac string, wants []want, timeout time.Duration) []entry {
	c.l.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		es := c.timeline(mac)
		if missing := match(es, wants); missing == "" {
			return es
		} else if time.Now().After(deadline) {
			c.l.t.Fatalf("timeline of %s lacks %s; it has:\n%s", mac, missing, render(es))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func match(es []entry, wants []want) string {
	i := 0
next:
	for _, w := range wants {
		for ; i < len(es); i++ {
			if matches(es[i], w) {
				i++
				continue next
			}
		}
		return fmt.Sprintf("%s/%s %v", w.source, w.event, w.attrs)
	}
	return ""
}

func matches(e entry, w want) bool {
	if e.Source != w.source || e.Event != w.event {
		return false
	}
	for k, re := range w.attrs {
		if !regexp.MustCompile("^(?:" + re + ")$").MatchString(e.Attributes[k]) {
			return false
		}
	}
	return true
}

func render(es []entry) string {
	var b strings.Builder
	for _, e := range es {
		fmt.Fprintf(&b, "  %-5s %-16s %s %v\n", e.Source, e.Event, e.Detail, e.Attributes)
	}
	return b.String()
}

// vm is a QEMU guest whose serial console is captured.
type vm struct {
	*proc
	console *consoleLog
}

type consoleLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
	ch  chan struct{}
}

func (c *consoleLog) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.buf.Write(p)
	c.mu.Unlock()
	select {
	case c.ch <- struct{}{}:
	default:
	}
	return len(p), nil
}

func (c *consoleLog) String() string { c.mu.Lock(); defer c.mu.Unlock(); return c.buf.String() }

type vmOpts struct {
	uefi  bool
	nic   string // virtio-net-pci, e1000
	mac   string
	tap   string
	noROM bool
	// vars is the OVMF variable store to boot with (default: a copy of
	// Debian's empty OVMF_VARS_4M.fd); slot pins the NIC's PCI slot.
	vars string
	// code is the OVMF code image (default Debian's OVMF_CODE_4M.fd); a
	// secboot image needs SMM, which the VM then gets.
	code  string
	slot  byte
	extra []string // more QEMU arguments
}

func (l *lab) vm(o vmOpts) *vm {
	l.t.Helper()
	args := []string{"netns", "exec", l.ns, "qemu-system-x86_64", "-accel", "tcg,thread=multi", "-cpu", "max", "-m", "512",
		"-nographic", "-no-reboot", "-serial", "stdio", "-monitor", "none", "-boot", "n",
		"-netdev", "tap,id=n0,ifname=" + o.tap + ",script=no,downscript=no"}
	dev := o.nic + ",netdev=n0,mac=" + o.mac
	if o.noROM {
		dev += ",romfile="
	}
	if o.slot != 0 {
		dev += fmt.Sprintf(",addr=%#x", o.slot)
	}
	args = append(args, "-device", dev)
	args = append(args, o.extra...)
	if o.uefi {
		vars := o.vars
		if vars == "" {
			vars = filepath.Join(l.dir, "OVMF_VARS.fd")
			b, err := os.ReadFile(ovmfVars)
			if err != nil {
				l.t.Fatal(err)
			}
			os.WriteFile(vars, b, 0o644)
		}
		code, machine := cmp.Or(o.code, ovmfCode), "q35"
		if strings.Contains(code, "secboot") {
			// The Secure Boot build keeps its variables behind SMM.
			machine += ",smm=on"
			args = append(args, "-global", "driver=cfi.pflash01,property=secure,value=on")
		}
		args = append(args, "-machine", machine,
			"-drive", "if=pflash,format=raw,unit=0,readonly=on,file="+code,
			"-drive", "if=pflash,format=raw,unit=1,file="+vars)
	}
	cons := &consoleLog{ch: make(chan struct{}, 1)}
	logPath := filepath.Join(l.dir, "console-"+strings.ReplaceAll(o.mac, ":", "")+".log")
	f, err := os.Create(logPath)
	if err != nil {
		l.t.Fatal(err)
	}
	cmd := exec.Command("ip", args...)
	w := &teeWriter{a: f, b: cons}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		l.t.Fatal(err)
	}
	p := &proc{cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { cmd.Wait(); f.Close(); close(p.done) }()
	l.t.Cleanup(func() { p.stop(l.t) })
	return &vm{proc: p, console: cons}
}

type teeWriter struct {
	a, b interface{ Write([]byte) (int, error) }
}

func (t *teeWriter) Write(p []byte) (int, error) { t.a.Write(p); return t.b.Write(p) }

// waitConsole waits until the console matches re.
func (v *vm) waitConsole(t *testing.T, re string, timeout time.Duration) string {
	t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.After(timeout)
	for {
		s := v.console.String()
		if m := rx.FindString(s); m != "" {
			return m
		}
		select {
		case <-v.console.ch:
		case <-time.After(time.Second):
		case <-v.done:
			if m := rx.FindString(v.console.String()); m != "" {
				return m
			}
			t.Fatalf("VM exited before %q; console:\n%s", re, tail([]byte(v.console.String()), 4096))
		case <-deadline:
			t.Fatalf("console did not show %q in %s; console:\n%s", re, timeout, tail([]byte(v.console.String()), 4096))
		}
	}
}

// inNS runs fn on an OS thread switched into namespace ns: sockets fn
// opens live in that namespace.
func inNS(t *testing.T, ns string, fn func()) {
	t.Helper()
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer orig.Close()
	h, err := netns.GetFromName(ns)
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer h.Close()
	if err := netns.Set(h); err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer func() {
		if err := netns.Set(orig); err == nil {
			runtime.UnlockOSThread()
		} // else: the thread stays locked and dies with the goroutine
	}()
	fn()
}
