package dhcp

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/testsupport/storecheck"

	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/mem"
)

// TestStoreOpsPerDORA: a known machine's DORA (a PXE client's DISCOVER
// and REQUEST, its timeline entries flushed) reads the machine record at
// most once per packet. It prints the store operations per DORA. Before
// the DHCP server took the boot intent from the record EnsureMachineForMAC
// returns (2026-11-28), it re-read the record through BootIntent on both
// packets: 12 operations, 8 of them reads (4 of the machine record).
// Since the lease is written with its MAC's holder record (holder.go,
// 2026-11-29) the REQUEST's transaction also checks the holder's
// revision: one operation more, in the same round trip.
func TestStoreOpsPerDORA(t *testing.T) {
	const (
		before        = "12 operations: 8 reads (4 of the machine record), 4 writes"
		maxOps        = 9 // per DORA, the holder's check included
		maxMachineGet = 2 // one per packet
	)
	ctx, cancel := context.WithCancel(context.Background())
	cs := &storecheck.Counting{Store: mem.New()}
	inv, err := inventory.New(inventory.Config{Store: cs})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { inv.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	c1, _ := net.ListenPacket("udp4", "127.0.0.1:0")
	t.Cleanup(func() { c1.Close() })
	s, err := New(ctx, Config{Mode: ModeFull, ServerIP: serverIP, Ranges: []Range{localRange()}, Catalog: fullCatalog,
		Store: cs, Inventory: inv, Timeline: inv, Conn: c1, PXEConn: c1, LeaseTime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{s: s, st: cs, inv: inv, ctx: ctx}
	hw := mac(0x77)
	f.dora(t, hw, biosPXE) // the machine is created, the MAC's timeline indexed
	if err := inv.FlushTimeline(ctx); err != nil {
		t.Fatal(err)
	}
	ops := cs.Measure(func() {
		f.dora(t, hw, biosPXE)
		if err := inv.FlushTimeline(ctx); err != nil {
			t.Fatal(err)
		}
	})
	reads, machineReads, writes := ops.Reads(""), ops.Reads(store.MachinesPrefix), ops.Writes("")
	t.Logf("store operations per DORA of a known machine: %d: %d reads (%d of the machine record), %d writes (before: %s)",
		reads+writes, reads, machineReads, writes, before)
	if machineReads > maxMachineGet || reads+writes > maxOps {
		t.Errorf("DORA: %d store operations, %d machine-record reads; want at most %d and %d", reads+writes, machineReads, maxOps, maxMachineGet)
	}
	if tl := f.timeline(t, hw); !strings.Contains(tl, "machine:m-525400000077") || !strings.Contains(tl, "intent:discover") {
		t.Errorf("timeline entries lack the machine or its intent:\n%s", tl)
	}
}
