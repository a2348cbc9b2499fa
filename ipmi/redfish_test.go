package ipmi_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/ipmi"
	"github.com/corralhq/corral/testsupport/ipmisim"
	"github.com/corralhq/corral/testsupport/redfishtest"
)

// redfishTarget reaches s with its certificate pinned.
func redfishTarget(s *redfishtest.Server) ipmi.Target {
	return ipmi.Target{Host: s.Host, Port: s.Port, Protocol: ipmi.ProtocolRedfish, Username: s.User, Password: s.Pass, Timeout: 10 * time.Second,
		TLSSHA256: s.Fingerprint()}
}

func TestRedfishPowerSemantics(t *testing.T) {
	t.Parallel()
	b := ipmisim.Start(t, ipmisim.Options{})
	rf := redfishtest.Start(t, "root", "calvin", b.Machine())
	c := ipmi.New(ipmi.Config{})
	tg := redfishTarget(rf)
	ctx := context.Background()
	must := func(a ipmi.Answer, err error) ipmi.Answer {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if a.Provider != ipmi.RedfishProviderName {
			t.Fatalf("answered by %q (%s)", a.Provider, a)
		}
		return a
	}
	must(c.SetPower(ctx, tg, ipmi.ActionOff))
	waitPower(t, c, tg, ipmi.PowerOff, 5*time.Second)
	if a := must(c.SetPower(ctx, tg, ipmi.ActionSoftOff)); a.Note != "already off" {
		t.Fatalf("soft when off: %q", a.Note)
	}
	if a := must(c.SetPower(ctx, tg, ipmi.ActionCycle)); !strings.Contains(a.Note, "became on") {
		t.Fatalf("cycle when off: %q", a.Note)
	}
	waitPower(t, c, tg, ipmi.PowerOn, 5*time.Second)
	if a := must(c.SetPower(ctx, tg, ipmi.ActionOn)); a.Note != "already on" {
		t.Fatalf("on when on: %q", a.Note)
	}
	must(c.SetBootDevice(ctx, tg, ipmi.BootPXE, ipmi.BootOptions{EFI: true}))
	if bt := rf.Boot(); bt["BootSourceOverrideTarget"] != "Pxe" || bt["BootSourceOverrideEnabled"] != "Once" || bt["BootSourceOverrideMode"] != "UEFI" {
		t.Fatalf("boot override %v", bt)
	}
	must(c.SetPower(ctx, tg, ipmi.ActionCycle))
	must(c.SetPower(ctx, tg, ipmi.ActionReset))
	must(c.SetPower(ctx, tg, ipmi.ActionOff))
	waitPower(t, c, tg, ipmi.PowerOff, 5*time.Second)
	rec := strings.Join(b.Record(), "\n")
	if !strings.Contains(rec, "start boot=pxe") {
		t.Fatalf("PXE override did not reach the machine:\n%s", rec)
	}
	// Sessions are created and closed.
	reqs := strings.Join(rf.Requests(), "\n")
	if !strings.Contains(reqs, "POST /redfish/v1/SessionService/Sessions") || !strings.Contains(reqs, "DELETE /redfish/v1/SessionService/Sessions/") {
		t.Fatalf("no session lifecycle:\n%s", reqs)
	}
}

func TestRedfishWrongPasswordAndGarbage(t *testing.T) {
	t.Parallel()
	b := ipmisim.Start(t, ipmisim.Options{})
	rf := redfishtest.Start(t, "root", "calvin", b.Machine())
	c := ipmi.New(ipmi.Config{})
	tg := redfishTarget(rf)
	tg.Password = "wrong"
	start := time.Now()
	_, _, err := c.PowerState(context.Background(), tg)
	if !errors.Is(err, ipmi.ErrAuth) || !strings.Contains(err.Error(), "authentication failed") || time.Since(start) > 5*time.Second {
		t.Fatalf("wrong password: %v after %s", err, time.Since(start))
	}
	rf.SetGarbage(true)
	_, _, err = c.PowerState(context.Background(), redfishTarget(rf))
	if err == nil || errors.Is(err, ipmi.ErrAuth) {
		t.Fatalf("garbage: %v", err)
	}
	t.Logf("garbage: %v", err)
}
