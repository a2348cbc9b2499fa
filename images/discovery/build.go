// Package discovery builds the boot images (docs/architecture.md, steps 5-7)
// from Debian's linux-image-amd64 kernel (downloaded with apt, unpacked
// with dpkg-deb, never installed), a curated set of its modules staged
// with their dependency chains and indexed by `depmod -b`, and a u-root
// initramfs holding u-root's core commands, corral-node as the uinit,
// pci.ids and Debian's mke2fs with its shared libraries.
//
// Two profiles: Discover (`corral-node discover`, corral-node built with
// AgentBuildTag, xz, within MaxInitrdSize) and Hypervisor (the same plus
// QEMU, qemu-img, their libraries and firmware and the node's modules;
// `corral-node hypervisor --boot`; lz4). Builds are cached by a hash of
// their inputs (kernel package and version, module list, u-root version,
// the agent's source, pci.ids, the host files with their libraries and
// their Debian package versions), so a rebuild with the same inputs is a
// lookup. It needs apt-get, apt-cache, dpkg-deb, dpkg-query, depmod, xz
// and go, and for the hypervisor image qemu-system-x86 and qemu-utils.
package discovery

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
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
const FormatVersion = "corral-discovery-8"

// MaxInitrdSize is the budget of the compressed discovery initramfs
// (docs/architecture.md, "The boot images and the agents are built for
// power-on → READY"). The hypervisor image has none. 11 MiB since the
// agent proves a TPM's endorsement key (2026-11-28: zstd 10,572,550 bytes,
// 87 KB over the 10 MiB it had; falling back to xz would cost ~1.7 s of
// unpacking per discovery boot, the 87 KB ~0.1 s on the wire). 15 MiB
// since the agent applies disk layouts (2026-11-29: zstd 14,265,538
// bytes): mdadm, lvm and mkswap bring lvm2's libraries (libgcrypt,
// libsystemd, libdevmapper, libpcre2 and more), some 3.7 MB compressed,
// about 0.3 s more on a 100 Mbit/s boot LAN and less than xz's unpacking
// would cost.
const MaxInitrdSize = 15 << 20

// DefaultPCIIDs are where Debian's pci.ids package (and hwdata) put the
// PCI ID database.
var DefaultPCIIDs = []string{"/usr/share/misc/pci.ids", "/usr/share/hwdata/pci.ids"}

// Profile names an image this package builds.
type Profile string

const (
	// Discover is the discovery image: corral-node built with
	// AgentBuildTag, `corral-node discover` as the uinit.
	Discover Profile = "discover"
	// Hypervisor is the discovery image's content plus QEMU, qemu-img,
	// their firmware and the node's modules, with corral-node built
	// without AgentBuildTag and `corral-node hypervisor --boot` as the
	// uinit.
	Hypervisor Profile = "hypervisor"
)

// HypervisorModules are the modules the hypervisor image adds to Modules:
// taps, bridges, vhost-net, VLANs and KVM (with their dependency chains).
var HypervisorModules = []string{"tun", "bridge", "vhost_net", "8021q", "kvm", "kvm_intel", "kvm_amd"}

// ARM64HypervisorModules are HypervisorModules on arm64, where KVM is
// built into Debian's kernel (no kvm modules).
var ARM64HypervisorModules = []string{"tun", "bridge", "vhost_net", "8021q"}

// recipe is what differs between the profiles.
type recipe struct {
	profile   Profile
	subdir    string // of CacheDir holding the finished builds
	modules   []string
	tag       string // corral-node build tag
	uinitArgs []string
	paths     []string // host files at their own paths (ldd'd)
	firmware  []string // QEMU firmware names
	// data are architecture-independent files of the build host at their
	// own paths (not ELF: no closure), in a foreign build.
	data     []string
	pciIDs   bool // ship pci.ids (facts name PCI devices; only the discovery agent collects them)
	packages []string
	// sysPackages are a foreign architecture's Debian packages the
	// paths come from (FetchSysroot); empty: the build host's files.
	sysPackages []string
	compress    string // zstd (xz when over maxSize), xz, lz4 or gzip
	maxSize     int64  // 0: no budget
}

func (o Options) recipe(p Profile) (recipe, error) {
	if o.Arch != "" && o.Arch != ArchAMD64 {
		// The host files come from the architecture's own Debian
		// packages (FetchSysroot), their libraries from elfroot.Closure.
		switch p {
		case Discover:
			return recipe{profile: p, subdir: o.Arch, modules: o.Modules, tag: AgentBuildTag, uinitArgs: []string{"discover"}, pciIDs: true,
				paths: DiscoverHostFiles, sysPackages: ARM64DiscoverPackages, compress: "zstd", maxSize: MaxInitrdSize}, nil
		case Hypervisor:
			return recipe{profile: p, subdir: filepath.Join(o.Arch, "hypervisor"), modules: append(append([]string(nil), o.Modules...), ARM64HypervisorModules...),
				uinitArgs: []string{"hypervisor", "--boot"},
				paths:     append(append([]string(nil), DiscoverHostFiles...), ARM64HypervisorHostFiles...), firmware: ARM64QEMUFirmware,
				data: ARM64UEFIFirmware, packages: []string{ARM64UEFIPackage},
				sysPackages: append(append([]string(nil), ARM64DiscoverPackages...), ARM64HypervisorPackages...), compress: "lz4"}, nil
		}
		return recipe{}, fmt.Errorf("discovery: unknown profile %q", p)
	}
	switch p {
	case Discover:
		// zstd at its highest level (CONFIG_RD_ZSTD): the kernel unpacks
		// it in a third of xz's time (1.7 s less per discovery boot under
		// TCG, bench/README.md "Initramfs compression"); xz (CONFIG_RD_XZ,
		// ~10 % smaller) when zstd's output is over the 10 MB budget.
		return recipe{profile: p, modules: o.Modules, tag: AgentBuildTag, uinitArgs: []string{"discover"}, pciIDs: true,
			paths: DiscoverHostFiles, packages: DiscoverPackages, compress: "zstd", maxSize: MaxInitrdSize}, nil
	case Hypervisor:
		// lz4 (legacy frame, the kernel's CONFIG_RD_LZ4): no budget, and
		// the kernel unpacks it fastest of what it can read: 1.2 s sooner
		// at init than gzip under TCG for 4 MB (13 %) more on the wire
		// (bench/README.md, "Initramfs compression").
		return recipe{profile: p, subdir: "hypervisor", modules: append(append([]string(nil), o.Modules...), HypervisorModules...),
			uinitArgs: []string{"hypervisor", "--boot"},
			paths:     append(append([]string(nil), DiscoverHostFiles...), HypervisorHostFiles...), firmware: QEMUFirmware,
			packages: append(append([]string(nil), DiscoverPackages...), HypervisorPackages...), compress: "lz4"}, nil
	}
	return recipe{}, fmt.Errorf("discovery: unknown profile %q", p)
}

// Options configure Build.
type Options struct {
	// SourceDir is the root of the Corral module (holds go.mod and
	// cmd/corral-node).
	SourceDir string
	// CacheDir holds finished discovery builds (CacheDir/<key>/),
	// hypervisor builds (CacheDir/hypervisor/<key>/) and downloaded
	// kernel packages (CacheDir/debs).
	CacheDir string
	// Modules are the kernel modules to stage (default Modules); the
	// hypervisor image adds HypervisorModules.
	Modules []string
	// Arch is the machines' architecture, as Debian and Go name it:
	// "amd64" (default) or "arm64". It picks the kernel package
	// (linux-image-<arch>, through apt's multiarch for a foreign one),
	// GOARCH for u-root and corral-node, and the cache's subdirectory.
	// An arm64 build has only the Discover profile and ships no host
	// tools (mke2fs, mdadm, lvm: the build host's binaries are amd64):
	// it inventories a machine; installing onto one needs them.
	Arch string
	// KernelMeta is the Debian meta package (default MetaPackage, or
	// linux-image-<Arch>:<Arch> for another Arch).
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
	// Progress, when set, is told each stage of a build as it starts
	// (corrald images build shows them); nil says nothing.
	Progress func(stage string)
}

func (o Options) stage(s string) {
	if o.Progress != nil {
		o.Progress(s)
	}
}

// Result describes a built (or cached) image.
type Result struct {
	Profile      Profile           `json:"profile"`
	Key          string            `json:"key"`
	Dir          string            `json:"dir"`
	Kernel       string            `json:"kernel"`
	Initrd       string            `json:"initrd"`
	KernelSize   int64             `json:"kernel_size"`
	InitrdSize   int64             `json:"initrd_size"`
	KernelSHA256 string            `json:"kernel_sha256"`
	InitrdSHA256 string            `json:"initrd_sha256"`
	Compression  string            `json:"initrd_compression"`
	Package      KernelPackage     `json:"kernel_package"`
	Release      string            `json:"kernel_release"`
	URoot        string            `json:"uroot_version"`
	Modules      []string          `json:"modules"`
	Packages     map[string]string `json:"debian_packages,omitempty"`
	BuildTime    time.Duration     `json:"build_time"`
	Cached       bool              `json:"-"`
}

// Inputs are what the cache key covers.
type Inputs struct {
	Format      string            `json:"format"`
	Profile     Profile           `json:"profile"`
	Package     KernelPackage     `json:"kernel_package"`
	Modules     []string          `json:"modules"`
	URoot       string            `json:"uroot_version"`
	Commands    []string          `json:"uroot_commands"`
	AgentSource string            `json:"agent_source_sha256"`
	AgentTag    string            `json:"agent_build_tag"`
	AgentVer    string            `json:"agent_version"`
	PCIIDs      string            `json:"pci_ids_sha256"`
	HostFiles   string            `json:"host_files_sha256"`
	Packages    map[string]string `json:"debian_packages"`
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
	switch o.Arch {
	case "", ArchAMD64:
		o.Arch = ArchAMD64
	case ArchARM64:
	default:
		return fmt.Errorf("discovery: architecture %q: only %s and %s are built", o.Arch, ArchAMD64, ArchARM64)
	}
	if len(o.Modules) == 0 {
		o.Modules = ModulesFor(o.Arch)
	}
	if o.AgentVersion == "" {
		o.AgentVersion = "dev"
	}
	if len(o.Commands) == 0 {
		o.Commands = Commands
	}
	if o.KernelMeta == "" {
		o.KernelMeta = MetaPackage
		if o.Arch != ArchAMD64 {
			o.KernelMeta = "linux-image-" + o.Arch + ":" + o.Arch
		}
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

// Build returns the cached discovery image for the current inputs,
// building it when the cache lacks it. Concurrent builds into one
// CacheDir are serialised by a lock file.
func Build(ctx context.Context, o Options) (Result, error) {
	rs, err := BuildProfiles(ctx, o, Discover)
	if err != nil {
		return Result{}, err
	}
	return rs[0], nil
}

// BuildProfiles returns the images of profiles (in that order), each from
// the cache when its inputs are unchanged. The profiles missing from the
// cache share one kernel download and unpack. Concurrent builds into one
// CacheDir are serialised by a lock file.
func BuildProfiles(ctx context.Context, o Options, profiles ...Profile) ([]Result, error) {
	start := time.Now()
	if err := o.defaults(); err != nil {
		return nil, err
	}
	log := o.Logger
	if err := os.MkdirAll(o.CacheDir, 0o755); err != nil {
		return nil, err
	}
	unlock, err := lock(filepath.Join(o.CacheDir, ".lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()

	o.stage("resolve inputs (kernel package, u-root, agent source)")
	common, urootDir, err := commonInputs(ctx, o)
	if err != nil {
		return nil, err
	}
	type job struct {
		rc    recipe
		in    Inputs
		files []hostFile
		dir   string
	}
	results := make([]Result, len(profiles))
	var todo []int
	jobs := make([]job, len(profiles))
	for i, p := range profiles {
		rc, err := o.recipe(p)
		if err != nil {
			return nil, err
		}
		in, files, err := profileInputs(ctx, o, common, rc)
		if err != nil {
			return nil, err
		}
		dir := filepath.Join(o.CacheDir, rc.subdir, in.Key())
		jobs[i] = job{rc, in, files, dir}
		if r, err := readResult(dir); err == nil {
			r.Cached = true
			results[i] = r
			log.Info(string(p)+" image cached", "key", in.Key()[:12], "initrd_bytes", r.InitrdSize, "lookup", time.Since(start).Round(time.Millisecond))
			continue
		}
		todo = append(todo, i)
	}
	if len(todo) == 0 {
		return results, nil
	}

	work, err := os.MkdirTemp(o.CacheDir, ".build-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)

	// Kernel and modules: one unpack for every profile built.
	t := time.Now()
	root := filepath.Join(work, "kernel")
	o.stage("fetch and unpack " + common.Package.Name + " " + common.Package.Version)
	if _, err := FetchKernel(ctx, common.Package, filepath.Join(o.CacheDir, debsDir(common.Package)), root); err != nil {
		return nil, err
	}
	rel := common.Package.Release()
	stages := map[int]string{}
	staged := map[int][]string{}
	o.stage("stage kernel modules")
	for _, i := range todo {
		stage := filepath.Join(work, "stage-"+string(jobs[i].rc.profile))
		if staged[i], err = StageModules(root, stage, rel, jobs[i].rc.modules); err != nil {
			return nil, err
		}
		stages[i] = stage
	}
	kernel := filepath.Join(work, "vmlinuz")
	if err := copyFile(filepath.Join(root, "boot", "vmlinuz-"+rel), kernel); err != nil {
		return nil, fmt.Errorf("kernel image: %w", err)
	}
	os.RemoveAll(root) // ~400 MB unpacked
	log.Info("kernel and modules staged", "release", rel, "profiles", len(todo), "took", time.Since(t).Round(time.Millisecond))

	for _, i := range todo {
		j := jobs[i]
		r, err := buildOne(ctx, o, urootDir, work, kernel, stages[i], j.rc, j.in, j.files, j.dir, staged[i])
		if err != nil {
			return nil, err
		}
		results[i] = r
	}
	prune(o.CacheDir, common.Package, log)
	return results, nil
}

// buildOne makes one profile's image from the staged kernel and modules
// and moves it into dir.
func buildOne(ctx context.Context, o Options, urootDir, work, kernel, stage string, rc recipe, in Inputs, files []hostFile, dir string, staged []string) (Result, error) {
	start := time.Now()
	log := o.Logger
	key := in.Key()
	log.Info("building "+string(rc.profile)+" image", "key", key[:12], "kernel", in.Package.Name+"="+in.Package.Version, "uroot", in.URoot)
	pw := filepath.Join(work, string(rc.profile))
	out := filepath.Join(pw, "out")
	if err := os.MkdirAll(out, 0o755); err != nil {
		return Result{}, err
	}
	if err := copyFile(kernel, filepath.Join(out, "vmlinuz")); err != nil {
		return Result{}, err
	}
	cpio := filepath.Join(pw, "initramfs.cpio")
	extra := []string{filepath.Join(stage, "lib/modules") + ":lib/modules"}
	if rc.pciIDs {
		trimmed := filepath.Join(pw, "pci.ids")
		if err := trimPCIIDs(o.PCIIDs, trimmed); err != nil {
			return Result{}, err
		}
		extra = append(extra, trimmed+":usr/share/misc/pci.ids")
	}
	for _, f := range files {
		extra = append(extra, f.extra())
	}
	t := time.Now()
	o.stage("build " + string(rc.profile) + " initramfs (u-root, corral-node)")
	if err := buildUroot(ctx, log, urootBuild{srcDir: o.SourceDir, urootDir: urootDir, arch: o.Arch, commands: o.Commands, version: o.AgentVersion,
		tag: rc.tag, uinitArgs: rc.uinitArgs, work: pw, out: cpio, extra: extra}); err != nil {
		return Result{}, fmt.Errorf("u-root (%s): %w", rc.profile, err)
	}
	log.Info("u-root initramfs built", "profile", string(rc.profile), "took", time.Since(t).Round(time.Millisecond))
	t = time.Now()
	initrd := filepath.Join(out, "initrd.img")
	o.stage("compress " + string(rc.profile) + " initramfs (" + rc.compress + ")")
	compression, err := compressInitrd(log, rc, cpio, initrd)
	if err != nil {
		return Result{}, err
	}
	log.Info("initramfs compressed", "profile", string(rc.profile), "with", compression, "took", time.Since(t).Round(time.Millisecond))
	os.Remove(cpio)

	r := Result{Profile: rc.profile, Key: key, Dir: dir, Package: in.Package, Release: in.Package.Release(), URoot: in.URoot,
		Modules: staged, Packages: in.Packages, Compression: compression}
	if r.KernelSHA256, r.KernelSize, err = checksum(filepath.Join(out, "vmlinuz")); err != nil {
		return Result{}, err
	}
	if r.InitrdSHA256, r.InitrdSize, err = checksum(initrd); err != nil {
		return Result{}, err
	}
	if rc.maxSize > 0 && r.InitrdSize > rc.maxSize {
		keep := filepath.Join(o.CacheDir, "rejected-"+string(rc.profile)+"-initrd.img")
		if err := os.Rename(initrd, keep); err != nil {
			keep = initrd // not moved aside: the error names where it still is
		}
		return Result{}, fmt.Errorf("%s: %s initramfs is %d bytes, over the %d-byte budget", keep, rc.profile, r.InitrdSize, rc.maxSize)
	}
	// BuildTime is this profile's own time plus its share of the
	// kernel unpack, which the caller reports separately.
	r.BuildTime = time.Since(start)
	b, _ := json.MarshalIndent(struct {
		Result
		Inputs Inputs `json:"inputs"`
	}{r, in}, "", "  ")
	if err := os.WriteFile(filepath.Join(out, "manifest.json"), b, 0o644); err != nil {
		return Result{}, err
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return Result{}, err
	}
	os.RemoveAll(dir)
	if err := os.Rename(out, dir); err != nil {
		return Result{}, err
	}
	r.Kernel, r.Initrd = filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initrd.img")
	pruneBuilds(filepath.Dir(dir), key, keepBuilds, log)
	log.Info(string(rc.profile)+" image built", "key", key[:12], "initrd_bytes", r.InitrdSize, "kernel_bytes", r.KernelSize, "took", r.BuildTime.Round(time.Second))
	return r, nil
}

// commonInputs resolves the inputs every profile shares (Profile,
// AgentSource, AgentTag, HostFiles and Packages are left empty) and the
// u-root module's directory.
func commonInputs(ctx context.Context, o Options) (Inputs, string, error) {
	kp, err := ResolveKernel(ctx, o.KernelMeta)
	if err != nil {
		return Inputs{}, "", err
	}
	if o.Arch != ArchAMD64 {
		kp.Arch = o.Arch
	}
	urootDir, urootVersion, err := goModule(ctx, o.SourceDir, URootModule)
	if err != nil {
		return Inputs{}, "", err
	}
	pci, _, err := checksum(o.PCIIDs)
	if err != nil {
		return Inputs{}, "", err
	}
	cmds := append([]string(nil), o.Commands...)
	sort.Strings(cmds)
	return Inputs{Format: FormatVersion, Package: kp, URoot: urootVersion, Commands: cmds, AgentVer: o.AgentVersion, PCIIDs: pci}, urootDir, nil
}

// profileInputs completes common for rc without building anything.
func profileInputs(ctx context.Context, o Options, common Inputs, rc recipe) (Inputs, []hostFile, error) {
	in := common
	in.Profile, in.AgentTag = rc.profile, rc.tag
	in.Modules = append([]string(nil), rc.modules...)
	sort.Strings(in.Modules)
	var err error
	if in.AgentSource, err = agentSourceHash(ctx, o.SourceDir, o.Arch, rc.tag); err != nil {
		return Inputs{}, nil, err
	}
	if len(rc.sysPackages) > 0 {
		files, pkgs, err := foreignHostFiles(ctx, o, rc)
		if err != nil {
			return Inputs{}, nil, fmt.Errorf("%s image (%s): %w", rc.profile, o.Arch, err)
		}
		if in.HostFiles, err = filesHash(files); err != nil {
			return Inputs{}, nil, err
		}
		// The build host's packages of the architecture-independent
		// data files, beside the root's.
		host, err := packageVersions(ctx, rc.packages)
		if err != nil {
			return Inputs{}, nil, err
		}
		in.Packages = maps.Clone(pkgs)
		maps.Copy(in.Packages, host)
		return in, files, nil
	}
	files, err := resolveHostFiles(ctx, rc.paths, rc.firmware)
	if err != nil {
		return Inputs{}, nil, fmt.Errorf("%s image: %w", rc.profile, err)
	}
	if in.HostFiles, err = hostFilesHash(files); err != nil {
		return Inputs{}, nil, err
	}
	if in.Packages, err = packageVersions(ctx, rc.packages); err != nil {
		return Inputs{}, nil, err
	}
	return in, files, nil
}

// AgentSourceHash hashes what corral-node is built from inside the
// Corral module: go.mod, go.sum and the Go and embedded files of every
// main-module package cmd/corral-node imports (paths and contents).
func AgentSourceHash(ctx context.Context, srcDir string) (string, error) {
	return agentSourceHash(ctx, srcDir, ArchAMD64, AgentBuildTag)
}

// agentSourceHash is AgentSourceHash for corral-node built for GOARCH
// arch with tag ("": none).
func agentSourceHash(ctx context.Context, srcDir, arch, tag string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "list", "-deps",
		"-f", `{{if .Module}}{{if .Module.Main}}{{.Dir}}{{range .GoFiles}} {{.}}{{end}}{{range .EmbedFiles}} {{.}}{{end}}{{end}}{{end}}`,
		"./"+AgentPackage)
	cmd.Dir = srcDir
	cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH="+arch, "CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=-tags="+tag)
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
	// Closing the file releases the lock whether or not LOCK_UN did.
	return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
}

// keepBuilds is how many finished builds of a profile the cache keeps
// (the newest).
const keepBuilds = 3

// pruneBuilds removes all but the keep newest builds in dir (never
// current).
func pruneBuilds(dir, current string, keep int, log *slog.Logger) {
	ents, err := os.ReadDir(dir)
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
		if st, err := os.Stat(filepath.Join(dir, e.Name(), "manifest.json")); err == nil {
			builds = append(builds, build{e.Name(), st.ModTime()})
		}
	}
	sort.Slice(builds, func(i, j int) bool { return builds[i].mod.After(builds[j].mod) })
	for i, b := range builds {
		if i >= keep-1 {
			os.RemoveAll(filepath.Join(dir, b.name))
			log.Debug("pruned cached image", "dir", dir, "key", b.name[:12])
		}
	}
}

// debsDir is the cache's subdirectory holding k's architecture's kernel
// packages (each keeps only its newest: see prune).
func debsDir(k KernelPackage) string {
	if k.Arch == "" {
		return "debs"
	}
	return "debs-" + k.Arch
}

// prune removes the kernel packages of k's architecture of other versions
// than k.
func prune(cacheDir string, k KernelPackage, log *slog.Logger) {
	debs, _ := filepath.Glob(filepath.Join(cacheDir, debsDir(k), "*.deb"))
	want := findDeb(filepath.Join(cacheDir, debsDir(k), k.Name+"_*.deb"), k.Version)
	for _, d := range debs {
		if d != want {
			log.Debug("pruned kernel package", "deb", filepath.Base(d))
			os.Remove(d)
		}
	}
}
