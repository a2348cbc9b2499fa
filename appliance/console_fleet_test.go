package appliance

import (
	"errors"
	"strings"
	"testing"

	"github.com/corralhq/corral/internal/apierr"
)

// TestConsoleRunner: in a fleet only the appliance that runs a machine's
// BMC work serves its console (a BMC takes one SOL session, two hubs would
// take it from each other); another names that appliance, and a machine
// not assigned yet is Unavailable. Alone, every machine is served.
func TestConsoleRunner(t *testing.T) {
	s := &Server{}
	if err := s.consoleRunner("m1"); err != nil {
		t.Fatalf("alone: %v", err)
	}
	assigned := map[string]string{"m1": "a1", "m2": "a2"}
	s.owner = func(m string) bool { return assigned[m] == "a1" }
	s.runner = func(m string) (string, bool) { r, ok := assigned[m]; return r, ok }
	if err := s.consoleRunner("m1"); err != nil {
		t.Fatalf("own machine: %v", err)
	}
	err := s.consoleRunner("m2")
	if !errors.Is(err, apierr.ErrPrecondition) || !strings.Contains(err.Error(), `appliance "a2"`) {
		t.Fatalf("another appliance's machine: %v, want FailedPrecondition naming a2", err)
	}
	if err := s.consoleRunner("m3"); !errors.Is(err, apierr.ErrUnavailable) {
		t.Fatalf("unassigned machine: %v, want Unavailable", err)
	}
}
