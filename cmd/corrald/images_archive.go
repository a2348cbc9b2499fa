package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/corralhq/corral/appliance"
	"github.com/corralhq/corral/images"
	"github.com/corralhq/corral/internal/progress"
	"github.com/spf13/cobra"
)

// newImagesExportCmd is `corrald images export`: the registered images as
// one archive (make release ships it in the .deb).
func newImagesExportCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "export -o FILE",
		Short: "Write the registered discovery and hypervisor images and the iPXE binaries to an images archive",
		Long: `Writes the images registered in DATA_DIR/images (by corrald images build or
import) to FILE: an uncompressed tar holding vmlinuz, initrd.img,
hypervisor-initrd.img (when registered), the iPXE binaries, MANIFEST.json
(names, kinds, sizes, SHA-256, kernel release) and SHA256SUMS over all of
them. corrald images import FILE registers them on another appliance.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dataDir, _ := cmd.Flags().GetString("data-dir")
			out, _ := cmd.Flags().GetString("output")
			ipxeDirs, _ := cmd.Flags().GetStringSlice("ipxe-dir")
			if out == "" {
				return fmt.Errorf("--output (-o) is required: the archive file to write")
			}
			tmp, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".*")
			if err != nil {
				return err
			}
			defer os.Remove(tmp.Name())
			h := sha256.New()
			rep := progress.New(cmd.ErrOrStderr())
			man, err := images.Export(io.MultiWriter(tmp, h), images.Config{Dir: filepath.Join(dataDir, appliance.ImagesDir), IPXEDirs: ipxeDirs}, version, rep)
			if err == nil {
				err = tmp.Chmod(0o644)
			}
			if cerr := tmp.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			if err := os.Rename(tmp.Name(), out); err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "%s: kernel %s, %d files, sha256 %s\n", out, man.KernelRelease, len(man.Files), hex.EncodeToString(h.Sum(nil)))
			for _, f := range man.Files {
				fmt.Fprintf(w, "  %-21s %-6s %10d bytes  sha256 %s\n", f.Name, f.Kind, f.Size, f.SHA256)
			}
			return nil
		},
	}
	c.Flags().StringP("output", "o", "", "archive file to write")
	c.Flags().StringSlice("ipxe-dir", nil, "directories holding the iPXE binaries to ship (default: those the catalog imported, then Debian's)")
	return c
}

// newImagesImportCmd is `corrald images import FILE`.
func newImagesImportCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "import FILE",
		Short: "Register the prebuilt images of an images archive (no Go, no Debian mirror needed)",
		Long: `Reads an images archive (corrald images export; the .deb ships one as
/usr/share/corral/images/corral-images.tar), checks every file against the
archive's SHA256SUMS and MANIFEST.json and, only when all of them match,
registers the discovery and hypervisor images in DATA_DIR/images exactly as
corrald images build does, with the archive's iPXE binaries. A damaged or
altered archive is refused, naming the file, and the catalog is left as it
was. --sha256 also checks the archive itself against the digest the release
published (dist/SHA256SUMS). Restart corrald serve afterwards to boot from
the new images.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dataDir, _ := cmd.Flags().GetString("data-dir")
			want, _ := cmd.Flags().GetString("sha256")
			want = strings.ToLower(strings.TrimSpace(want))
			if want != "" {
				if err := images.CheckSHA256(want); err != nil {
					return fmt.Errorf("--sha256: %w", err)
				}
			}
			path := args[0]
			rep := progress.New(cmd.ErrOrStderr())
			open := func(stage string) (*os.File, io.Reader, error) {
				f, err := os.Open(path)
				if err != nil {
					return nil, nil, err
				}
				st, err := f.Stat()
				if err != nil {
					f.Close()
					return nil, nil, err
				}
				if !st.Mode().IsRegular() {
					f.Close()
					return nil, nil, fmt.Errorf("%s is not a regular file", path)
				}
				rep.Stage(stage, st.Size())
				return f, rep.Reader(f), nil
			}
			if want != "" {
				f, r, err := open("check the archive's sha256")
				if err != nil {
					return err
				}
				h := sha256.New()
				_, err = io.Copy(h, r)
				f.Close()
				if err != nil {
					return err
				}
				rep.Done()
				if got := hex.EncodeToString(h.Sum(nil)); got != want {
					return fmt.Errorf("%w: %s has sha256 %s, --sha256 says %s: nothing was registered", images.ErrMismatch, path, got, want)
				}
			}
			if err := os.MkdirAll(dataDir, 0o700); err != nil {
				return err
			}
			f, r, err := open("read and stage " + filepath.Base(path))
			if err != nil {
				return err
			}
			defer f.Close()
			abs, _ := filepath.Abs(path)
			got, err := images.Import(r, images.Config{Dir: filepath.Join(dataDir, appliance.ImagesDir)}, abs, stageDone{rep, new(bool)})
			if err != nil {
				return fmt.Errorf("import %s: %w", path, err)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "imported %s (corral %s, kernel %s)\n", path, orDash(got.Manifest.Version), got.Manifest.KernelRelease)
			fmt.Fprintf(w, "  %-21s %10d bytes  sha256 %s\n", images.DiscoverKernel, got.Discover.KernelSize, got.Discover.KernelSHA256)
			fmt.Fprintf(w, "  %-21s %10d bytes  sha256 %s\n", images.DiscoverInitrd, got.Discover.InitrdSize, got.Discover.InitrdSHA256)
			if h := got.Hypervisor; h != nil {
				fmt.Fprintf(w, "  %-21s %10d bytes  sha256 %s\n", images.HypervisorInitrd, h.InitrdSize, h.InitrdSHA256)
			}
			fmt.Fprintf(w, "  iPXE: %s\n", strings.Join(got.IPXE, ", "))
			fmt.Fprintf(w, "registered in %s: restart corrald serve to boot from them\n", filepath.Join(dataDir, appliance.ImagesDir))
			return nil
		},
	}
	c.Flags().String("sha256", "", "the archive's own SHA-256 (from the release's SHA256SUMS): refuse the archive unless it matches")
	return c
}

// stageDone ends the reading stage the command started when Import's
// first own stage begins.
type stageDone struct {
	*progress.Reporter
	ended *bool
}

func (s stageDone) Stage(name string, total int64) {
	if !*s.ended {
		*s.ended = true
		s.Reporter.Done()
	}
	s.Reporter.Stage(name, total)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
