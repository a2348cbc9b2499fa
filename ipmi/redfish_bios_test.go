package ipmi_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/corralhq/corral/ipmi"
	"github.com/corralhq/corral/testsupport/redfishtest"
)

func biosAttr(t *testing.T, b ipmi.BIOS, name string) ipmi.BIOSAttribute {
	t.Helper()
	for _, a := range b.Attributes {
		if a.Name == name {
			return a
		}
	}
	t.Fatalf("no attribute %s in %+v", name, b)
	return ipmi.BIOSAttribute{}
}

// TestRedfishBIOS: the attributes are read with their registry; settings
// PATCHed to Bios/Settings are pending (current unchanged) until the
// system resets, then current; unknown keys, wrong types, values outside
// the registry's list or bounds and read-only attributes are refused
// before anything is sent; without a registry the types read decide.
func TestRedfishBIOS(t *testing.T) {
	t.Parallel()
	rf := redfishtest.Start(t, "root", "calvin", &redfishtest.MemMachine{})
	c := ipmi.New(ipmi.Config{})
	ctx := context.Background()
	tg := redfishTarget(rf)
	b, a, err := c.BIOS(ctx, tg)
	if err != nil || a.Provider != ipmi.RedfishProviderName {
		t.Fatalf("read: %v (%s)", err, a)
	}
	if b.Registry == "" {
		t.Fatal("the registry was not found")
	}
	bm := biosAttr(t, b, "BootMode")
	if bm.Type != "Enumeration" || bm.Current != "Uefi" || len(bm.Allowed) != 2 || bm.HasPending {
		t.Fatalf("BootMode: %+v", bm)
	}
	if a := biosAttr(t, b, "PowerRestoreDelay"); a.Type != "Integer" || a.Upper != 600 {
		t.Fatalf("PowerRestoreDelay: %+v", a)
	}
	b, _, err = c.SetBIOS(ctx, tg, map[string]string{"BootMode": "LegacyBios", "SriovGlobalEnable": "true", "PowerRestoreDelay": "30"})
	if err != nil {
		t.Fatalf("set: %v", err)
	}
	if a := biosAttr(t, b, "BootMode"); a.Current != "Uefi" || !a.HasPending || a.Pending != "LegacyBios" {
		t.Fatalf("BootMode after set: %+v", a)
	}
	if a := biosAttr(t, b, "PowerRestoreDelay"); a.Pending != "30" {
		t.Fatalf("PowerRestoreDelay after set: %+v", a)
	}
	// Refusals: nothing reaches the settings object.
	patches := rf.Requested("PATCH /redfish/v1/Systems/1/Bios/Settings")
	for _, bad := range []struct {
		set  map[string]string
		want string
	}{
		{map[string]string{"NoSuchKnob": "1"}, `unknown BIOS attribute "NoSuchKnob"`},
		{map[string]string{"PowerRestoreDelay": "soon"}, `"soon" is not an integer`},
		{map[string]string{"PowerRestoreDelay": "9000"}, "outside 0..600"},
		{map[string]string{"SriovGlobalEnable": "maybe"}, "not a boolean"},
		{map[string]string{"BootMode": "Floppy"}, "not one of Uefi, LegacyBios"},
		{map[string]string{"SystemSerial": "X"}, "read-only"},
		{map[string]string{"AssetTag": strings.Repeat("x", 40)}, "at most 32"},
	} {
		_, _, err := c.SetBIOS(ctx, tg, bad.set)
		if !errors.Is(err, ipmi.ErrInvalid) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%v: want ErrInvalid saying %q, got %v", bad.set, bad.want, err)
		}
	}
	if n := rf.Requested("PATCH /redfish/v1/Systems/1/Bios/Settings"); n != patches {
		t.Fatalf("a refused setting reached the BMC (%d PATCHes, was %d)", n, patches)
	}
	// The reboot applies what is pending.
	if _, err := c.SetPower(ctx, tg, ipmi.ActionOn); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetPower(ctx, tg, ipmi.ActionReset); err != nil {
		t.Fatal(err)
	}
	b, _, err = c.BIOS(ctx, tg)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"BootMode": "LegacyBios", "SriovGlobalEnable": "true", "PowerRestoreDelay": "30"} {
		if a := biosAttr(t, b, name); a.Current != want || a.HasPending {
			t.Errorf("%s after the reboot: %+v", name, a)
		}
	}
	// No registry: the values read give the types.
	rf.SetBIOSRegistry(false)
	b, _, err = c.BIOS(ctx, tg)
	if err != nil || b.Registry != "" {
		t.Fatalf("without a registry: %v (registry %q)", err, b.Registry)
	}
	if _, _, err := c.SetBIOS(ctx, tg, map[string]string{"PowerRestoreDelay": "later"}); !errors.Is(err, ipmi.ErrInvalid) ||
		!strings.Contains(err.Error(), "offers no attribute registry") {
		t.Fatalf("without a registry, a wrong type: %v", err)
	}
	if _, _, err := c.SetBIOS(ctx, tg, map[string]string{"PowerRestoreDelay": "45"}); err != nil {
		t.Fatalf("without a registry, a good value: %v", err)
	}
	if _, p := rf.BIOS(); p["PowerRestoreDelay"] != int64(45) {
		t.Fatalf("pending on the BMC: %v", p)
	}
}

// TestRedfishBIOSNotRedfish: a target enrolled for IPMI is refused with
// ErrNotRedfish before anything is opened.
func TestRedfishBIOSNotRedfish(t *testing.T) {
	t.Parallel()
	c := ipmi.New(ipmi.Config{})
	_, _, err := c.BIOS(context.Background(), ipmi.Target{Host: "127.0.0.1", Port: 1, Protocol: ipmi.ProtocolIPMI, Username: "u", Password: "p"})
	if !errors.Is(err, ipmi.ErrNotRedfish) || !strings.Contains(err.Error(), "BMC is IPMI; BIOS over Redfish needs a Redfish BMC") {
		t.Fatalf("want ErrNotRedfish, got %v", err)
	}
}
