package diskwrite

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/images/blockmap"
)

// BenchmarkMostlyEmpty2GiB writes a 2 GiB raw image holding 100 MiB of
// data to a loop device, from its block map over HTTP (Write), against dd
// of the full raw image to the same device (bs=4M, conv=fsync). It prints
// wall time and MB/s of the virtual size; it asserts nothing. Root.
//
//	go test -run '^$' -bench MostlyEmpty -benchtime 1x ./agent/diskwrite/
func BenchmarkMostlyEmpty2GiB(b *testing.B) {
	const size = 2 << 30
	dir := b.TempDir()
	path, _ := sparseRaw(b, dir, size, map[int64]int{0: 64 * mib, 1 << 30: 32 * mib, size - 4*mib: 4 * mib})
	img := serve(b, path, blockmap.Raw, nil)
	dev := loopDeviceSparse(b, size)
	report := func(name string, d time.Duration) {
		b.ReportMetric(d.Seconds(), name+"_s")
		b.ReportMetric(float64(size)/1e6/d.Seconds(), name+"_MB/s")
		fmt.Printf("%s: %d MiB virtual, %d MiB data: %v, %.0f MB/s\n", name, size>>20, img.m.DataBytes()>>20, d.Round(time.Millisecond), float64(size)/1e6/d.Seconds())
	}
	for b.Loop() {
		start := time.Now()
		cfg := Config{Device: dev, Map: img.m, Fetch: HTTPFetch(http.DefaultClient, img.url)}
		if err := Write(context.Background(), cfg); err != nil {
			b.Fatal(err)
		}
		report("diskwrite", time.Since(start))
		start = time.Now()
		if out, err := exec.Command("dd", "if="+path, "of="+dev, "bs=4M", "conv=fsync").CombinedOutput(); err != nil {
			b.Fatalf("dd: %v: %s", err, out)
		}
		report("dd", time.Since(start))
	}
}

// loopDeviceSparse attaches a loop device over a sparse file of size.
func loopDeviceSparse(b *testing.B, size int64) string {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Skip("needs root (loop devices)")
	}
	backing := filepath.Join(b.TempDir(), "disk")
	if err := os.WriteFile(backing, nil, 0o600); err != nil {
		b.Fatal(err)
	}
	if err := os.Truncate(backing, size); err != nil {
		b.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", backing).CombinedOutput()
	if err != nil {
		b.Skipf("losetup: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	b.Cleanup(func() { exec.Command("losetup", "-d", dev).Run() })
	return dev
}
