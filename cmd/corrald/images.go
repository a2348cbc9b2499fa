package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/corralhq/corral/appliance"
	"github.com/corralhq/corral/images"
	"github.com/corralhq/corral/images/discovery"
	"github.com/corralhq/corral/internal/imagecache"
	"github.com/corralhq/corral/internal/progress"
	"github.com/corralhq/corral/internal/sourcetree"
	"github.com/spf13/cobra"
)

func newImagesCmd(g *globals) *cobra.Command {
	var src, cache string
	var ipxeDirs []string
	var noHyp bool
	var arch string
	img := &cobra.Command{Use: "images", Short: "Build and register boot images (offline, against the data dir)"}
	build := &cobra.Command{
		Use:   "build",
		Short: "Build (or reuse from the cache) the discovery and hypervisor images and register them in the catalog",
		Long: `Builds the discovery image from Debian's linux-image-amd64 (apt-get download,
dpkg-deb -x), a curated module set (depmod -b), u-root's core commands with
corral-node discover as the uinit, mke2fs and pci.ids, and the hypervisor image
(the same plus QEMU, qemu-img, their firmware and the node's modules, with
corral-node hypervisor --boot as the uinit), and the commissioning overlay
(smartctl, memtester, stress-ng, fio and ethtool with their libraries, a
second initrd for machines being commissioned; left out, with a note, when
the host lacks them). Registers vmlinuz, initrd.img, hypervisor-initrd.img
and commission-overlay.img in DATA_DIR/images so that corrald serve boots unknown
machines into discovery and accepted ones into the hypervisor. A build with
unchanged inputs is taken from the cache.

--arch arm64 builds the arm64 discovery image instead (Debian's
linux-image-arm64 through apt's multiarch: dpkg --add-architecture arm64 and
apt-get update first; u-root and corral-node for GOARCH=arm64; the host
tools, QEMU and their libraries from Debian's arm64 packages unpacked by
mmdebstrap), the arm64 hypervisor image and GRUB's arm64 network loader
(grub-mkimage from grub-efi-arm64-bin), and registers vmlinuz-arm64,
initrd-arm64.img, hypervisor-initrd-arm64.img and grubnetaa64.efi beside
the amd64 images, which it leaves as they are.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := g.logger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			dataDir := g.dataDir
			if src == "" {
				if src, err = sourcetree.FindFromWorkingDir(); err != nil {
					return fmt.Errorf("%w: pass --source", err)
				}
			}
			catDir := filepath.Join(dataDir, appliance.ImagesDir)
			if cache == "" {
				cache = filepath.Join(catDir, "cache")
			}
			if arch == discovery.ArchARM64 {
				return buildARM64(cmd, log, src, cache, catDir, ipxeDirs, noHyp)
			} else if arch != discovery.ArchAMD64 {
				return fmt.Errorf("--arch %q: want %s or %s", arch, discovery.ArchAMD64, discovery.ArchARM64)
			}
			profiles := []discovery.Profile{discovery.Discover, discovery.Hypervisor}
			if noHyp {
				profiles = profiles[:1]
			}
			start := time.Now()
			rep := progress.New(cmd.ErrOrStderr())
			rs, err := discovery.BuildProfiles(cmd.Context(), discovery.Options{SourceDir: src, CacheDir: cache, AgentVersion: version, Logger: log,
				Progress: func(stage string) { rep.Stage(stage, 0) }}, profiles...)
			if err != nil {
				return err
			}
			took := time.Since(start).Round(100 * time.Millisecond)
			cfg := images.Config{Dir: catDir, IPXEDirs: ipxeDirs}
			r := rs[0]
			if err := os.MkdirAll(dataDir, 0o700); err != nil {
				return err
			}
			rep.Stage("register the discovery image in "+catDir, 0)
			_, b, err := images.RegisterDiscover(cfg, r.Kernel, r.Initrd, r.Release, r.Key)
			if err != nil {
				return err
			}
			rep.Done()
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "images ready in %s (kernel %s %s, u-root %s)\n", took, r.Package.Name, r.Package.Version, r.URoot)
			fmt.Fprintf(w, "discovery image %s (key %s, %d modules, %s)\n", how(r), r.Key[:12], len(r.Modules), r.Compression)
			fmt.Fprintf(w, "  %-21s %9d bytes  sha256 %s\n", images.DiscoverKernel, b.KernelSize, b.KernelSHA256)
			fmt.Fprintf(w, "  %-21s %9d bytes  sha256 %s\n", images.DiscoverInitrd, b.InitrdSize, b.InitrdSHA256)
			if len(rs) > 1 {
				h := rs[1]
				rep.Stage("register the hypervisor image in "+catDir, 0)
				_, hb, err := images.RegisterHypervisor(cfg, h.Initrd, h.Release, h.Key)
				if err != nil {
					return err
				}
				rep.Done()
				fmt.Fprintf(w, "hypervisor image %s (key %s, %d modules, %s, qemu %s)\n", how(h), h.Key[:12], len(h.Modules), h.Compression, h.Packages["qemu-system-x86"])
				fmt.Fprintf(w, "  %-21s %9d bytes  sha256 %s\n", images.HypervisorInitrd, hb.InitrdSize, hb.InitrdSHA256)
			}
			// The commissioning overlay: the test tools do not fit the
			// discovery image's budget; a host without them builds none
			// and commissioning says so when it runs.
			rep.Stage("commissioning overlay (smartctl, memtester, stress-ng, fio, ethtool)", 0)
			if o, err := discovery.BuildCommissionOverlay(cmd.Context(), cache); err != nil {
				rep.Done()
				fmt.Fprintf(w, "commissioning overlay not built: %v\n", err)
			} else if _, cb, err := images.RegisterCommission(cfg, o.Path, o.Key, o.Packages); err != nil {
				return err
			} else {
				rep.Done()
				how := "built in " + o.BuildTime.Round(100*time.Millisecond).String()
				if o.Cached {
					how = "cached"
				}
				fmt.Fprintf(w, "commissioning overlay %s (key %s, %d files; smartmontools %s, memtester %s, stress-ng %s, fio %s, ethtool %s)\n", how, o.Key[:12], o.Files,
					o.Packages["smartmontools"], o.Packages["memtester"], o.Packages["stress-ng"], o.Packages["fio"], o.Packages["ethtool"])
				fmt.Fprintf(w, "  %-21s %9d bytes  sha256 %s\n", images.CommissionOverlay, cb.Size, cb.SHA256)
			}
			fmt.Fprintf(w, "registered in %s (discover profile", catDir)
			if len(rs) > 1 {
				fmt.Fprint(w, " and hypervisor profile")
			}
			fmt.Fprintln(w, ")")
			return nil
		},
	}
	build.Flags().StringVar(&src, "source", "", "Corral source tree (module root) to build corral-node from (default: the module containing the working directory)")
	build.Flags().StringVar(&cache, "image-cache", imagecache.Default(), "build cache directory, shared with corral-lab (machine-wide, or under $XDG_CACHE_HOME when that is not writable) (env CORRAL_IMAGE_CACHE)")
	build.Flags().StringSliceVar(&ipxeDirs, "ipxe-dir", nil, "directories holding the iPXE binaries (default Debian's)")
	build.Flags().BoolVar(&noHyp, "no-hypervisor", false, "build and register only the discovery image")
	build.Flags().StringVar(&arch, "arch", discovery.ArchAMD64, "machines' architecture: amd64, or arm64 (discovery and hypervisor images and GRUB's network loader)")
	img.AddCommand(build, newImagesExportCmd(g), newImagesImportCmd(g))
	return img
}

// buildARM64 builds (or takes from the cache) the arm64 discovery image and
// GRUB network loader and registers them in catDir.
func buildARM64(cmd *cobra.Command, log *slog.Logger, src, cache, catDir string, ipxeDirs []string, noHyp bool) error {
	start := time.Now()
	profiles := []discovery.Profile{discovery.Discover, discovery.Hypervisor}
	if noHyp {
		profiles = profiles[:1]
	}
	rep := progress.New(cmd.ErrOrStderr())
	rs, err := discovery.BuildProfiles(cmd.Context(), discovery.Options{SourceDir: src, CacheDir: cache, AgentVersion: version, Logger: log,
		Arch: discovery.ArchARM64, Progress: func(stage string) { rep.Stage(stage, 0) }}, profiles...)
	if err != nil {
		return err
	}
	rep.Stage("GRUB arm64 network loader (grub-mkimage)", 0)
	loader, err := discovery.BuildGRUBARM64(cmd.Context(), cache)
	if err != nil {
		return err
	}
	r := rs[0]
	rep.Stage("register the arm64 discovery image in "+catDir, 0)
	_, b, err := images.RegisterARM64(images.Config{Dir: catDir, IPXEDirs: ipxeDirs}, r.Kernel, r.Initrd, loader, r.Release, r.Key)
	if err != nil {
		return err
	}
	rep.Done()
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "arm64 images ready in %s (kernel %s %s, u-root %s)\n", time.Since(start).Round(100*time.Millisecond), r.Package.Name, r.Package.Version, r.URoot)
	fmt.Fprintf(w, "arm64 discovery image %s (key %s, %d modules, %s)\n", how(r), r.Key[:12], len(r.Modules), r.Compression)
	fmt.Fprintf(w, "  %-21s %9d bytes  sha256 %s\n", images.ARM64Kernel, b.KernelSize, b.KernelSHA256)
	fmt.Fprintf(w, "  %-21s %9d bytes  sha256 %s\n", images.ARM64Initrd, b.InitrdSize, b.InitrdSHA256)
	fmt.Fprintf(w, "  %-21s %9d bytes  sha256 %s\n", images.GRUBARM64EFI, b.LoaderSize, b.LoaderSHA256)
	if len(rs) > 1 {
		h := rs[1]
		rep.Stage("register the arm64 hypervisor image in "+catDir, 0)
		_, hb, err := images.RegisterARM64Hypervisor(images.Config{Dir: catDir, IPXEDirs: ipxeDirs}, h.Initrd, h.Release, h.Key)
		if err != nil {
			return err
		}
		rep.Done()
		fmt.Fprintf(w, "arm64 hypervisor image %s (key %s, %d modules, %s, qemu %s)\n", how(h), h.Key[:12], len(h.Modules), h.Compression, h.Packages["qemu-system-arm"])
		fmt.Fprintf(w, "  %-21s %9d bytes  sha256 %s\n", images.ARM64HypervisorInitrd, hb.InitrdSize, hb.InitrdSHA256)
	}
	fmt.Fprintf(w, "registered in %s (arm64 profile)\n", catDir)
	return nil
}

func how(r discovery.Result) string {
	if r.Cached {
		return "cached"
	}
	return "built in " + r.BuildTime.Round(100*time.Millisecond).String()
}
