// Package discovery builds the discovery image (DESIGN.md §1 step 5, §5):
// Debian's linux-image-amd64 kernel (downloaded with apt, unpacked with
// dpkg-deb, never installed), a curated set of its modules staged with
// their dependency chains and indexed by `depmod -b`, and a u-root
// initramfs holding u-root's core commands with `corral-node discover` as
// the uinit and pci.ids, gzip-compressed. Builds are cached by a hash of
// their inputs (kernel package and version, module list, u-root version,
// the agent's source and pci.ids), so a rebuild with the same inputs is a
// lookup. It needs apt-get, apt-cache, dpkg-deb, depmod and go.
package discovery

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// FormatVersion changes whenever the build recipe changes in a way the
// other inputs do not capture.
const FormatVersion = "corral-discovery-4"

// MaxInitrdSize is the budget of the compressed initramfs (issue 5).
const MaxInitrdSize = 10 << 20

// DefaultPCIIDs are where Debian's pci.ids package (and hwdata) put the
// PCI ID database.
var DefaultPCIIDs = []string{"/usr/share/misc/pci.ids", "/usr/share/hwdata/pci.ids"}

// Options configure Build.
type Options struct {
	// SourceDir is the root of the Corral module (holds go.mod and
	// cmd/corral-node).
	SourceDir string
	// CacheDir holds finished builds (CacheDir/<key>/) and downloaded
	// kernel packages (CacheDir/debs).
	CacheDir string
	// Modules are the kernel modules to stage (default Modules).
	Modules []string
	// KernelMeta is the Debian meta package (default MetaPackage).
	KernelMeta string
	// Commands are the u-root commands (directories under cmds/ of the
	// u-root module) to include (default Commands).
	Commands []string
	// AgentVersion is stamped into corral-node (its `version`, reported
	// to the appliance at Register); default "dev".
	AgentVersion string
	// PCIIDs is the pci.ids to ship (default: the first of DefaultPCIIDs).
	PCIIDs string
	Logger *slog.Logger
}

// Result describes a built (or cached) image.
type Result struct {
	Key          string        `json:"key"`
	Dir          string        `json:"dir"`
	Kernel       string        `json:"kernel"`
	Initrd       string        `json:"initrd"`
	KernelSize   int64         `json:"kernel_size"`
	InitrdSize   int64         `json:"initrd_size"`
	KernelSHA256 string        `json:"kernel_sha256"`
	InitrdSHA256 string        `json:"initrd_sha256"`
	Package      KernelPackage `json:"kernel_package"`
	Release      string        `json:"kernel_release"`
	URoot        string        `json:"uroot_version"`
	Modules      []string      `json:"modules"`
	BuildTime    time.Duration `json:"build_time"`
	Cached       bool          `json:"-"`
}

// Inputs are what the cache key covers.
type Inputs struct {
	Format      string        `json:"format"`
	Package     KernelPackage `json:"kernel_package"`
	Modules     []string      `json:"modules"`
	URoot       string        `json:"uroot_version"`
	Commands    []string      `json:"uroot_commands"`
	AgentSource string        `json:"agent_source_sha256"`
	AgentVer    string        `json:"agent_version"`
	PCIIDs      string        `json:"pci_ids_sha256"`
}

// Key is the cache key: the SHA-256 of the inputs' JSON.
func (in Inputs) Key() string {
	b, _ := json.Marshal(in)
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func (o *Options) defaults() error {
	if o.SourceDir == "" {
		return errors.New("discovery: SourceDir is required")
	}
	if o.CacheDir == "" {
		return errors.New("discovery: CacheDir is required")
	}
	if len(o.Modules) == 0 {
		o.Modules = Modules
	}
	if o.AgentVersion == "" {
		o.AgentVersion = "dev"
	}
	if len(o.Commands) == 0 {
		o.Commands = Commands
	}
	if o.KernelMeta == "" {
		o.KernelMeta = MetaPackage
	}
	if o.PCIIDs == "" {
		for _, p := range DefaultPCIIDs {
			if _, err := os.Stat(p); err == nil {
				o.PCIIDs = p
				break
			}
		}
		if o.PCIIDs == "" {
			return fmt.Errorf("discovery: no pci.ids in %s: install Debian's pci.ids package", strings.Join(DefaultPCIIDs, ", "))
		}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Build returns the cached image for the current inputs, building it when
// the cache lacks it. Concurrent builds into one CacheDir are serialised
// by a lock file.
func Build(ctx context.Context, o Options) (Result, error) {
	start := time.Now()
	if err := o.defaults(); err != nil {
		return Result{}, err
	}
	log := o.Logger
	if err := os.MkdirAll(o.CacheDir, 0o755); err != nil {
		return Result{}, err
	}
	unlock, err := lock(filepath.Join(o.CacheDir, ".lock"))
	if err != nil {
		return Result{}, err
	}
	defer unlock()

	in, urootDir, err := inputs(ctx, o)
	if err != nil {
		return Result{}, err
	}
	key := in.Key()
	dir := filepath.Join(o.CacheDir, key)
	if r, err := readResult(dir); err == nil {
		r.Cached = true
		log.Info("discovery image cached", "key", key[:12], "initrd_bytes", r.InitrdSize, "lookup", time.Since(start).Round(time.Millisecond))
		return r, nil
	}
	log.Info("building discovery image", "key", key[:12], "kernel", in.Package.Name+"="+in.Package.Version, "uroot", in.URoot)

	work, err := os.MkdirTemp(o.CacheDir, ".build-")
	if err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(work)
	out := filepath.Join(work, "out")
	if err := os.MkdirAll(out, 0o755); err != nil {
		return Result{}, err
	}

	// Kernel and modules.
	t := time.Now()
	root := filepath.Join(work, "kernel")
	if _, err := FetchKernel(ctx, in.Package, filepath.Join(o.CacheDir, "debs"), root); err != nil {
		return Result{}, err
	}
	rel := in.Package.Release()
	if err := copyFile(filepath.Join(root, "boot", "vmlinuz-"+rel), filepath.Join(out, "vmlinuz"), 0o644); err != nil {
		return Result{}, fmt.Errorf("kernel image: %w", err)
	}
	stage := filepath.Join(work, "stage")
	staged, err := StageModules(root, stage, rel, o.Modules)
	if err != nil {
		return Result{}, err
	}
	os.RemoveAll(root) // ~400 MB unpacked
	log.Info("kernel and modules staged", "release", rel, "modules", len(staged), "took", time.Since(t).Round(time.Millisecond))

	// Userland.
	t = time.Now()
	cpio := filepath.Join(work, "initramfs.cpio")
	extra := []string{
		filepath.Join(stage, "lib/modules") + ":lib/modules",
		o.PCIIDs + ":usr/share/misc/pci.ids",
	}
	if err := buildUroot(ctx, log, o.SourceDir, urootDir, o.Commands, o.AgentVersion, work, cpio, extra); err != nil {
		return Result{}, fmt.Errorf("u-root: %w", err)
	}
	log.Info("u-root initramfs built", "took", time.Since(t).Round(time.Millisecond))
	if err := gzipFile(cpio, filepath.Join(out, "initrd.img")); err != nil {
		return Result{}, err
	}

	r := Result{Key: key, Dir: dir, Package: in.Package, Release: rel, URoot: in.URoot, Modules: staged, BuildTime: time.Since(start)}
	if r.KernelSHA256, r.KernelSize, err = checksum(filepath.Join(out, "vmlinuz")); err != nil {
		return Result{}, err
	}
	if r.InitrdSHA256, r.InitrdSize, err = checksum(filepath.Join(out, "initrd.img")); err != nil {
		return Result{}, err
	}
	if r.InitrdSize > MaxInitrdSize {
		keep := filepath.Join(o.CacheDir, "rejected-initrd.img")
		os.Rename(filepath.Join(out, "initrd.img"), keep)
		return Result{}, fmt.Errorf("%s: "+"discovery initramfs is %d bytes, over the %d-byte budget", keep, r.InitrdSize, MaxInitrdSize)
	}
	b, _ := json.MarshalIndent(struct {
		Result
		Inputs Inputs `json:"inputs"`
	}{r, in}, "", "  ")
	if err := os.WriteFile(filepath.Join(out, "manifest.json"), b, 0o644); err != nil {
		return Result{}, err
	}
	os.RemoveAll(dir)
	if err := os.Rename(out, dir); err != nil {
		return Result{}, err
	}
	r.Kernel, r.Initrd = filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initrd.img")
	prune(o.CacheDir, key, in.Package, keepBuilds, log)
	log.Info("discovery image built", "key", key[:12], "initrd_bytes", r.InitrdSize, "kernel_bytes", r.KernelSize, "took", r.BuildTime.Round(time.Second))
	return r, nil
}

// inputs resolves what the cache key covers without building anything.
func inputs(ctx context.Context, o Options) (Inputs, string, error) {
	kp, err := ResolveKernel(ctx, o.KernelMeta)
	if err != nil {
		return Inputs{}, "", err
	}
	urootDir, urootVersion, err := goModule(ctx, o.SourceDir, URootModule)
	if err != nil {
		return Inputs{}, "", err
	}
	src, err := AgentSourceHash(ctx, o.SourceDir)
	if err != nil {
		return Inputs{}, "", err
	}
	pci, _, err := checksum(o.PCIIDs)
	if err != nil {
		return Inputs{}, "", err
	}
	mods := append([]string(nil), o.Modules...)
	sort.Strings(mods)
	cmds := append([]string(nil), o.Commands...)
	sort.Strings(cmds)
	return Inputs{Format: FormatVersion, Package: kp, Modules: mods, URoot: urootVersion, Commands: cmds, AgentVer: o.AgentVersion, AgentSource: src, PCIIDs: pci}, urootDir, nil
}

// AgentSourceHash hashes what corral-node is built from inside the
// Corral module: go.mod, go.sum and the Go and embedded files of every
// main-module package cmd/corral-node imports (paths and contents).
func AgentSourceHash(ctx context.Context, srcDir string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "list", "-deps",
		"-f", `{{if .Module}}{{if .Module.Main}}{{.Dir}}{{range .GoFiles}} {{.}}{{end}}{{range .EmbedFiles}} {{.}}{{end}}{{end}}{{end}}`,
		"./"+AgentPackage)
	cmd.Dir = srcDir
	cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH=amd64", "CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=-tags="+AgentBuildTag)
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list %s: %v: %s", AgentPackage, err, stderrOf(err))
	}
	var files []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		for _, n := range f[1:] {
			files = append(files, filepath.Join(f[0], n))
		}
	}
	files = append(files, filepath.Join(srcDir, "go.mod"), filepath.Join(srcDir, "go.sum"))
	sort.Strings(files)
	h := sha256.New()
	for _, p := range files {
		rel, _ := filepath.Rel(srcDir, p)
		b, err := os.ReadFile(p)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", filepath.ToSlash(rel), len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func readResult(dir string) (Result, error) {
	b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		return Result{}, err
	}
	var r Result
	if err := json.Unmarshal(b, &r); err != nil {
		return Result{}, err
	}
	r.Dir = dir
	r.Kernel, r.Initrd = filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initrd.img")
	for _, f := range []struct {
		path, sum string
	}{{r.Kernel, r.KernelSHA256}, {r.Initrd, r.InitrdSHA256}} {
		got, _, err := checksum(f.path)
		if err != nil {
			return Result{}, err
		}
		if got != f.sum {
			return Result{}, fmt.Errorf("%s: checksum mismatch", f.path)
		}
	}
	return r, nil
}

func gzipFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	zw, _ := gzip.NewWriterLevel(out, gzip.BestCompression)
	if _, err := io.Copy(zw, in); err != nil {
		out.Close()
		return err
	}
	if err := zw.Close(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func checksum(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// lock takes an exclusive flock on path.
func lock(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
}

// keepBuilds is how many finished builds the cache keeps (the newest).
const keepBuilds = 3

// prune removes all but the keep newest builds (never current) and the
// kernel packages of other versions than k.
func prune(cacheDir, current string, k KernelPackage, keep int, log *slog.Logger) {
	ents, err := os.ReadDir(cacheDir)
	if err != nil {
		return
	}
	type build struct {
		name string
		mod  time.Time
	}
	var builds []build
	for _, e := range ents {
		if !e.IsDir() || len(e.Name()) != 64 || e.Name() == current {
			continue
		}
		if st, err := os.Stat(filepath.Join(cacheDir, e.Name(), "manifest.json")); err == nil {
			builds = append(builds, build{e.Name(), st.ModTime()})
		}
	}
	sort.Slice(builds, func(i, j int) bool { return builds[i].mod.After(builds[j].mod) })
	for i, b := range builds {
		if i >= keep-1 {
			os.RemoveAll(filepath.Join(cacheDir, b.name))
			log.Debug("pruned cached discovery image", "key", b.name[:12])
		}
	}
	debs, _ := filepath.Glob(filepath.Join(cacheDir, "debs", "*.deb"))
	want := findDeb(filepath.Join(cacheDir, "debs", k.Name+"_*.deb"), k.Version)
	for _, d := range debs {
		if d != want {
			os.Remove(d)
		}
	}
}
