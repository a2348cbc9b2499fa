package discovery

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/u-root/mkuimage/ldd"
	"github.com/u-root/u-root/pkg/cpio"
)

// CommissionHostFiles are the commissioning tools (agent/commission) the
// commissioning overlay carries at their Debian paths, with the shared
// libraries ldd resolves for them. They do not fit the discovery image's
// budget (MaxInitrdSize): the overlay is a second initramfs, gzip'd newc
// cpio, that the kernel unpacks over the discovery image's (Linux takes
// concatenated initrds: the iPXE script's second initrd line) or the
// agent unpacks itself when a plan reaches it booted without it.
var CommissionHostFiles = []string{"/usr/sbin/smartctl", "/usr/sbin/memtester", "/usr/bin/stress-ng", "/usr/bin/fio", "/usr/sbin/ethtool"}

// CommissionPackages are the Debian packages of CommissionHostFiles,
// recorded in the overlay's manifest.
var CommissionPackages = []string{"smartmontools", "memtester", "stress-ng", "fio", "ethtool"}

// CommissionFormat changes whenever the overlay's recipe does.
const CommissionFormat = "corral-commission-1"

// Overlay describes a built (or cached) commissioning overlay.
type Overlay struct {
	Key       string            `json:"key"`
	Path      string            `json:"path"`
	Size      int64             `json:"size"`
	SHA256    string            `json:"sha256"`
	Files     int               `json:"files"`
	Packages  map[string]string `json:"debian_packages"`
	BuildTime time.Duration     `json:"build_time"`
	Cached    bool              `json:"-"`
}

// BuildCommissionOverlay returns the commissioning overlay from
// cacheDir/commission/<key>/, building it when the cache lacks it. The
// key hashes the tools, their libraries and their package versions.
func BuildCommissionOverlay(ctx context.Context, cacheDir string) (Overlay, error) {
	start := time.Now()
	files, err := resolveHostFiles(ctx, CommissionHostFiles, nil)
	if err != nil {
		return Overlay{}, fmt.Errorf("commissioning overlay: %w", err)
	}
	hash, err := hostFilesHash(files)
	if err != nil {
		return Overlay{}, err
	}
	pkgs, err := packageVersions(ctx, CommissionPackages)
	if err != nil {
		return Overlay{}, err
	}
	in, _ := json.Marshal(struct {
		Format, HostFiles string
		Packages          map[string]string
	}{CommissionFormat, hash, pkgs})
	key := Inputs{Format: string(in)}.Key()
	dir := filepath.Join(cacheDir, "commission", key)
	if b, err := os.ReadFile(filepath.Join(dir, "manifest.json")); err == nil {
		var o Overlay
		if json.Unmarshal(b, &o) == nil {
			if sum, size, err := checksum(o.Path); err == nil && sum == o.SHA256 && size == o.Size {
				o.Cached = true
				return o, nil
			}
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Overlay{}, err
	}
	out := filepath.Join(dir, "commission-overlay.img")
	n, err := writeOverlay(files, out)
	if err != nil {
		return Overlay{}, err
	}
	o := Overlay{Key: key, Path: out, Files: n, Packages: pkgs}
	if o.SHA256, o.Size, err = checksum(out); err != nil {
		return Overlay{}, err
	}
	o.BuildTime = time.Since(start)
	b, _ := json.MarshalIndent(o, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "manifest.json"), b, 0o644); err != nil {
		return Overlay{}, err
	}
	pruneBuilds(filepath.Dir(dir), key, keepBuilds, slog.New(slog.DiscardHandler))
	return o, nil
}

// writeOverlay writes files and their libraries to out as a gzip'd newc
// cpio archive: every parent directory as a directory record first (the
// kernel's unpacker makes no parents), symlinks as symlinks. It returns
// how many files and links it holds.
func writeOverlay(files []hostFile, out string) (int, error) {
	type ent struct{ dst, src string }
	var all []ent
	seen := map[string]bool{}
	add := func(dst, src string) {
		if !seen[dst] {
			seen[dst] = true
			all = append(all, ent{dst, src})
		}
	}
	for _, f := range files {
		add(f.Dst, f.Src)
		libs, err := ldd.FList(f.Src)
		if err != nil {
			return 0, fmt.Errorf("ldd %s: %w", f.Src, err)
		}
		for _, l := range libs {
			add(strings.TrimPrefix(l, "/"), l)
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].dst < all[j].dst })
	tmp := out + ".tmp"
	fh, err := os.Create(tmp)
	if err != nil {
		return 0, err
	}
	defer os.Remove(tmp)
	zw, _ := gzip.NewWriterLevel(fh, gzip.DefaultCompression)
	w := cpio.Newc.Writer(zw)
	dirs := map[string]bool{}
	rec := cpio.NewRecorder()
	for _, e := range all {
		var parents []string
		for d := path.Dir(e.dst); d != "." && d != "/" && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
			parents = append(parents, d)
		}
		for i := len(parents) - 1; i >= 0; i-- {
			if err := w.WriteRecord(cpio.Directory(parents[i], 0o755)); err != nil {
				return 0, err
			}
		}
		r, err := rec.GetRecord(e.src)
		if err != nil {
			return 0, err
		}
		r.Name = e.dst
		r.UID, r.GID = 0, 0
		if err := w.WriteRecord(r); err != nil {
			return 0, err
		}
		if c, ok := r.ReaderAt.(io.Closer); ok {
			c.Close()
		}
	}
	if err := cpio.WriteTrailer(w); err != nil {
		return 0, err
	}
	if err := zw.Close(); err != nil {
		return 0, err
	}
	if err := fh.Close(); err != nil {
		return 0, err
	}
	return len(all), os.Rename(tmp, out)
}
