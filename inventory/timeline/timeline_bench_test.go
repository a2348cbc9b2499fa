package timeline

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/corralhq/corral/store/bolt"
)

// BenchmarkTimelineRecord measures entries written per second on the bolt
// store: one MAC booting (trims), and a flood of distinct MACs (one entry
// each: index records and, past the total, evictions).
func BenchmarkTimelineRecord(b *testing.B) {
	for _, bc := range []struct {
		name string
		mac  func(i int) string
	}{
		{"one MAC", func(int) string { return "52:54:00:00:00:01" }},
		{"distinct MACs", func(i int) string {
			return fmt.Sprintf("02:00:%02x:%02x:%02x:%02x", byte(i>>24), byte(i>>16), byte(i>>8), byte(i))
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			st, err := bolt.Open(filepath.Join(b.TempDir(), "corral.db"), bolt.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			tl, err := New(Config{Store: st})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- tl.Run(ctx) }()
			defer func() { cancel(); <-done }()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				tl.Event(bc.mac(i), "dhcp", "discover", "DISCOVER from a PXE client, arch 7", map[string]string{"xid": "0x1234", "arch": "7"})
				if i%4096 == 4095 {
					tl.Flush(ctx)
				}
			}
			tl.Flush(ctx)
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "entries/s")
		})
	}
}
