package ipmi_test

import (
	"context"
	"errors"
	"testing"

	"github.com/corralhq/corral/ipmi"
	"github.com/corralhq/corral/testsupport/ipmisim"
)

// TestSimAccounts: an account made with the administrator's credentials
// logs in with its password; set again, its old password is refused;
// disabled, it is refused altogether; the administrator still works.
func TestSimAccounts(t *testing.T) {
	t.Parallel()
	b := ipmisim.Start(t, ipmisim.Options{})
	c := nativeOnly()
	ctx := context.Background()
	admin := simTarget(b)
	pw1 := ipmi.NewPassword()
	id, a, err := c.SetAccount(ctx, admin, ipmi.Account{Name: "corral-a", Password: pw1})
	if err != nil {
		t.Fatalf("set account: %v (%s)", err, a)
	}
	if id < 3 {
		t.Fatalf("account in slot %d, want 3 or above", id)
	}
	as := func(pw string) ipmi.Target { tg := admin; tg.Username, tg.Password = "corral-a", pw; return tg }
	if _, _, err := c.PowerState(ctx, as(pw1)); err != nil {
		t.Fatalf("new account: %v", err)
	}
	pw2 := ipmi.NewPassword()
	id2, _, err := c.SetAccount(ctx, as(pw1), ipmi.Account{Name: "corral-b", Password: pw2})
	if err != nil || id2 == id {
		t.Fatalf("second account: slot %d (first %d): %v", id2, id, err)
	}
	pw3 := ipmi.NewPassword()
	if id3, _, err := c.SetAccount(ctx, as(pw1) /*logged in as corral-a*/, ipmi.Account{Name: "corral-b", Password: pw3}); err != nil || id3 != id2 {
		t.Fatalf("same name again: slot %d (want %d): %v", id3, id2, err)
	}
	asB := func(pw string) ipmi.Target { tg := admin; tg.Username, tg.Password = "corral-b", pw; return tg }
	if _, _, err := c.PowerState(ctx, asB(pw2)); !errors.Is(err, ipmi.ErrAuth) {
		t.Fatalf("old password of corral-b: want ErrAuth, got %v", err)
	}
	if _, _, err := c.PowerState(ctx, asB(pw3)); err != nil {
		t.Fatalf("new password of corral-b: %v", err)
	}
	if _, err := c.DisableAccount(ctx, asB(pw3), id); err != nil {
		t.Fatalf("disable corral-a: %v", err)
	}
	if _, _, err := c.PowerState(ctx, as(pw1)); !errors.Is(err, ipmi.ErrAuth) {
		t.Fatalf("disabled corral-a: want ErrAuth, got %v", err)
	}
	if _, _, err := c.PowerState(ctx, admin); err != nil {
		t.Fatalf("administrator: %v", err)
	}
	if _, err := c.DisableAccount(ctx, asB(pw3), id2); !errors.Is(err, ipmi.ErrInvalid) {
		t.Fatalf("disabling the account logged in with: want ErrInvalid, got %v", err)
	}
}
