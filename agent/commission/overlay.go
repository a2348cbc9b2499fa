package commission

import (
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/u-root/u-root/pkg/cpio"

	nodev1 "github.com/corralhq/corral/api/node/v1"
)

// MaxOverlaySize bounds the overlay an agent fetches.
const MaxOverlaySize = 256 << 20

// ensureTools fetches and unpacks the plan's overlay when a tool one of
// its steps needs is not on PATH (a machine booted with the overlay as a
// second initrd has them already).
func (r *Runner) ensureTools(ctx context.Context, plan *nodev1.CommissionPlan) error {
	var missing []string
	for _, s := range plan.GetSteps() {
		if t, ok := Tools[s.GetKind()]; ok {
			if _, err := lookTool(t); err != nil {
				missing = append(missing, t)
			}
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if plan.GetOverlayUrl() == "" {
		return fmt.Errorf("%v not on this machine and the plan names no overlay", missing)
	}
	start := time.Now()
	fmt.Fprintf(r.cfg.Console, "corral: commissioning tools %v missing: fetching the overlay %s\n", missing, plan.GetOverlayUrl())
	if err := r.unpackOverlay(ctx, plan.GetOverlayUrl(), plan.GetOverlaySha256(), plan.GetOverlaySize()); err != nil {
		return err
	}
	r.cfg.Logger.Info("commissioning overlay unpacked", "bytes", plan.GetOverlaySize(), "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// unpackOverlay fetches url into memory-backed temporary storage,
// refuses it unless it is exactly size bytes with SHA-256 sum (the hash
// came over the session's TLS, the bytes over the boot LAN), and unpacks
// the gzip'd newc cpio archive into Root.
func (r *Runner) unpackOverlay(ctx context.Context, url, sum string, size int64) error {
	if size <= 0 || size > MaxOverlaySize || len(sum) != 64 {
		return fmt.Errorf("overlay: the plan's size %d or SHA-256 %q is unusable", size, sum)
	}
	body, err := r.cfg.Fetch(ctx, url)
	if err != nil {
		return fmt.Errorf("overlay: %w", err)
	}
	defer body.Close()
	tmp, err := os.CreateTemp("", "commission-overlay-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(body, size+1))
	if err != nil {
		return fmt.Errorf("overlay: fetch: %w", err)
	}
	if n != size {
		return fmt.Errorf("overlay: %d bytes, want %d", n, size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sum {
		return fmt.Errorf("overlay: SHA-256 %s, want %s", got, sum)
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return err
	}
	zr, err := gzip.NewReader(tmp)
	if err != nil {
		return fmt.Errorf("overlay: %w", err)
	}
	raw, err := os.CreateTemp("", "commission-overlay-cpio-")
	if err != nil {
		return err
	}
	defer os.Remove(raw.Name())
	defer raw.Close()
	if _, err := io.Copy(raw, zr); err != nil {
		return fmt.Errorf("overlay: gunzip: %w", err)
	}
	return cpio.ForEachRecord(cpio.Newc.Reader(raw), func(rec cpio.Record) error {
		if rec.Name == "TRAILER!!!" || rec.Name == "." {
			return nil
		}
		// A file the image already has (a shared library the discovery
		// image carries for mke2fs) is the same Debian file: kept, not
		// rewritten under whatever may be using it.
		if st, err := os.Lstat(filepath.Join(r.cfg.Root, filepath.Clean("/"+rec.Name))); err == nil && !st.IsDir() {
			return nil
		}
		if err := cpio.CreateFileInRoot(rec, r.cfg.Root, false); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("overlay: %s: %w", filepath.Clean(rec.Name), err)
		}
		return nil
	})
}

// httpGet is the default Fetch.
func httpGet(ctx context.Context, url string) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return resp.Body, nil
}
