package images

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// CommissionManifest is the file in a catalog directory that records the
// commissioning overlay `corrald images build` registered there.
const CommissionManifest = "commission.json"

// commissionDir holds the registered overlay inside the catalog
// directory.
const commissionDir = "commission"

// BuiltCommission describes the registered commissioning overlay: the
// test tools' Debian package versions with it.
type BuiltCommission struct {
	Overlay    string            `json:"overlay"` // path inside the catalog directory
	Size       int64             `json:"size"`
	SHA256     string            `json:"sha256"`
	Packages   map[string]string `json:"debian_packages"`
	Key        string            `json:"cache_key,omitempty"`
	Registered time.Time         `json:"registered"`
}

// RegisterCommission copies overlay into cfg.Dir's commission store,
// opens the catalog with it (size and SHA-256 in SHA256SUMS) and records
// it in CommissionManifest, which WithBuiltDiscover reads. The overlay
// holds no kernel modules, so any registered kernel boots it.
func RegisterCommission(cfg Config, overlay, key string, packages map[string]string) (*Catalog, BuiltCommission, error) {
	if cfg.Dir == "" {
		return nil, BuiltCommission{}, fmt.Errorf("images: Config.Dir is required")
	}
	store := filepath.Join(cfg.Dir, commissionDir)
	if err := os.MkdirAll(store, 0o755); err != nil {
		return nil, BuiltCommission{}, fmt.Errorf("images: %w", err)
	}
	dst := filepath.Join(store, CommissionOverlay)
	f, err := os.Open(overlay)
	if err != nil {
		return nil, BuiltCommission{}, fmt.Errorf("images: %w", err)
	}
	err = writeAtomic(dst, func(w io.Writer) error { _, err := io.Copy(w, f); return err })
	f.Close()
	if err != nil {
		return nil, BuiltCommission{}, err
	}
	cfg.CommissionOverlay = dst
	cat, err := Open(cfg.WithBuiltDiscover())
	if err != nil {
		return nil, BuiltCommission{}, err
	}
	a, _ := cat.Lookup(CommissionOverlay)
	b := BuiltCommission{Overlay: filepath.Join(commissionDir, CommissionOverlay), Size: a.Size, SHA256: a.SHA256,
		Packages: packages, Key: key, Registered: time.Now().UTC()}
	if err := writeManifest(filepath.Join(cfg.Dir, CommissionManifest), b); err != nil {
		return nil, BuiltCommission{}, err
	}
	return cat, b, nil
}

// ReadBuiltCommission reads dir's CommissionManifest; ok is false when
// there is none or its overlay is gone.
func ReadBuiltCommission(dir string) (BuiltCommission, bool) {
	js, err := os.ReadFile(filepath.Join(dir, CommissionManifest))
	if err != nil {
		return BuiltCommission{}, false
	}
	var b BuiltCommission
	if json.Unmarshal(js, &b) != nil || b.Overlay == "" {
		return BuiltCommission{}, false
	}
	if st, err := os.Stat(filepath.Join(dir, b.Overlay)); err != nil || !st.Mode().IsRegular() {
		return BuiltCommission{}, false
	}
	return b, true
}
