package inventory

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/testsupport/fakeclock"
	"github.com/corralhq/corral/testsupport/syncbuf"
)

func phMAC(i int) string { return fmt.Sprintf("52:54:00:77:%02x:%02x", i>>8, i&0xff) }

func TestDiscoveredCap(t *testing.T) {
	var logs syncbuf.Buffer
	inv := newInv(t, Config{MaxDiscovered: 3, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx := context.Background()
	for i := range 3 {
		if _, created, err := inv.EnsureMachineForMAC(ctx, phMAC(i)); err != nil || !created {
			t.Fatalf("machine %d under the cap: created %v, %v", i, created, err)
		}
	}
	for i := 3; i < 10; i++ {
		_, _, err := inv.EnsureMachineForMAC(ctx, phMAC(i))
		if !errors.Is(err, ErrDiscoveredCap) || !errors.Is(err, apierr.ErrExhausted) || !strings.Contains(err.Error(), phMAC(i)) {
			t.Fatalf("machine %d over the cap: %v", i, err)
		}
	}
	if _, err := inv.MachineByMAC(ctx, phMAC(3)); !errors.Is(err, apierr.ErrNotFound) {
		t.Errorf("a machine was recorded over the cap: %v", err)
	}
	if m, created, err := inv.EnsureMachineForMAC(ctx, phMAC(1)); err != nil || created || m.GetBootMac() != phMAC(1) {
		t.Errorf("known MAC at the cap: %v created %v, %v", m, created, err)
	}
	if n := strings.Count(logs.String(), "discovered-machine cap reached"); n != 1 {
		t.Errorf("%d cap log lines for 7 refusals, want 1:\n%s", n, logs.String())
	}

	// A placeholder that is labelled, or deleted, frees its slot.
	if _, err := inv.UpdateMachine(ctx, MachineNameForMAC(phMAC(0)), func(m *inventoryv1.Machine) error {
		m.Labels = map[string]string{"rack": "r1"}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, created, err := inv.EnsureMachineForMAC(ctx, phMAC(3)); err != nil || !created {
		t.Fatalf("after a label: %v", err)
	}
	if err := inv.DeleteMachine(ctx, MachineNameForMAC(phMAC(1))); err != nil {
		t.Fatal(err)
	}
	if _, created, err := inv.EnsureMachineForMAC(ctx, phMAC(4)); err != nil || !created {
		t.Fatalf("after a delete: %v", err)
	}
	if _, _, err := inv.EnsureMachineForMAC(ctx, phMAC(5)); !errors.Is(err, ErrDiscoveredCap) {
		t.Fatalf("full again: %v", err)
	}
	if n := inv.DiscoveredCount(); n != 3 {
		t.Errorf("DiscoveredCount = %d, want 3", n)
	}
}

// TestDiscoveredCapConcurrent: concurrent creations never go past the cap.
func TestDiscoveredCapConcurrent(t *testing.T) {
	st := mem.New()
	inv := newInv(t, Config{Store: st, MaxDiscovered: 10})
	ctx := context.Background()
	var wg sync.WaitGroup
	var mu sync.Mutex
	created, refused := 0, 0
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, c, err := inv.EnsureMachineForMAC(ctx, phMAC(i))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case c:
				created++
			case errors.Is(err, ErrDiscoveredCap):
				refused++
			default:
				t.Errorf("machine %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	kvs, err := st.List(ctx, machinePrefix)
	if err != nil {
		t.Fatal(err)
	}
	if created != 10 || refused != 54 || len(kvs) != 10 {
		t.Fatalf("created %d refused %d stored %d, want 10/54/10", created, refused, len(kvs))
	}
}

// TestDiscoveredCountFromScan: a new Inventory on a store that already
// holds machines counts only the placeholders, once.
func TestDiscoveredCountFromScan(t *testing.T) {
	st := mem.New()
	ctx := context.Background()
	first := newInv(t, Config{Store: st, MaxDiscovered: -1})
	for i := range 4 {
		if _, _, err := first.EnsureMachineForMAC(ctx, phMAC(i)); err != nil {
			t.Fatal(err)
		}
	}
	for name, m := range map[string]*inventoryv1.Machine{
		"enrolled":    {Name: "enrolled", Bmc: &inventoryv1.Bmc{Address: "10.1.1.1"}},
		"inventoried": {Name: "inventoried", State: inventoryv1.Machine_INVENTORIED},
		"labelled":    {Name: "labelled", Labels: map[string]string{"a": "b"}},
		"serial":      {Name: "serial", Serial: "SN1"},
	} {
		if _, err := first.CreateMachine(ctx, m); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	second := newInv(t, Config{Store: st, MaxDiscovered: 5})
	if n := second.DiscoveredCount(); n != -1 {
		t.Errorf("counted before first use: %d", n)
	}
	if _, created, err := second.EnsureMachineForMAC(ctx, phMAC(4)); err != nil || !created {
		t.Fatalf("fifth placeholder: %v", err)
	}
	if _, _, err := second.EnsureMachineForMAC(ctx, phMAC(5)); !errors.Is(err, ErrDiscoveredCap) {
		t.Fatalf("sixth placeholder: %v", err)
	}
	if n := second.DiscoveredCount(); n != 5 {
		t.Errorf("DiscoveredCount = %d, want 5", n)
	}
}

func TestCollectPlaceholders(t *testing.T) {
	const age = 24 * time.Hour
	start := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	for name, tc := range map[string]struct {
		// change alters the placeholder after it is made (nil: untouched).
		change func(m *inventoryv1.Machine)
		// bootAgo is when its MAC last had a timeline entry (0: never
		// after creation).
		bootAgo time.Duration
		// createdAgo is how long ago it was made.
		createdAgo time.Duration
		want       PlaceholderSweep // Machines is always 1
	}{
		"stale placeholder": {createdAgo: 25 * time.Hour,
			want: PlaceholderSweep{Machines: 1, Placeholders: 1, Deleted: 1}},
		"young placeholder": {createdAgo: 23 * time.Hour,
			want: PlaceholderSweep{Machines: 1, Placeholders: 1}},
		"old placeholder that booted recently": {createdAgo: 48 * time.Hour, bootAgo: time.Hour,
			want: PlaceholderSweep{Machines: 1, Placeholders: 1, Active: 1}},
		"old placeholder whose last boot is old": {createdAgo: 72 * time.Hour, bootAgo: 30 * time.Hour,
			want: PlaceholderSweep{Machines: 1, Placeholders: 1, Deleted: 1}},
		"labelled": {createdAgo: 48 * time.Hour, change: func(m *inventoryv1.Machine) { m.Labels = map[string]string{"keep": "1"} },
			want: PlaceholderSweep{Machines: 1}},
		"with a BMC": {createdAgo: 48 * time.Hour, change: func(m *inventoryv1.Machine) { m.Bmc = &inventoryv1.Bmc{Address: "10.1.1.1"} },
			want: PlaceholderSweep{Machines: 1}},
		"inventoried": {createdAgo: 48 * time.Hour, change: func(m *inventoryv1.Machine) { m.State = inventoryv1.Machine_INVENTORIED },
			want: PlaceholderSweep{Machines: 1}},
		"maintenance": {createdAgo: 48 * time.Hour, change: func(m *inventoryv1.Machine) { m.State = inventoryv1.Machine_MAINTENANCE },
			want: PlaceholderSweep{Machines: 1}},
		"annotated": {createdAgo: 48 * time.Hour, change: func(m *inventoryv1.Machine) { m.Annotations = map[string]string{"note": "x"} },
			want: PlaceholderSweep{Machines: 1, Placeholders: 1}},
		"boot intent set by an operator": {createdAgo: 48 * time.Hour, change: func(m *inventoryv1.Machine) { m.BootIntent = inventoryv1.BootIntent_BOOT_INTENT_LOCAL },
			want: PlaceholderSweep{Machines: 1, Placeholders: 1}},
	} {
		t.Run(name, func(t *testing.T) {
			clk := fakeclock.New(start)
			var logs syncbuf.Buffer
			st := mem.New()
			inv := newInv(t, Config{Store: st, Now: clk.Now, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			ctx := context.Background()
			mac := phMAC(1)
			m, _, err := inv.EnsureMachineForMAC(ctx, mac)
			if err != nil {
				t.Fatal(err)
			}
			inv.Event(mac, "dhcp", "discover", "DISCOVER", nil)
			if tc.change != nil {
				if _, err := inv.UpdateMachine(ctx, m.GetName(), func(m *inventoryv1.Machine) error { tc.change(m); return nil }); err != nil {
					t.Fatal(err)
				}
			}
			clk.Advance(tc.createdAgo - tc.bootAgo)
			if tc.bootAgo > 0 {
				inv.Event(mac, "dhcp", "discover", "DISCOVER again", nil)
			}
			clk.Advance(tc.bootAgo)
			if err := inv.FlushTimeline(ctx); err != nil {
				t.Fatal(err)
			}
			// Another MAC's timeline must survive whatever happens.
			inv.Event(phMAC(2), "dhcp", "discover", "someone else", nil)
			if err := inv.FlushTimeline(ctx); err != nil {
				t.Fatal(err)
			}
			got, err := inv.CollectPlaceholders(ctx, age)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Fatalf("sweep (-want +got):\n%s", diff)
			}
			_, byMAC := inv.MachineByMAC(ctx, mac)
			_, binding := st.Get(ctx, macPrefix+mac)
			tl, _ := inv.Timeline(ctx, "", mac, 0)
			other, _ := inv.Timeline(ctx, "", phMAC(2), 0)
			if len(other) != 1 {
				t.Errorf("another MAC's timeline: %d entries", len(other))
			}
			if tc.want.Deleted == 0 {
				if byMAC != nil || binding != nil || len(tl) == 0 {
					t.Fatalf("kept machine damaged: %v, binding %v, %d timeline entries", byMAC, binding, len(tl))
				}
				return
			}
			if !errors.Is(byMAC, apierr.ErrNotFound) || !errors.Is(binding, store.ErrNotFound) || len(tl) != 0 {
				t.Fatalf("after the sweep: machine %v, binding %v, %d timeline entries", byMAC, binding, len(tl))
			}
			if !strings.Contains(logs.String(), "stale discovered machine deleted") || !strings.Contains(logs.String(), "machine="+m.GetName()) {
				t.Errorf("deletion not logged:\n%s", logs.String())
			}
			if n := inv.DiscoveredCount(); n != 0 {
				t.Errorf("DiscoveredCount after the sweep = %d", n)
			}
			// The MAC boots again: a fresh placeholder.
			if _, created, err := inv.EnsureMachineForMAC(ctx, mac); err != nil || !created {
				t.Fatalf("after collection: created %v, %v", created, err)
			}
		})
	}
}

// TestCollectPlaceholdersRepairsCount: a name counted as a placeholder
// whose record is not one (writes classified out of order) is dropped by
// a sweep.
func TestCollectPlaceholdersRepairsCount(t *testing.T) {
	inv := newInv(t, Config{MaxDiscovered: 2})
	ctx := context.Background()
	for i := range 2 {
		if _, _, err := inv.EnsureMachineForMAC(ctx, phMAC(i)); err != nil {
			t.Fatal(err)
		}
	}
	// Simulate the race: the record is labelled, the count still has it.
	name := MachineNameForMAC(phMAC(0))
	if _, err := inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		m.Labels = map[string]string{"a": "b"}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	inv.ph.mu.Lock()
	inv.ph.names[name] = 1
	inv.ph.mu.Unlock()
	if _, _, err := inv.EnsureMachineForMAC(ctx, phMAC(2)); !errors.Is(err, ErrDiscoveredCap) {
		t.Fatalf("setup: %v", err)
	}
	if _, err := inv.CollectPlaceholders(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, created, err := inv.EnsureMachineForMAC(ctx, phMAC(2)); err != nil || !created {
		t.Fatalf("after the sweep repaired the count: %v", err)
	}
}

func TestCollectPlaceholdersBadAge(t *testing.T) {
	inv := newInv(t, Config{})
	if _, err := inv.CollectPlaceholders(context.Background(), 0); !errors.Is(err, apierr.ErrInvalid) {
		t.Fatalf("age 0: %v", err)
	}
}

// TestUnacceptedCap: past Config.MaxUnaccepted, a report that would make
// a new machine is refused (ResourceExhausted class) and stores nothing;
// a report landing on a known machine is not; a deleted machine frees its
// slot. Parked reports count too. Each refusal is counted
// (Config.ReportRefused, RefusedUnacceptedCap).
func TestUnacceptedCap(t *testing.T) {
	var mu sync.Mutex
	refused := map[string]int{}
	inv := newInv(t, Config{MaxUnaccepted: 2, ReportRefused: func(reason string) { mu.Lock(); refused[reason]++; mu.Unlock() }})
	ctx := context.Background()
	for _, mac := range []string{"52:54:00:00:0d:01", "52:54:00:00:0d:02"} {
		if _, err := inv.Register(ctx, mac, facts("SN-"+mac, "", mac), RegisterOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	const third = "52:54:00:00:0d:03"
	_, err := inv.Register(ctx, third, facts("SN-3", "", third), RegisterOptions{})
	if !errors.Is(err, ErrUnacceptedCap) || !errors.Is(err, apierr.ErrExhausted) || !strings.Contains(err.Error(), "--max-unaccepted") {
		t.Fatalf("third new machine = %v, want ErrUnacceptedCap naming --max-unaccepted", err)
	}
	if _, err := inv.MachineByMAC(ctx, third); !errors.Is(err, apierr.ErrNotFound) {
		t.Fatalf("a refused report left a machine: %v", err)
	}
	// A known machine still reports.
	if _, err := inv.Register(ctx, "52:54:00:00:0d:01", facts("SN-52:54:00:00:0d:01", "", "52:54:00:00:0d:01"), RegisterOptions{}); err != nil {
		t.Fatalf("a known machine's report under the cap: %v", err)
	}
	// A parked report needs a slot of its own.
	_, err = inv.Register(ctx, third, facts("SN-52:54:00:00:0d:01", "", third), RegisterOptions{})
	if !errors.Is(err, ErrUnacceptedCap) {
		t.Fatalf("a claim to park at the cap = %v, want ErrUnacceptedCap", err)
	}
	if err := inv.DeleteMachine(ctx, MachineNameForMAC("52:54:00:00:0d:02")); err != nil {
		t.Fatal(err)
	}
	if _, err := inv.Register(ctx, third, facts("SN-3", "", third), RegisterOptions{}); err != nil {
		t.Fatalf("after a delete freed a slot: %v", err)
	}
	if n := inv.UnacceptedCount(); n != 2 {
		t.Fatalf("UnacceptedCount = %d, want 2", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := map[string]int{RefusedUnacceptedCap: 2}; !maps.Equal(refused, want) {
		t.Errorf("refusals counted %v, want %v", refused, want)
	}
}
