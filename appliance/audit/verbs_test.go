package audit

import (
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
)

// TestReleaseVerbNamesTheErase: a release's timeline words say the erase
// level it asked for.
func TestReleaseVerbNamesTheErase(t *testing.T) {
	const method = "/corral.inventory.v1.MachineService/ReleaseMachine"
	for level, want := range map[inventoryv1.EraseLevel]string{
		inventoryv1.EraseLevel_ERASE_LEVEL_DEFAULT: "release",
		inventoryv1.EraseLevel_ERASE_LEVEL_NONE:    "release, erase none",
		inventoryv1.EraseLevel_ERASE_LEVEL_FULL:    "release, erase full",
		inventoryv1.EraseLevel_ERASE_LEVEL_SECURE:  "release, erase secure",
	} {
		if got := timelineVerb(method, &inventoryv1.ReleaseMachineRequest{Name: "m1", Erase: level}); got != want {
			t.Errorf("%s: %q, want %q", level, got, want)
		}
	}
}
