package inventory

import (
	"context"
	"path/filepath"
	"runtime"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/bolt"
	"github.com/corralhq/corral/store/mem"
)

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkMachineMemory stores 2,000 machines with realistic facts and
// a fact history, and reports the heap each one keeps (with store/bolt,
// what corrald runs: the records are in the file, not the heap; with
// store/mem, the records themselves) and what one scan allocates per
// machine (a reconcile pass over summaries). It prints; it asserts
// nothing:
//
//	go test -run '^$' -bench MachineMemory -benchtime 1x ./inventory
func BenchmarkMachineMemory(b *testing.B) {
	const n = 2000
	for name, open := range map[string]func(b *testing.B) store.Store{
		"bolt": func(b *testing.B) store.Store {
			s, err := bolt.Open(filepath.Join(b.TempDir(), "corral.db"), bolt.Options{})
			if err != nil {
				b.Fatal(err)
			}
			return s
		},
		"mem": func(*testing.B) store.Store { return mem.New() },
	} {
		b.Run(name, func(b *testing.B) {
			for range b.N {
				st := open(b)
				inv := newInv(b, Config{Store: st, MaxDiscovered: -1})
				before := heapInUse()
				addMachines(b, inv, 0, n)
				after := heapInUse()
				b.ReportMetric(float64(int64(after)-int64(before))/n, "heap-B/machine")
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				alloc := ms.TotalAlloc
				seen := 0
				if err := inv.EachMachine(context.Background(), &inventoryv1.ListMachinesRequest{View: inventoryv1.MachineView_MACHINE_VIEW_SUMMARY}, func(*inventoryv1.Machine) error {
					seen++
					return nil
				}); err != nil || seen != n {
					b.Fatalf("scan: %d machines, %v", seen, err)
				}
				runtime.ReadMemStats(&ms)
				b.ReportMetric(float64(ms.TotalAlloc-alloc)/n, "scan-alloc-B/machine")
				runtime.KeepAlive(inv)
				st.Close()
			}
		})
	}
}
