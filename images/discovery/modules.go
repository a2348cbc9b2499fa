package discovery

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"

	"golang.org/x/sync/errgroup"
)

// Modules is the curated driver set of the discovery image (boot/README.md): virtio, the common server NICs, NVMe/SATA/SAS/RAID
// storage, SCSI disks (sd_mod: without it no SATA/SAS disk gets a block
// device) and in-band IPMI. Their dependency chains are added from
// modules.dep. Names use underscores; Debian's file names may use dashes.
var Modules = []string{
	// virtio (QEMU, KVM and most clouds)
	"virtio_pci", "virtio_blk", "virtio_net", "virtio_scsi", "virtio_console", "virtio_balloon", "virtio_rng",
	// NICs
	"e1000", "e1000e", "igb", "ixgbe", "i40e", "ice", "bnxt_en", "tg3", "mlx5_core",
	// storage
	"nvme", "ahci", "sd_mod", "megaraid_sas", "mpt3sas", "smartpqi", "hpsa",
	// BMC
	"ipmi_si", "ipmi_devintf",
	// the data disk's file system (install formats it, the hypervisor
	// mounts it): ext4 and its chain; crc32c is only a soft dependency
	// (the crypto API asks for it at mount with metadata_csum), so it is
	// named here
	"ext4", "crc32c_generic", "crc32c_intel",
	// a deploy's layout: software RAID (mdadm) and LVM (device mapper);
	// no device asks for them, agent/deploy loads them by name
	"md_mod", "raid1", "raid10", "dm_mod",
}

// amd64Only are Modules that exist in amd64's kernel only.
var amd64Only = []string{"crc32c_intel"}

// ModulesFor returns Modules for Debian's arch kernel: arm64's lacks
// amd64Only (its CRC32C is crc32c_generic or the built-in ARMv8 one).
func ModulesFor(arch string) []string {
	if arch == ArchAMD64 || arch == "" {
		return Modules
	}
	var out []string
	for _, m := range Modules {
		if !slices.Contains(amd64Only, m) {
			out = append(out, m)
		}
	}
	return out
}

// normName is a module's canonical name: the file name without .ko (and
// without a compression suffix), dashes as underscores.
func normName(file string) string {
	b := filepath.Base(file)
	for _, s := range []string{".xz", ".zst", ".gz"} {
		b = strings.TrimSuffix(b, s)
	}
	return strings.ReplaceAll(strings.TrimSuffix(b, ".ko"), "-", "_")
}

// ModuleDeps is a parsed modules.dep: module name → its path (relative to
// the modules directory) and its dependencies' names.
type ModuleDeps map[string]moduleDep

type moduleDep struct {
	Path string
	Deps []string
}

// ParseModulesDep reads modules.dep ("path: dep-path dep-path ...").
func ParseModulesDep(r io.Reader) (ModuleDeps, error) {
	md := ModuleDeps{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		path, deps, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		d := moduleDep{Path: strings.TrimSpace(path)}
		for _, p := range strings.Fields(deps) {
			d.Deps = append(d.Deps, normName(p))
		}
		md[normName(d.Path)] = d
	}
	return md, sc.Err()
}

// Closure returns the modules in want plus everything they depend on, as
// sorted paths relative to the modules directory. It fails when a wanted
// module is not in md.
func (md ModuleDeps) Closure(want []string) ([]string, error) {
	seen := map[string]bool{}
	var missing []string
	var visit func(n string) bool
	visit = func(n string) bool {
		n = strings.ReplaceAll(n, "-", "_")
		if seen[n] {
			return true
		}
		if _, ok := md[n]; !ok {
			return false
		}
		seen[n] = true
		for _, d := range md[n].Deps {
			if !visit(d) {
				missing = append(missing, d+" (needed by "+n+")")
			}
		}
		return true
	}
	for _, w := range want {
		if !visit(w) {
			missing = append(missing, w)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("modules not in modules.dep: %s", strings.Join(missing, ", "))
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, md[n].Path)
	}
	sort.Strings(out)
	return out, nil
}

// StageModules copies want and its dependency chain from the unpacked
// kernel package's tree (root/lib/modules/kver) to stage/lib/modules/kver
// and runs `depmod -b stage kver` there. modules.dep of the full tree is
// made first with depmod -b root when the package lacks it (Debian ships
// none). It returns the staged modules' paths.
func StageModules(root, stage, kver string, want []string) ([]string, error) {
	src := filepath.Join(root, "lib/modules", kver)
	if _, err := os.Stat(filepath.Join(src, "modules.dep")); err != nil {
		if err := depmod(root, kver); err != nil {
			return nil, err
		}
	}
	f, err := os.Open(filepath.Join(src, "modules.dep"))
	if err != nil {
		return nil, err
	}
	md, err := ParseModulesDep(f)
	f.Close()
	if err != nil {
		return nil, err
	}
	paths, err := md.Closure(want)
	if err != nil {
		return nil, err
	}
	dst := filepath.Join(stage, "lib/modules", kver)
	// Modules are staged uncompressed, as Debian ships them: the agent
	// then hands each file to finit_module(2) as it is. They used to be
	// staged as .ko.xz, which u-root's kmodule decompresses in Go before
	// init_module: under TCG that was about 1 s per module and 7 s for
	// kvm, most of coldplug (bench/README.md, "Virtual rack"). The
	// initramfs is compressed as a whole, so the image grows less than the
	// modules do (the discovery image still has to fit MaxInitrdSize).
	var g errgroup.Group
	g.SetLimit(runtime.NumCPU())
	for _, p := range paths {
		g.Go(func() error { return copyFile(filepath.Join(src, p), filepath.Join(dst, p)) })
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	// depmod reads these to tell built-in from missing modules.
	for _, n := range []string{"modules.builtin", "modules.builtin.modinfo", "modules.order"} {
		if err := copyFile(filepath.Join(src, n), filepath.Join(dst, n)); err != nil && !os.IsNotExist(err) {
			return nil, err
		}
	}
	if err := depmod(stage, kver); err != nil {
		return nil, err
	}
	// u-root's kmodule reads modules.dep and coldplug modules.alias; the
	// binary indexes are for kmod's modprobe, which the image lacks.
	bins, _ := filepath.Glob(filepath.Join(dst, "modules.*.bin"))
	for _, b := range bins {
		os.Remove(b)
	}
	return paths, nil
}

func depmod(base, kver string) error {
	bin, err := exec.LookPath("depmod")
	if err != nil {
		for _, p := range []string{"/usr/sbin/depmod", "/sbin/depmod"} {
			if _, e := os.Stat(p); e == nil {
				bin, err = p, nil
				break
			}
		}
	}
	if err != nil {
		return fmt.Errorf("depmod not found: install Debian's kmod package")
	}
	if out, err := exec.Command(bin, "-b", base, kver).CombinedOutput(); err != nil {
		return fmt.Errorf("depmod -b %s %s: %v\n%s", base, kver, err, out)
	}
	return nil
}

// copyFile copies src to dst (mode 0644), making dst's directory.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
