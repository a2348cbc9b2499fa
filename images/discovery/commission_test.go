package discovery

import (
	"compress/gzip"
	"context"
	"os"
	"testing"

	"github.com/u-root/u-root/pkg/cpio"

	"github.com/corralhq/corral/testsupport/require"
)

// TestCommissionOverlay builds the commissioning overlay from this host's
// tools: every tool and its libraries are in it, every parent directory
// comes before what it holds, the package versions are recorded, and a
// second build is the cached one.
func TestCommissionOverlay(t *testing.T) {
	require.Tool(t, "smartctl", "memtester", "stress-ng", "fio", "ethtool", "dpkg-query")
	cache := t.TempDir()
	o, err := BuildCommissionOverlay(context.Background(), cache)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("overlay: %d bytes gzip'd, %d files, built in %s, packages %v", o.Size, o.Files, o.BuildTime, o.Packages)
	for _, p := range CommissionPackages {
		if o.Packages[p] == "" {
			t.Errorf("no version of %s in %v", p, o.Packages)
		}
	}
	f, err := os.Open(o.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.CreateTemp(t.TempDir(), "cpio")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.ReadFrom(zr); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	err = cpio.ForEachRecord(cpio.Newc.Reader(raw), func(r cpio.Record) error {
		if r.Name == "TRAILER!!!" {
			return nil
		}
		if d := parentOf(r.Name); d != "" && !names[d] {
			t.Errorf("%s comes before its directory %s", r.Name, d)
		}
		names[r.Name] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"usr/sbin/smartctl", "usr/sbin/memtester", "usr/bin/stress-ng", "usr/bin/fio", "usr/sbin/ethtool"} {
		if !names[p] {
			t.Errorf("%s not in the overlay", p)
		}
	}
	again, err := BuildCommissionOverlay(context.Background(), cache)
	if err != nil || !again.Cached || again.SHA256 != o.SHA256 {
		t.Fatalf("second build: cached %v sha %s, err %v", again.Cached, again.SHA256, err)
	}
}

func parentOf(name string) string {
	for i := len(name) - 1; i > 0; i-- {
		if name[i] == '/' {
			return name[:i]
		}
	}
	return ""
}
