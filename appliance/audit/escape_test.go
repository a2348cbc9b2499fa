package audit

import (
	"context"
	"slices"
	"strings"
	"testing"

	auditv1 "github.com/corralhq/corral/api/audit/v1"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/store/mem"
)

// An object name is the caller's to choose (an unauthenticated caller's
// too): it is recorded with its control characters escaped.
func TestAuditObjectEscapesControlCharacters(t *testing.T) {
	got := auditObject(auditRule{kind: "machine", field: "name"}, &inventoryv1.GetMachineRequest{Name: "m\x1b]52;c;eA==\x07\u009b2J\u202e"})
	if want := `machine/m\x1b]52;c;eA==\x07\u009b2J\u202e`; got != want {
		t.Errorf("object %q, want %q", got, want)
	}
	if strings.ContainsAny(got, "\x1b\x07\u009b\u202e") {
		t.Errorf("object %q holds control characters", got)
	}
}

// TestAuditAction: a machine call's event says what it asked for in its
// timeline's words (an erase level, a deploy's image), and never the
// deploy's user data or keys.
func TestAuditAction(t *testing.T) {
	a := newTestAudit(t, mem.New(), Config{})
	a.run(t)
	a.call("/corral.inventory.v1.MachineService/ReleaseMachine",
		&inventoryv1.ReleaseMachineRequest{Name: "m-1", Erase: inventoryv1.EraseLevel_ERASE_LEVEL_FULL}, nil)
	a.call("/corral.inventory.v1.MachineService/DeployMachine",
		&inventoryv1.DeployMachineRequest{Name: "m-1", OsImage: "debian-12", UserData: []byte("#cloud-config\npassword: hunter2\n"), SshKeys: []string{"ssh-ed25519 AAAA secret-key"}}, nil)
	a.call("/corral.inventory.v1.MachineService/SetPower",
		&inventoryv1.SetPowerRequest{Name: "m-1", Action: inventoryv1.PowerAction_POWER_ACTION_CYCLE}, nil)
	if err := a.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	evs, err := a.list(context.Background(), &auditv1.ListEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range evs {
		got = append(got, e.GetAction())
		if s := e.String(); strings.Contains(s, "hunter2") || strings.Contains(s, "secret-key") {
			t.Errorf("the event carries the deploy's secrets: %s", s)
		}
	}
	if want := []string{"release, erase full", "deploy debian-12", "power cycle"}; !slices.Equal(got, want) {
		t.Fatalf("actions %q, want %q", got, want)
	}
}
