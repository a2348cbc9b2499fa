package erase

import (
	"context"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
)

// writesOnly is the kernel with neither discard nor zeroout: full writes
// zeros.
type writesOnly struct{ kernel }

func (w writesOnly) disk(p string) (disk, error) {
	d, err := w.kernel.disk(p)
	d.discard = false
	return d, err
}

func (w writesOnly) open(d disk) (device, error) {
	dev, err := w.kernel.open(d)
	if err != nil {
		return nil, err
	}
	return noZeroout{dev.(*fileDevice)}, nil
}

// BenchmarkLoopErase erases a 512 MiB loop device (backed by a file on
// the test's temporary directory) at each level and path and reports the
// rate (MB/s of the device's size): quick, full by discard, full by
// BLKZEROOUT, full by written zeros. Rates depend on the backing
// filesystem and the machine's load: printed, never asserted.
//
//	go test -run '^$' -bench LoopErase -benchtime 1x ./agent/erase
func BenchmarkLoopErase(b *testing.B) {
	const size = 512 * mib
	for _, bc := range []struct {
		name  string
		level inventoryv1.EraseLevel
		sys   system
	}{
		{"quick", inventoryv1.EraseLevel_ERASE_LEVEL_QUICK, nil},
		{"full-discard", inventoryv1.EraseLevel_ERASE_LEVEL_FULL, nil},
		{"full-zeroout", inventoryv1.EraseLevel_ERASE_LEVEL_FULL, noDiscard{kernel{root: "/"}}},
		{"full-write", inventoryv1.EraseLevel_ERASE_LEVEL_FULL, writesOnly{kernel{root: "/"}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			image := newImage(b, size)
			dev := loopDisk(b, image)
			e := New(Config{sys: bc.sys})
			b.SetBytes(size)
			b.ResetTimer()
			for range b.N {
				err := e.Erase(context.Background(), &nodev1.ErasePlan{Level: bc.level, Disks: []string{dev}}, func(*nodev1.Progress) {})
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
