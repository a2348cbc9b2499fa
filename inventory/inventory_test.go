package inventory

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store/mem"
)

func newInv(t testing.TB, cfg Config) *Inventory {
	t.Helper()
	if cfg.Store == nil {
		cfg.Store = mem.New()
	}
	inv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- inv.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return inv
}

func TestEnsureMachineForMACConcurrent(t *testing.T) {
	inv := newInv(t, Config{})
	ctx := context.Background()
	var wg sync.WaitGroup
	var mu sync.Mutex
	created := 0
	names := map[string]bool{}
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, c, err := inv.EnsureMachineForMAC(ctx, "52-54-00-AA-BB-01")
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			names[m.GetName()] = true
			if c {
				created++
			}
		}()
	}
	wg.Wait()
	if created != 1 || len(names) != 1 || !names["m-525400aabb01"] {
		t.Fatalf("created %d, names %v", created, names)
	}
	m, err := inv.MachineByMAC(ctx, "52:54:00:aa:bb:01")
	if err != nil || m.GetState() != inventoryv1.Machine_DISCOVERED || m.GetBootIntent() != inventoryv1.BootIntent_BOOT_INTENT_DISCOVER {
		t.Fatalf("machine %v, %v", m, err)
	}
}

func TestCreateMachineMACConflict(t *testing.T) {
	inv := newInv(t, Config{})
	ctx := context.Background()
	if _, err := inv.CreateMachine(ctx, &inventoryv1.Machine{Name: "a", Macs: []string{"52:54:00:00:00:01", "52:54:00:00:00:02"}}); err != nil {
		t.Fatal(err)
	}
	_, err := inv.CreateMachine(ctx, &inventoryv1.Machine{Name: "b", Macs: []string{"52:54:00:00:00:03", "52:54:00:00:00:02"}})
	if !errors.Is(err, apierr.ErrAlreadyExists) {
		t.Fatalf("want apierr.ErrAlreadyExists, got %v", err)
	}
	// b's first MAC was released again.
	if _, err := inv.MachineByMAC(ctx, "52:54:00:00:00:03"); !errors.Is(err, apierr.ErrNotFound) {
		t.Fatalf("MAC of failed create still bound: %v", err)
	}
	if err := inv.DeleteMachine(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := inv.CreateMachine(ctx, &inventoryv1.Machine{Name: "b", Macs: []string{"52:54:00:00:00:02"}}); err != nil {
		t.Fatalf("MAC of deleted machine not reusable: %v", err)
	}
}

func TestBadInput(t *testing.T) {
	inv := newInv(t, Config{})
	ctx := context.Background()
	cases := map[string]func() error{
		"bad name": func() error { _, err := inv.GetMachine(ctx, "a/b"); return err },
		"bad mac create": func() error {
			_, err := inv.CreateMachine(ctx, &inventoryv1.Machine{Name: "x", BootMac: "zz"})
			return err
		},
		"bad mac ensure": func() error { _, _, err := inv.EnsureMachineForMAC(ctx, "01:02"); return err },
		"selectors": func() error {
			_, err := inv.ListMachines(ctx, &inventoryv1.ListMachinesRequest{Selectors: []string{"diskz>=2"}})
			return err
		},
		"timeline none": func() error { _, err := inv.Timeline(ctx, "", "", 0); return err },
	}
	for name, f := range cases {
		t.Run(name, func(t *testing.T) {
			if err := f(); !errors.Is(err, apierr.ErrInvalid) {
				t.Fatalf("want apierr.ErrInvalid, got %v", err)
			}
		})
	}
	if ms, err := inv.ListMachines(ctx, &inventoryv1.ListMachinesRequest{}); err != nil || len(ms) != 0 {
		t.Fatalf("bad input stored something: %v %v", ms, err)
	}
}

func TestUpdateMachineRefusesMACChange(t *testing.T) {
	inv := newInv(t, Config{})
	ctx := context.Background()
	inv.CreateMachine(ctx, &inventoryv1.Machine{Name: "a", BootMac: "52:54:00:00:00:01"})
	_, err := inv.UpdateMachine(ctx, "a", func(m *inventoryv1.Machine) error { m.Macs = append(m.Macs, "52:54:00:00:00:09"); return nil })
	if !errors.Is(err, apierr.ErrInvalid) {
		t.Fatalf("want apierr.ErrInvalid, got %v", err)
	}
	m, err := inv.UpdateMachine(ctx, "a", func(m *inventoryv1.Machine) error {
		m.BootIntent = inventoryv1.BootIntent_BOOT_INTENT_LOCAL
		return nil
	})
	if err != nil || m.GetBootIntent() != inventoryv1.BootIntent_BOOT_INTENT_LOCAL {
		t.Fatal(m, err)
	}
	_, intent, _ := inv.BootIntent(ctx, "52:54:00:00:00:01")
	if intent != inventoryv1.BootIntent_BOOT_INTENT_LOCAL {
		t.Fatalf("intent %v", intent)
	}
	_, intent, _ = inv.BootIntent(ctx, "52:54:00:00:00:77")
	if intent != inventoryv1.BootIntent_BOOT_INTENT_DISCOVER {
		t.Fatalf("unknown MAC intent %v", intent)
	}
}

func TestTimelineOrderAndTrim(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); now = now.Add(time.Millisecond); return now }
	inv := newInv(t, Config{TimelineLimit: 50, Now: clock})
	ctx := context.Background()
	// Record entries (an agent's): TimelineLimit is their cap per MAC (the
	// boot LAN's DHCP entries have their own, TimelineBootLAN).
	for k := range 120 {
		inv.Event("52:54:00:00:00:01", "agent", "progress", fmt.Sprint(k), nil)
	}
	inv.Event("52:54:00:00:00:02", "dhcp", "discover", "other", nil)
	inv.Event("bogus", "dhcp", "discover", "dropped", nil)
	if err := inv.FlushTimeline(ctx); err != nil {
		t.Fatal(err)
	}
	es, err := inv.Timeline(ctx, "", "52:54:00:00:00:01", 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) < 50 || len(es) > 60 {
		t.Fatalf("kept %d entries, want about the limit of 50", len(es))
	}
	if es[len(es)-1].GetDetail() != "119" {
		t.Fatalf("newest entry %q, want 119", es[len(es)-1].GetDetail())
	}
	for k := 1; k < len(es); k++ {
		if es[k].GetAt().AsTime().Before(es[k-1].GetAt().AsTime()) {
			t.Fatal("timeline out of order")
		}
	}
	es, _ = inv.Timeline(ctx, "", "52:54:00:00:00:01", 5)
	if len(es) != 5 || es[4].GetDetail() != "119" {
		t.Fatalf("limit 5: %d entries", len(es))
	}
}

func TestTimelineQueueFullDrops(t *testing.T) {
	inv, err := New(Config{Store: mem.New(), TimelineQueue: 4})
	if err != nil {
		t.Fatal(err)
	}
	// Run is not started: Record must not block once the queue is full.
	done := make(chan struct{})
	go func() {
		for range 100 {
			inv.Event("52:54:00:00:00:01", "dhcp", "discover", "", nil)
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Record blocked on a full queue")
	}
	if inv.tl.Dropped() != 96 {
		t.Fatalf("dropped %d, want 96", inv.tl.Dropped())
	}
}

func memStore() *mem.Store { return mem.New() }
