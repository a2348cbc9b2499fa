package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/corralhq/corral/cmd/corrald/server"
	"github.com/corralhq/corral/images"
	"github.com/corralhq/corral/images/discovery"
	"github.com/spf13/cobra"
)

func newImagesCmd() *cobra.Command {
	img := &cobra.Command{Use: "images", Short: "Build and register boot images (offline, against the data dir)"}
	build := &cobra.Command{
		Use:   "build",
		Short: "Build (or reuse from the cache) the discovery kernel and initramfs and register them in the catalog",
		Long: `Builds the discovery image from Debian's linux-image-amd64 (apt-get download,
dpkg-deb -x), a curated module set (depmod -b), u-root's core commands with
corral-node discover as the uinit, and pci.ids; registers vmlinuz and
initrd.img in DATA_DIR/images so that corrald serve boots unknown machines into
them. A build with unchanged inputs is taken from the cache.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(cmd)
			if err != nil {
				return err
			}
			dataDir, _ := cmd.Flags().GetString("data-dir")
			src, _ := cmd.Flags().GetString("source")
			cache, _ := cmd.Flags().GetString("image-cache")
			ipxeDirs, _ := cmd.Flags().GetStringSlice("ipxe-dir")
			if src == "" {
				if src, err = findSource(); err != nil {
					return err
				}
			}
			catDir := filepath.Join(dataDir, server.ImagesDir)
			if cache == "" {
				cache = filepath.Join(catDir, "cache")
			}
			start := time.Now()
			r, err := discovery.Build(cmd.Context(), discovery.Options{SourceDir: src, CacheDir: cache, AgentVersion: version, Logger: log})
			if err != nil {
				return err
			}
			_, b, err := images.RegisterDiscover(images.Config{Dir: catDir, IPXEDirs: ipxeDirs}, r.Kernel, r.Initrd, r.Release, r.Key)
			if err != nil {
				return err
			}
			how := "built"
			if r.Cached {
				how = "cached"
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "discovery image %s in %s (key %s, kernel %s %s, u-root %s, %d modules)\n",
				how, time.Since(start).Round(100*time.Millisecond), r.Key[:12], r.Package.Name, r.Package.Version, r.URoot, len(r.Modules))
			fmt.Fprintf(w, "  %-10s %9d bytes  sha256 %s\n", images.DiscoverKernel, b.KernelSize, b.KernelSHA256)
			fmt.Fprintf(w, "  %-10s %9d bytes  sha256 %s\n", images.DiscoverInitrd, b.InitrdSize, b.InitrdSHA256)
			fmt.Fprintf(w, "registered in %s (discover profile)\n", catDir)
			return nil
		},
	}
	build.Flags().String("source", "", "Corral source tree (module root) to build corral-node from (default: the module containing the working directory)")
	build.Flags().String("image-cache", "", "build cache directory (default DATA_DIR/images/cache) (env CORRAL_IMAGE_CACHE)")
	build.Flags().StringSlice("ipxe-dir", nil, "directories holding the iPXE binaries (default Debian's)")
	img.AddCommand(build)
	return img
}

// findSource walks up from the working directory to the go.mod of the
// Corral module.
func findSource() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if f, err := os.Open(filepath.Join(dir, "go.mod")); err == nil {
			sc := bufio.NewScanner(f)
			mod := ""
			if sc.Scan() {
				mod = strings.TrimSpace(strings.TrimPrefix(sc.Text(), "module"))
			}
			f.Close()
			if mod == "github.com/corralhq/corral" {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the Corral source tree: pass --source")
		}
		dir = parent
	}
}
