package safename

import (
	"errors"
	"testing"

	"github.com/corralhq/corral/internal/apierr"
)

func TestCheck(t *testing.T) {
	for name, ok := range map[string]bool{
		"vm1": true, "debian-12.qcow2": true, "A_b": true,
		"": false, "../etc": false, "a/b": false, ".hidden": false, "a..b": false,
		"-x": false, "a b": false, "x\x00": false,
	} {
		err := Check("volume", name)
		if (err == nil) != ok {
			t.Errorf("Check(%q) = %v, want ok=%v", name, err, ok)
		}
		if err != nil && !errors.Is(err, apierr.ErrInvalid) {
			t.Errorf("Check(%q) error %v is not apierr.ErrInvalid", name, err)
		}
	}
}
