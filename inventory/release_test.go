package inventory

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
)

type levels map[string]inventoryv1.EraseLevel

func (l levels) EraseLevel(pool string) inventoryv1.EraseLevel { return l[pool] }

// TestReleaseEraseLevels: the level a release erases at (given, or the
// pool's for DEFAULT), which disks (non-removable ones), and a machine
// without disks is READY at once.
func TestReleaseEraseLevels(t *testing.T) {
	full, quick := inventoryv1.EraseLevel_ERASE_LEVEL_FULL, inventoryv1.EraseLevel_ERASE_LEVEL_QUICK
	for name, tc := range map[string]struct {
		opts  ReleaseOptions
		disks int
		want  inventoryv1.EraseLevel // unset: READY without an erase
	}{
		"given":                 {opts: ReleaseOptions{Erase: full}, disks: 2, want: full},
		"given over the pool's": {opts: ReleaseOptions{Erase: full, Pools: levels{"ci": quick}}, disks: 2, want: full},
		"pool's":                {opts: ReleaseOptions{Pools: levels{"ci": quick}}, disks: 2, want: quick},
		"pool's default":        {opts: ReleaseOptions{Pools: levels{"ci": inventoryv1.EraseLevel_ERASE_LEVEL_DEFAULT}}, disks: 2},
		"no policy":             {disks: 2},
		"none over the pool's":  {opts: ReleaseOptions{Erase: inventoryv1.EraseLevel_ERASE_LEVEL_NONE, Pools: levels{"ci": full}}, disks: 2},
		"no disks":              {opts: ReleaseOptions{Erase: full}},
	} {
		t.Run(name, func(t *testing.T) {
			inv := newInv(t, Config{})
			ctx := context.Background()
			m := poolMachine("r1", 16, tc.disks)
			if tc.disks > 0 {
				m.Facts.Disks = append(m.Facts.Disks, &inventoryv1.Facts_Disk{Name: "sdz", Removable: true})
			}
			create(t, inv, m)
			alice := Owner{ID: "token:alice"}
			if _, err := inv.AllocateMachines(ctx, alice, AllocateRequest{}); err != nil {
				t.Fatal(err)
			}
			got, err := inv.ReleaseMachine(ctx, alice, "r1", tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == inventoryv1.EraseLevel_ERASE_LEVEL_DEFAULT {
				if got.GetState() != inventoryv1.Machine_READY || got.GetErase() != nil {
					t.Fatalf("%s %v, want READY without an erase", got.GetState(), got.GetErase())
				}
				return
			}
			e := got.GetErase()
			if got.GetState() != inventoryv1.Machine_RELEASING || e.GetLevel() != tc.want || !slices.Equal(e.GetDisks(), []string{"/dev/sda", "/dev/sdb"}) ||
				!strings.HasPrefix(e.GetEraseId(), EraseIDPrefix) || got.GetAllocation().GetReleasedAt() == nil {
				t.Fatalf("%s %v %v", got.GetState(), e, got.GetAllocation())
			}
		})
	}
	inv := newInv(t, Config{})
	if _, err := inv.ReleaseMachine(context.Background(), Owner{ID: "token:op", Operator: true}, "r1", ReleaseOptions{Erase: 9}); !errors.Is(err, apierr.ErrInvalid) {
		t.Fatalf("unknown level: %v", err)
	}
}

// TestDeleteHeldOrErasing: a machine that is allocated, or whose disks
// are being erased, cannot be deleted: the erase would never run and the
// owner's data would go to whoever discovers the machine next.
func TestDeleteHeldOrErasing(t *testing.T) {
	inv := newInv(t, Config{})
	ctx := context.Background()
	create(t, inv, poolMachine("r1", 16, 2))
	alice := Owner{ID: "token:alice"}
	if _, err := inv.AllocateMachines(ctx, alice, AllocateRequest{}); err != nil {
		t.Fatal(err)
	}
	if err := inv.DeleteMachine(ctx, "r1"); !errors.Is(err, apierr.ErrPrecondition) || !strings.Contains(err.Error(), "allocated to") {
		t.Fatalf("delete an allocated machine: %v", err)
	}
	m, err := inv.ReleaseMachine(ctx, alice, "r1", ReleaseOptions{Erase: inventoryv1.EraseLevel_ERASE_LEVEL_FULL})
	if err != nil || m.GetState() != inventoryv1.Machine_RELEASING {
		t.Fatalf("release: %v %v", m.GetState(), err)
	}
	if err := inv.DeleteMachine(ctx, "r1"); !errors.Is(err, apierr.ErrPrecondition) || !strings.Contains(err.Error(), "being erased") {
		t.Fatalf("delete a machine being erased: %v", err)
	}
	if got, err := inv.GetMachine(ctx, "r1"); err != nil || got.GetState() != inventoryv1.Machine_RELEASING {
		t.Fatalf("after the refused delete: %v %v", got.GetState(), err)
	}
}
