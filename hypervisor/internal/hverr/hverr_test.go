package hverr

import (
	"errors"
	"testing"
)

func TestCheckName(t *testing.T) {
	for name, ok := range map[string]bool{
		"vm1": true, "debian-12.qcow2": true, "A_b": true,
		"": false, "../etc": false, "a/b": false, ".hidden": false, "a..b": false,
		"-x": false, "a b": false, "x\x00": false,
	} {
		err := CheckName("volume", name)
		if (err == nil) != ok {
			t.Errorf("CheckName(%q) = %v, want ok=%v", name, err, ok)
		}
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Errorf("CheckName(%q) error %v is not ErrInvalid", name, err)
		}
	}
}
