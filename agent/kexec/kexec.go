// Package kexec boots the hypervisor image straight from the discovery
// image once an install is done (since 2026-11-24): it fetches the kernel and initrd a
// KexecPlan names over plain HTTP from the appliance, refuses either
// unless it has exactly the size and SHA-256 the plan carries (the plan
// comes over the agent's TLS session, the files over the hostile boot
// LAN), loads them with the plan's kernel command line, syncs the disks
// and reboots into them (reboot(2) with LINUX_REBOOT_CMD_KEXEC, through
// u-root's pkg/boot/kexec). A machine booted by BIOS loads with
// kexec_load(2) and a purgatory that only jumps (SegmentsLoad): under
// QEMU TCG kexec_file_load(2)'s hashing of every segment, at load and
// again in its purgatory before the jump, cost about 3 s per boot, for
// files verified already. A machine booted by EFI, or a kexec_load the
// kernel refuses, loads with kexec_file_load(2), which also hands the EFI
// runtime over; so does a kernel in lockdown (Secure Boot), where
// kexec_load is refused and kexec_file_load checks the signature.
//
// Nothing is loaded before both files are verified, and a kernel loaded
// whose reboot then fails is unloaded again, so a failure leaves the
// machine as it was: the caller reports it and the appliance reboots the
// machine the old way (BMC power cycle or the Reboot command).
//
// Booter.Prefetch does the fetch, the checks and the load ahead, while the
// install the plan follows still runs (the appliance sends the plan right
// behind the install plan to an agent that names the "kexec-prefetch"
// capability): Booter.Kexec of the same plan after the install then only
// syncs and reboots. Discard unloads a prefetch whose install failed.
//
// The files are held in memory (memfd), never on a disk. It imports only
// the API and u-root's kexec and purgatory packages; it must not import store/, boot/,
// ipmi/ or anything of the appliance.
package kexec

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	ukexec "github.com/u-root/u-root/pkg/boot/kexec"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	nodev1 "github.com/corralhq/corral/api/node/v1"
)

// MaxFileSize bounds each file a plan may name: a plan asking for more is
// refused before anything is fetched (the files are held in memory).
const MaxFileSize = 1 << 30

// MaxCmdline bounds the plan's kernel command line (Linux's x86 limit).
const MaxCmdline = 2048

// DefaultFetchTimeout bounds the fetch of both files.
const DefaultFetchTimeout = 5 * time.Minute

// ErrHash means a fetched file is not the one the plan names (size or SHA-256).
var ErrHash = errors.New("fetched file does not match the plan")

// Config configures Boot. The zero value is the real thing: the default
// HTTP client, kexec_load(2) or kexec_file_load(2) (AutoLoad), sync(2)
// and reboot(2).
type Config struct {
	// Client fetches the files (default: a client with FetchTimeout).
	Client *http.Client
	// FetchTimeout bounds the fetch of both files (default
	// DefaultFetchTimeout).
	FetchTimeout time.Duration
	// Load loads kernel and initrd for the next kexec reboot (default
	// AutoLoad); Unload drops what Load loaded (default
	// kexec_file_load with KEXEC_FILE_UNLOAD: either way of loading).
	Load   func(kernel, initrd *os.File, cmdline string) error
	Unload func() error
	// Sync flushes the disks before the reboot (default sync(2): the
	// install just wrote one).
	Sync func()
	// Reboot jumps into the loaded kernel (default reboot(2) with
	// LINUX_REBOOT_CMD_KEXEC); it does not return on success.
	Reboot func() error
	// Console receives one human line per step; nil discards.
	Console io.Writer
	Logger  *slog.Logger
}

func (c *Config) defaults() {
	if c.FetchTimeout <= 0 {
		c.FetchTimeout = DefaultFetchTimeout
	}
	if c.Client == nil {
		c.Client = &http.Client{Timeout: c.FetchTimeout}
	}
	if c.Console == nil {
		c.Console = io.Discard
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Load == nil {
		console, logger := c.Console, c.Logger
		c.Load = func(kernel, initrd *os.File, cmdline string) error {
			return AutoLoad(kernel, initrd, cmdline, console, logger)
		}
	}
	if c.Unload == nil {
		c.Unload = unload
	}
	if c.Sync == nil {
		c.Sync = unix.Sync
	}
	if c.Reboot == nil {
		c.Reboot = ukexec.Reboot
	}
}

// Booter carries out KexecPlans with a Config (agent/session's Kexec and
// KexecPrefetcher). Besides Kexec (Boot) it can Prefetch a plan: fetch,
// verify and load it while the install it follows still runs, so that
// the Kexec of the same plan after the install only syncs and reboots.
// The kernel holds one loaded kexec image, so a Booter holds at most one
// prefetched plan. Make it with NewBooter; safe for concurrent use.
type Booter struct {
	cfg Config

	mu  sync.Mutex
	pre *prefetched // the plan fetched and loaded (or being) ahead of its Kexec; nil: none
}

// prefetched is a plan a Prefetch loads; err is set before done closes.
type prefetched struct {
	plan   *nodev1.KexecPlan
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// NewBooter returns a Booter with cfg (its zero value: the real thing).
func NewBooter(cfg Config) *Booter {
	cfg.defaults()
	return &Booter{cfg: cfg}
}

// Kexec implements session.Kexec: when a Prefetch of an equal plan is
// loaded (or under way: Kexec waits for it) it only syncs and reboots;
// otherwise, or when that Prefetch failed, it is Boot with b's Config (a
// different plan prefetched is dropped first).
func (b *Booter) Kexec(ctx context.Context, plan *nodev1.KexecPlan) error {
	b.mu.Lock()
	p := b.pre
	b.mu.Unlock()
	if p != nil && proto.Equal(p.plan, plan) {
		select {
		case <-p.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		if p.err == nil {
			fmt.Fprintf(b.cfg.Console, "corral: kexec: the hypervisor image of install %s was loaded while the install ran\n", plan.GetInstallId())
			err := reboot(b.cfg, 0)
			b.mu.Lock()
			if b.pre == p {
				b.pre = nil // reboot unloaded it if it failed
			}
			b.mu.Unlock()
			return err
		}
		fmt.Fprintf(b.cfg.Console, "corral: kexec: loading it while the install ran failed (%v): fetching again\n", p.err)
	} else if p != nil {
		b.Discard(p.plan.GetInstallId())
	}
	return Boot(ctx, b.cfg, plan)
}

// Prefetch implements session.KexecPrefetcher: it checks plan, fetches
// and verifies both files and loads them for the next kexec reboot,
// without rebooting, and returns when they are loaded or with the error
// of the step that failed (nothing loaded then). A later Kexec of an
// equal plan reboots into what it loaded; Discard unloads it. A Prefetch
// while another plan's is loaded or under way is refused; one of an equal
// plan returns nil at once.
func (b *Booter) Prefetch(ctx context.Context, plan *nodev1.KexecPlan) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p := &prefetched{plan: proto.Clone(plan).(*nodev1.KexecPlan), cancel: cancel, done: make(chan struct{})}
	b.mu.Lock()
	if b.pre != nil {
		same := proto.Equal(b.pre.plan, plan)
		other := b.pre.plan.GetInstallId()
		b.mu.Unlock()
		if same {
			return nil // the appliance resent it: the first one stands
		}
		return fmt.Errorf("busy: the kexec of install %s is already prefetched", other)
	}
	b.pre = p
	b.mu.Unlock()
	p.err = load(ctx, b.cfg, plan)
	if p.err != nil {
		b.mu.Lock()
		if b.pre == p {
			b.pre = nil
		}
		b.mu.Unlock()
	}
	close(p.done)
	return p.err
}

// Discard implements session.KexecPrefetcher: it drops the Prefetch of
// install id (its install failed): cancels it if under way, waits for it
// and unloads what it loaded. Another install's Prefetch is left alone.
func (b *Booter) Discard(id string) {
	b.mu.Lock()
	p := b.pre
	if p == nil || p.plan.GetInstallId() != id {
		b.mu.Unlock()
		return
	}
	b.pre = nil
	b.mu.Unlock()
	p.cancel()
	<-p.done
	if p.err != nil {
		return
	}
	if err := b.cfg.Unload(); err != nil {
		b.cfg.Logger.Warn("kexec unload of a prefetched image", "install", id, "err", err)
		return
	}
	fmt.Fprintf(b.cfg.Console, "corral: kexec: the hypervisor image loaded for install %s is unloaded\n", id)
}

// Boot carries out plan: check it, fetch and verify both files, load
// them, reboot into them. It does not return when the reboot happens; it
// returns the error of the first step that failed, with nothing left
// loaded.
func Boot(ctx context.Context, cfg Config, plan *nodev1.KexecPlan) error {
	cfg.defaults()
	start := time.Now()
	if err := load(ctx, cfg, plan); err != nil {
		return err
	}
	return reboot(cfg, time.Since(start))
}

// load checks plan, fetches and verifies both files and loads them
// (cfg's defaults filled in).
func load(ctx context.Context, cfg Config, plan *nodev1.KexecPlan) error {
	if err := Check(plan); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.FetchTimeout)
	defer cancel()
	start := time.Now()
	kernel, initrd, kt, it, err := fetchBoth(ctx, cfg.Client, plan)
	if err != nil {
		return err
	}
	defer kernel.Close()
	defer initrd.Close()
	took := time.Since(start)
	// Where the seconds went, per file (the two are fetched at once):
	// waiting for the network, hashing, writing the memfd.
	fmt.Fprintf(cfg.Console, "corral: kexec: kernel (%d bytes) and initrd (%d bytes) fetched and verified in %s (kernel: %s; initrd: %s)\n",
		plan.GetKernelSize(), plan.GetInitrdSize(), took.Round(time.Millisecond), kt, it)
	cfg.Logger.Info("kexec files verified", "install", plan.GetInstallId(), "kernel_bytes", plan.GetKernelSize(),
		"initrd_bytes", plan.GetInitrdSize(), "duration", took.String(),
		"kernel_read_ms", kt.read.Milliseconds(), "kernel_hash_ms", kt.hash.Milliseconds(), "kernel_write_ms", kt.write.Milliseconds(),
		"initrd_read_ms", it.read.Milliseconds(), "initrd_hash_ms", it.hash.Milliseconds(), "initrd_write_ms", it.write.Milliseconds())
	start = time.Now()
	if err := cfg.Load(kernel, initrd, plan.GetCmdline()); err != nil {
		return fmt.Errorf("kexec load: %w", err)
	}
	fmt.Fprintf(cfg.Console, "corral: kexec: loaded in %s\n", time.Since(start).Round(time.Millisecond))
	return nil
}

// reboot syncs the disks and reboots into the loaded image; a reboot that
// fails unloads it. loaded (how long fetch and load took just before; 0:
// loaded ahead) is printed beside the sync.
func reboot(cfg Config, loaded time.Duration) error {
	syncStart := time.Now()
	cfg.Sync()
	// The console line splits the boot's seconds: fetch and load, sync,
	// then the reboot path, the purgatory and the next kernel's
	// decompressor up to its first printk.
	how := "loaded while the install ran"
	if loaded > 0 {
		how = "fetched and loaded in " + loaded.Round(time.Millisecond).String()
	}
	fmt.Fprintf(cfg.Console, "corral: kexec: %s, disks synced in %s; booting the hypervisor image\n",
		how, time.Since(syncStart).Round(time.Millisecond))
	if err := cfg.Reboot(); err != nil {
		if uerr := cfg.Unload(); uerr != nil {
			cfg.Logger.Warn("kexec unload after a failed reboot", "err", uerr)
		}
		return fmt.Errorf("kexec reboot: %w", err)
	}
	return nil
}

// fetchBoth fetches and verifies the plan's kernel and initrd at the same
// time (hashing costs CPU: a machine has several), and returns both or the
// first error, with neither left open.
func fetchBoth(ctx context.Context, c *http.Client, plan *nodev1.KexecPlan) (kernel, initrd *os.File, kt, it fetchTimes, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var once sync.Once
	var first error
	fail := func(err error) {
		once.Do(func() {
			first = err
			cancel() // the other file is of no use without this one
		})
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var err error
		if kernel, kt, err = fetch(ctx, c, "kernel", plan.GetKernelUrl(), plan.GetKernelSize(), plan.GetKernelSha256()); err != nil {
			fail(err)
		}
	}()
	initrd, it, ierr := fetch(ctx, c, "initrd", plan.GetInitrdUrl(), plan.GetInitrdSize(), plan.GetInitrdSha256())
	if ierr != nil {
		fail(ierr)
	}
	<-done
	if first != nil {
		for _, f := range []*os.File{kernel, initrd} {
			if f != nil {
				f.Close()
			}
		}
		return nil, nil, kt, it, first
	}
	return kernel, initrd, kt, it, nil
}

// Check refuses a plan that names no install, a URL that is not http or
// https, a hash that is not 64 hex digits, a size out of (0,
// MaxFileSize], or a command line over MaxCmdline or holding a control
// character.
func Check(plan *nodev1.KexecPlan) error {
	if plan.GetInstallId() == "" {
		return errors.New("kexec plan: no install id")
	}
	for _, f := range []struct {
		what, url, sum string
		size           int64
	}{
		{"kernel", plan.GetKernelUrl(), plan.GetKernelSha256(), plan.GetKernelSize()},
		{"initrd", plan.GetInitrdUrl(), plan.GetInitrdSha256(), plan.GetInitrdSize()},
	} {
		u, err := url.Parse(f.url)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("kexec plan: %s url %q: want an http(s) URL", f.what, f.url)
		}
		if b, err := hex.DecodeString(f.sum); err != nil || len(b) != sha256.Size {
			return fmt.Errorf("kexec plan: %s sha256 %q: want 64 hex digits", f.what, f.sum)
		}
		if f.size <= 0 || f.size > MaxFileSize {
			return fmt.Errorf("kexec plan: %s size %d: want 1 to %d bytes", f.what, f.size, MaxFileSize)
		}
	}
	if c := plan.GetCmdline(); len(c) >= MaxCmdline || strings.ContainsFunc(c, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return fmt.Errorf("kexec plan: kernel command line of %d bytes: want under %d printable bytes", len(c), MaxCmdline)
	}
	return nil
}

// Fetch downloads url into an in-memory file and returns it positioned at
// its start. It reads at most size+1 bytes and refuses (ErrHash) a body
// that is shorter or longer than size or whose SHA-256 is not sum: a
// truncated or replaced file is never returned.
func Fetch(ctx context.Context, c *http.Client, what, url string, size int64, sum string) (*os.File, error) {
	f, _, err := fetch(ctx, c, what, url, size, sum)
	return f, err
}

// fetchTimes splits a fetch: time waiting for the body (the network),
// hashing it, writing it to the memfd.
type fetchTimes struct{ read, hash, write time.Duration }

func (t fetchTimes) String() string {
	return fmt.Sprintf("network %s, sha256 %s, memfd %s", t.read.Round(time.Millisecond), t.hash.Round(time.Millisecond), t.write.Round(time.Millisecond))
}

// timedReader and timedWriter add the time spent in each call to *d.
type timedReader struct {
	r io.Reader
	d *time.Duration
}

func (t timedReader) Read(p []byte) (int, error) {
	start := time.Now()
	n, err := t.r.Read(p)
	*t.d += time.Since(start)
	return n, err
}

type timedWriter struct {
	w io.Writer
	d *time.Duration
}

func (t timedWriter) Write(p []byte) (int, error) {
	start := time.Now()
	n, err := t.w.Write(p)
	*t.d += time.Since(start)
	return n, err
}

// fetch is Fetch, with where its time went.
func fetch(ctx context.Context, c *http.Client, what, url string, size int64, sum string) (*os.File, fetchTimes, error) {
	var t fetchTimes
	f, err := fetchTimed(ctx, c, what, url, size, sum, &t)
	return f, t, err
}

func fetchTimed(ctx context.Context, c *http.Client, what, url string, size int64, sum string, t *fetchTimes) (*os.File, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("kexec: %s: %w", what, err)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("kexec: fetch %s: %w", what, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("kexec: fetch %s %s: %s", what, url, resp.Status)
	}
	f, err := memFile(what)
	if err != nil {
		return nil, fmt.Errorf("kexec: %s: %w", what, err)
	}
	h := sha256.New()
	n, err := hashAndStore(timedReader{io.LimitReader(resp.Body, size+1), &t.read}, timedWriter{h, &t.hash}, f, &t.write)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("kexec: fetch %s: after %d of %d bytes: %w", what, n, size, err)
	}
	if n != size {
		f.Close()
		return nil, fmt.Errorf("%w: %s %s: got %d bytes, the plan says %d", ErrHash, what, url, n, size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != strings.ToLower(sum) {
		f.Close()
		return nil, fmt.Errorf("%w: %s %s: sha256 %s, the plan says %s", ErrHash, what, url, got, strings.ToLower(sum))
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, fmt.Errorf("kexec: %s: %w", what, err)
	}
	return f, nil
}

// hashAndStore copies r to h and to f until r's EOF and returns the bytes
// read. f is written in a goroutine of its own, so that filling the memfd
// (its pages allocated and copied into: 0.7-0.9 s for the 39 MB initrd
// under TCG) overlaps the hash (3 s) instead of following every chunk of
// it; writeTime (set when it returns) is the time spent in f.Write. A
// chunk is handed to the writer after it is hashed, in order; the first
// error of either side stops both.
func hashAndStore(r io.Reader, h io.Writer, f io.Writer, writeTime *time.Duration) (int64, error) {
	const nbuf, bufSize = 4, 1 << 20
	free := make(chan []byte, nbuf)
	for range nbuf {
		free <- make([]byte, bufSize)
	}
	work := make(chan []byte, nbuf)
	written := make(chan error, 1)
	go func() {
		var werr error
		var took time.Duration
		for b := range work {
			if werr == nil {
				start := time.Now()
				_, werr = f.Write(b)
				took += time.Since(start)
			}
			free <- b[:cap(b)]
		}
		*writeTime = took
		written <- werr
	}()
	var n int64
	var rerr error
	for {
		b := <-free
		m, err := r.Read(b)
		if m > 0 {
			n += int64(m)
			if _, herr := h.Write(b[:m]); herr != nil {
				rerr = herr
				break
			}
			work <- b[:m]
		} else {
			free <- b
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			rerr = err
			break
		}
	}
	close(work)
	werr := <-written
	if rerr != nil {
		return n, rerr
	}
	return n, werr
}

// memFile is an anonymous in-memory file (memfd_create(2)).
func memFile(name string) (*os.File, error) {
	fd, err := unix.MemfdCreate("corral-kexec-"+name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	return os.NewFile(uintptr(fd), "memfd:corral-kexec-"+name), nil
}

// FileLoad loads with kexec_file_load(2) (u-root's kexec.FileLoad).
func FileLoad(kernel, initrd *os.File, cmdline string) error {
	return ukexec.FileLoad(kernel, initrd, cmdline)
}

// LockdownFile is where the kernel says its lockdown mode (securityfs).
const LockdownFile = "/sys/kernel/security/lockdown"

// Lockdown returns the kernel's lockdown mode from the content of
// LockdownFile ("none [integrity] confidentiality": the bracketed word):
// "none", "integrity" or "confidentiality", or "" when b says none of
// them.
func Lockdown(b []byte) string {
	for _, w := range strings.Fields(string(b)) {
		if len(w) > 2 && w[0] == '[' && w[len(w)-1] == ']' {
			switch m := w[1 : len(w)-1]; m {
			case "none", "integrity", "confidentiality":
				return m
			}
		}
	}
	return ""
}

// lockedDown reports whether the running kernel is locked down (Secure
// Boot turns integrity lockdown on): kexec_load is then refused, and only
// kexec_file_load of a kernel signed by a key the kernel trusts is let
// through. A kernel without securityfs mounted is taken as not locked.
func lockedDown(file string) (string, bool) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", false
	}
	m := Lockdown(b)
	return m, m != "" && m != "none"
}

// AutoLoad loads with SegmentsLoad, else (a machine booted by EFI, or a
// kexec_load the kernel refused) with FileLoad, and says which on console
// and logger. A locked-down kernel (Secure Boot) goes straight to
// FileLoad: kexec_load is refused there, and kexec_file_load checks the
// next kernel's signature (Debian's kernels are signed).
func AutoLoad(kernel, initrd *os.File, cmdline string, console io.Writer, logger *slog.Logger) error {
	return autoLoad(kernel, initrd, cmdline, console, logger, LockdownFile, SegmentsLoad, FileLoad)
}

// loadFunc is SegmentsLoad's and FileLoad's shape.
type loadFunc func(kernel, initrd *os.File, cmdline string) error

// autoLoad is AutoLoad with the lockdown file and the loaders given.
func autoLoad(kernel, initrd *os.File, cmdline string, console io.Writer, logger *slog.Logger, lockFile string, segments, file loadFunc) error {
	if runtime.GOARCH == "arm64" {
		mode, locked := lockedDown(lockFile)
		how, err := loadARM64(kernel, initrd, cmdline, locked, file, SegmentsLoadARM64)
		if err != nil {
			return fmt.Errorf("arm64: %w", err)
		}
		fmt.Fprintf(console, "corral: kexec: loaded with %s (arm64 Image)\n", how)
		logger.Info("kexec loaded", "syscall", how, "arch", "arm64", "lockdown", mode)
		return nil
	}
	if mode, locked := lockedDown(lockFile); locked {
		if err := file(kernel, initrd, cmdline); err != nil {
			return fmt.Errorf("kexec_file_load under kernel lockdown (%s): %w", mode, err)
		}
		fmt.Fprintf(console, "corral: kexec: loaded with kexec_file_load (kernel lockdown: %s)\n", mode)
		logger.Info("kexec loaded", "syscall", "kexec_file_load", "lockdown", mode)
		return nil
	}
	err := segments(kernel, initrd, cmdline)
	if err == nil {
		fmt.Fprintln(console, "corral: kexec: loaded with kexec_load")
		logger.Info("kexec loaded", "syscall", "kexec_load")
		return nil
	}
	if !errors.Is(err, ErrEFI) {
		logger.Warn("kexec_load failed: trying kexec_file_load", "err", err)
		fmt.Fprintf(console, "corral: kexec: %v; trying kexec_file_load\n", err)
	}
	if err := file(kernel, initrd, cmdline); err != nil {
		return err
	}
	fmt.Fprintln(console, "corral: kexec: loaded with kexec_file_load")
	logger.Info("kexec loaded", "syscall", "kexec_file_load")
	return nil
}

// unload drops the loaded kernel (kexec_file_load's KEXEC_FILE_UNLOAD
// frees the image however it was loaded).
func unload() error {
	return unix.KexecFileLoad(-1, -1, "", unix.KEXEC_FILE_UNLOAD)
}
