package inventory

import (
	"errors"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
)

// TestCheckSecureBootFacts: a report's Secure Boot state and lockdown
// mode must be known values; anything else refuses the report as invalid.
func TestCheckSecureBootFacts(t *testing.T) {
	for name, tc := range map[string]struct {
		f  *inventoryv1.Facts
		ok bool
	}{
		"enabled":          {&inventoryv1.Facts{SecureBoot: inventoryv1.Facts_SECURE_BOOT_ENABLED, Lockdown: "integrity"}, true},
		"unspecified":      {&inventoryv1.Facts{}, true},
		"unknown state":    {&inventoryv1.Facts{SecureBoot: 9}, false},
		"unknown lockdown": {&inventoryv1.Facts{Lockdown: "[integrity]"}, false},
	} {
		var re *ReportError
		err := (FactCaps{}).Check(tc.f)
		if tc.ok != (err == nil) || (err != nil && (!errors.As(err, &re) || re.Reason != RefusedInvalid)) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
	for want, f := range map[string]*inventoryv1.Facts{
		"enabled, lockdown integrity": {SecureBoot: inventoryv1.Facts_SECURE_BOOT_ENABLED, Lockdown: "integrity"},
		"disabled":                    {SecureBoot: inventoryv1.Facts_SECURE_BOOT_DISABLED},
		"unknown":                     nil,
	} {
		if got := SecureBootText(f); got != want {
			t.Errorf("SecureBootText = %q, want %q", got, want)
		}
	}
}
