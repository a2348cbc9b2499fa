package audit

import (
	"strings"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
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
