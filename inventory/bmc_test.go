package inventory

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fakeBMC is one or more BMCs keyed by host:port.
type fakeBMC struct {
	mu       sync.Mutex
	password map[string]string // host:port -> password
	power    map[string]inventoryv1.PowerState
	boots    []BootRequest
	actions  []inventoryv1.PowerAction
	calls    int
}

func newFakeBMC() *fakeBMC {
	return &fakeBMC{password: map[string]string{}, power: map[string]inventoryv1.PowerState{}}
}

func (f *fakeBMC) check(t BMCTarget) error {
	f.calls++
	pw, ok := f.password[t.String()]
	if !ok {
		return fmt.Errorf("%w: %s: no answer: %w", ErrUnavailable, t, context.DeadlineExceeded)
	}
	if pw != t.Password {
		return fmt.Errorf("%w: %s", ErrBMCAuth, t)
	}
	return nil
}

func (f *fakeBMC) PowerState(ctx context.Context, t BMCTarget) (inventoryv1.PowerState, BMCResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check(t); err != nil {
		return 0, BMCResult{}, err
	}
	st := f.power[t.String()]
	if st == 0 {
		st = inventoryv1.PowerState_POWER_STATE_OFF
	}
	return st, BMCResult{Provider: "fake"}, nil
}

func (f *fakeBMC) SetPower(ctx context.Context, t BMCTarget, a inventoryv1.PowerAction) (BMCResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check(t); err != nil {
		return BMCResult{}, err
	}
	f.actions = append(f.actions, a)
	switch a {
	case inventoryv1.PowerAction_POWER_ACTION_OFF, inventoryv1.PowerAction_POWER_ACTION_SOFT_OFF:
		f.power[t.String()] = inventoryv1.PowerState_POWER_STATE_OFF
	default:
		f.power[t.String()] = inventoryv1.PowerState_POWER_STATE_ON
	}
	return BMCResult{Provider: "fake"}, nil
}

func (f *fakeBMC) SetBootDevice(ctx context.Context, t BMCTarget, b BootRequest) (BMCResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check(t); err != nil {
		return BMCResult{}, err
	}
	f.boots = append(f.boots, b)
	return BMCResult{Provider: "fake"}, nil
}

// xorSealer is a test sealer: reversible, bound to ad, never plaintext.
type xorSealer struct{}

func (xorSealer) Seal(p, ad []byte) ([]byte, error) {
	out := append([]byte("v1:"+string(ad)+":"), p...)
	for i := range out[len(out)-len(p):] {
		out[len(out)-len(p)+i] ^= 0x5a
	}
	return out, nil
}

func (xorSealer) Open(b, ad []byte) ([]byte, error) {
	pre := []byte("v1:" + string(ad) + ":")
	if !bytes.HasPrefix(b, pre) {
		return nil, errors.New("wrong ad")
	}
	p := append([]byte(nil), b[len(pre):]...)
	for i := range p {
		p[i] ^= 0x5a
	}
	return p, nil
}

func newBMCControl(t *testing.T) (*Inventory, *BMCControl, *fakeBMC) {
	inv := newInv(t, Config{})
	f := newFakeBMC()
	c, err := inv.NewBMCControl(BMCConfig{BMC: f, Sealer: xorSealer{}})
	if err != nil {
		t.Fatal(err)
	}
	return inv, c, f
}

func enrollReq(name, addr, pw string) *inventoryv1.EnrollMachineRequest {
	return &inventoryv1.EnrollMachineRequest{Name: name, BmcAddress: addr, BmcUsername: "admin", BmcPassword: pw,
		BmcProtocol: inventoryv1.BmcProtocol_BMC_PROTOCOL_IPMI}
}

func TestEnrollCreatesAndSealsAndPowers(t *testing.T) {
	inv, c, f := newBMCControl(t)
	ctx := context.Background()
	f.password["10.0.0.21:623"] = "pw1"
	req := enrollReq("m1", "10.0.0.21", "pw1")
	req.BootMac = "52:54:00:00:00:01"
	m, err := c.Enroll(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if m.GetState() != inventoryv1.Machine_DISCOVERED || m.GetBmc().GetAddress() != "10.0.0.21" || m.GetBmc().GetPort() != 623 ||
		m.GetPowerState() != inventoryv1.PowerState_POWER_STATE_OFF || m.GetBmc().GetProvider() != "fake" || m.GetBmc().GetVerifiedAt() == nil {
		t.Fatalf("machine after enroll: %v", m)
	}
	// The password is sealed in its own record, nowhere in the machine.
	got, _ := inv.GetMachine(ctx, "m1")
	if strings.Contains(got.String(), "pw1") {
		t.Fatal("password visible in machine record")
	}
	var sec inventoryv1.BmcSecret
	if _, err := record.Get(ctx, inv.cfg.Store, bmcSecretPrefix+"m1", &sec); err != nil || bytes.Contains(sec.GetSealedPassword(), []byte("pw1")) {
		t.Fatalf("secret record: %v %q", err, sec.GetSealedPassword())
	}
	ps, err := c.SetPower(ctx, "m1", inventoryv1.PowerAction_POWER_ACTION_ON)
	if err != nil || ps.GetState() != inventoryv1.PowerState_POWER_STATE_ON || ps.GetProvider() != "fake" {
		t.Fatalf("power on: %v %v", ps, err)
	}
	if err := c.SetBootDevice(ctx, "m1", BootRequest{Device: inventoryv1.BootDevice_BOOT_DEVICE_PXE, EFI: true}); err != nil {
		t.Fatal(err)
	}
	if len(f.boots) != 1 || f.boots[0].Device != inventoryv1.BootDevice_BOOT_DEVICE_PXE || !f.boots[0].EFI || f.boots[0].Persistent {
		t.Fatalf("boots %v", f.boots)
	}
	// Timeline: enrolled, power-on, power change, bootdev.
	if err := inv.FlushTimeline(ctx); err != nil {
		t.Fatal(err)
	}
	es, err := inv.Timeline(ctx, "m1", "", 0)
	if err != nil {
		t.Fatal(err)
	}
	var events []string
	for _, e := range es {
		events = append(events, e.GetEvent())
	}
	for _, want := range []string{"enrolled", "power-on", "power-changed", "bootdev"} {
		if !strings.Contains(strings.Join(events, ","), want) {
			t.Errorf("timeline lacks %s: %v", want, events)
		}
	}
}

func TestEnrollRefusals(t *testing.T) {
	ctx := context.Background()
	for name, tc := range map[string]struct {
		req  *inventoryv1.EnrollMachineRequest
		want error
	}{
		"malformed address":    {enrollReq("m1", "http://10.0.0.1/", "pw"), ErrInvalid},
		"bad port":             {enrollReq("m1", "10.0.0.1:99999", "pw"), ErrInvalid},
		"garbage host":         {enrollReq("m1", "not a host!", "pw"), ErrInvalid},
		"bad ipv4":             {enrollReq("m1", "999.1.1.1", "pw"), ErrInvalid},
		"ipv6 without bracket": {enrollReq("m1", "fe80::1:623x", "pw"), ErrInvalid},
		"empty address":        {enrollReq("m1", "", "pw"), ErrInvalid},
		"no password":          {enrollReq("m1", "10.0.0.1", ""), ErrInvalid},
		"bad name":             {enrollReq("-x", "10.0.0.1", "pw"), ErrInvalid},
		"unsupported protocol": {&inventoryv1.EnrollMachineRequest{Name: "m1", BmcAddress: "10.0.0.1", BmcUsername: "u", BmcPassword: "p", BmcProtocol: 9}, ErrInvalid},
		"bad cipher":           {&inventoryv1.EnrollMachineRequest{Name: "m1", BmcAddress: "10.0.0.1", BmcUsername: "u", BmcPassword: "p", BmcCipherSuite: 18}, ErrInvalid},
		"wrong password":       {enrollReq("m1", "10.0.0.5", "nope"), ErrBMCAuth},
		"unreachable":          {enrollReq("m1", "10.0.0.99", "pw"), ErrUnavailable},
	} {
		t.Run(name, func(t *testing.T) {
			inv, c, f := newBMCControl(t)
			f.password["10.0.0.5:623"] = "right"
			_, err := c.Enroll(ctx, tc.req)
			if !errors.Is(err, tc.want) {
				t.Fatalf("want %v, got %v", tc.want, err)
			}
			// Nothing stored.
			if ms, _ := inv.ListMachines(ctx, &inventoryv1.ListMachinesRequest{}); len(ms) != 0 {
				t.Fatalf("machines stored after a refused enroll: %v", ms)
			}
			if tc.want == ErrBMCAuth {
				if st := status.Code(toStatus(err)); st != codes.FailedPrecondition || !strings.Contains(toStatus(err).Error(), "authentication failed") {
					t.Fatalf("status %v", toStatus(err))
				}
			}
		})
	}
}

func TestEnrollDuplicateAddress(t *testing.T) {
	inv, c, f := newBMCControl(t)
	ctx := context.Background()
	f.password["10.0.0.21:623"] = "pw"
	if _, err := c.Enroll(ctx, enrollReq("m1", "10.0.0.21", "pw")); err != nil {
		t.Fatal(err)
	}
	calls := f.calls
	_, err := c.Enroll(ctx, enrollReq("m2", "10.0.0.21:623", "pw"))
	if !errors.Is(err, ErrAlreadyExists) || !strings.Contains(err.Error(), `"m1"`) {
		t.Fatalf("duplicate: %v", err)
	}
	if f.calls != calls {
		t.Fatal("the BMC was contacted for a duplicate address")
	}
	if _, err := inv.GetMachine(ctx, "m2"); !errors.Is(err, ErrNotFound) {
		t.Fatal("m2 created")
	}
	// Re-enrolling the same machine is fine; moving m1 to another BMC frees
	// the address for m2.
	if _, err := c.Enroll(ctx, enrollReq("m1", "10.0.0.21", "pw")); err != nil {
		t.Fatal(err)
	}
	f.password["10.0.0.22:623"] = "pw"
	if _, err := c.Enroll(ctx, enrollReq("m1", "10.0.0.22", "pw")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enroll(ctx, enrollReq("m2", "10.0.0.21", "pw")); err != nil {
		t.Fatalf("freed address refused: %v", err)
	}
	// A deleted machine's address is free again.
	if err := inv.DeleteMachine(ctx, "m2"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enroll(ctx, enrollReq("m3", "10.0.0.21", "pw")); err != nil {
		t.Fatalf("address of a deleted machine refused: %v", err)
	}
}

func TestEnrollConcurrentSameAddress(t *testing.T) {
	_, c, f := newBMCControl(t)
	f.password["10.0.0.30:623"] = "pw"
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok := 0
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Enroll(context.Background(), enrollReq(fmt.Sprintf("c%d", i), "10.0.0.30", "pw")); err == nil {
				mu.Lock()
				ok++
				mu.Unlock()
			} else if !errors.Is(err, ErrAlreadyExists) {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if ok != 1 {
		t.Fatalf("%d machines enrolled the same BMC", ok)
	}
}

func TestEnrollAttachesToKnownMachine(t *testing.T) {
	inv, c, f := newBMCControl(t)
	ctx := context.Background()
	m0, _, err := inv.EnsureMachineForMAC(ctx, "52:54:00:00:00:09")
	if err != nil {
		t.Fatal(err)
	}
	f.password["10.0.0.40:623"] = "pw"
	m, err := c.Enroll(ctx, enrollReq(m0.GetName(), "10.0.0.40", "pw"))
	if err != nil {
		t.Fatal(err)
	}
	if m.GetBootMac() != "52:54:00:00:00:09" || m.GetBmc().GetAddress() != "10.0.0.40" {
		t.Fatalf("%v", m)
	}
	// A MAC that belongs to another machine is refused.
	f.password["10.0.0.41:623"] = "pw"
	r := enrollReq("other", "10.0.0.41", "pw")
	r.BootMac = "52:54:00:00:00:09"
	if _, err := c.Enroll(ctx, r); !errors.Is(err, ErrAlreadyExists) {
		t.Fatalf("MAC of another machine: %v", err)
	}
}

func TestPollerSourceAndPowerChange(t *testing.T) {
	inv, c, f := newBMCControl(t)
	ctx := context.Background()
	f.password["10.0.0.50:623"] = "pw"
	r := enrollReq("p1", "10.0.0.50", "pw")
	r.BootMac = "52:54:00:00:00:50"
	if _, err := c.Enroll(ctx, r); err != nil {
		t.Fatal(err)
	}
	if _, err := inv.CreateMachine(ctx, &inventoryv1.Machine{Name: "nobmc"}); err != nil {
		t.Fatal(err)
	}
	names, err := c.PowerTargets(ctx)
	if err != nil || len(names) != 1 || names[0] != "p1" {
		t.Fatalf("targets %v %v", names, err)
	}
	f.power["10.0.0.50:623"] = inventoryv1.PowerState_POWER_STATE_ON // changed behind our back
	if err := c.RefreshPower(ctx, "p1"); err != nil {
		t.Fatal(err)
	}
	if err := c.RefreshPower(ctx, "p1"); err != nil { // no change: no new entry
		t.Fatal(err)
	}
	delete(f.password, "10.0.0.50:623") // BMC gone
	if err := c.RefreshPower(ctx, "p1"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("gone BMC: %v", err)
	}
	m, _ := inv.GetMachine(ctx, "p1")
	if m.GetPowerState() != inventoryv1.PowerState_POWER_STATE_UNKNOWN {
		t.Fatalf("state after failed read: %v", m.GetPowerState())
	}
	inv.FlushTimeline(ctx)
	es, _ := inv.Timeline(ctx, "p1", "", 0)
	var changes []string
	for _, e := range es {
		if e.GetEvent() == "power-changed" {
			changes = append(changes, e.GetDetail())
		}
	}
	if strings.Join(changes, ";") != "power off -> on;power on -> unknown" {
		t.Fatalf("power changes in timeline: %q", changes)
	}
}

func TestReconcileBMCAddress(t *testing.T) {
	inv, c, f := newBMCControl(t)
	ctx := context.Background()
	if _, err := inv.CreateMachine(ctx, &inventoryv1.Machine{Name: "r1", BootMac: "52:54:00:00:01:01"}); err != nil {
		t.Fatal(err)
	}
	m, err := inv.ReconcileBMCAddress(ctx, "r1", "10.0.1.1")
	if err != nil || m.GetBmc().GetAddress() != "10.0.1.1" || len(m.GetFlags()) != 0 {
		t.Fatalf("fill: %v %v", m, err)
	}
	f.password["10.0.1.2:623"] = "pw"
	if _, err := c.Enroll(ctx, enrollReq("r1", "10.0.1.2", "pw")); err != nil {
		t.Fatal(err)
	}
	m, _ = inv.GetMachine(ctx, "r1")
	if len(m.GetFlags()) != 1 || !strings.HasPrefix(m.GetFlags()[0], FlagBMCAddressMismatch) {
		t.Fatalf("enrolled elsewhere than in-band: flags %v", m.GetFlags())
	}
	m, _ = inv.ReconcileBMCAddress(ctx, "r1", "10.0.1.2")
	if len(m.GetFlags()) != 0 {
		t.Fatalf("match did not clear the flag: %v", m.GetFlags())
	}
	if _, err := inv.ReconcileBMCAddress(ctx, "r1", "bogus addr"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bogus in-band address: %v", err)
	}
}

func TestBMCRPCsWithoutControl(t *testing.T) {
	inv := newInv(t, Config{})
	s := &MachineServer{Inv: inv}
	_, err := s.GetPower(context.Background(), &inventoryv1.GetPowerRequest{Name: "x"})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("%v", err)
	}
}

func TestParseBMCAddress(t *testing.T) {
	for in, want := range map[string]string{
		"10.0.0.1":          "10.0.0.1:0",
		"10.0.0.1:6230":     "10.0.0.1:6230",
		"BMC-1.Example.org": "bmc-1.example.org:0",
		"[fe80::1]:623":     "fe80::1:623",
		"fe80::1":           "fe80::1:0",
		"[fe80::1]":         "fe80::1:0",
	} {
		h, p, err := ParseBMCAddress(in)
		if err != nil || fmt.Sprintf("%s:%d", h, p) != want {
			t.Errorf("%q: %s:%d %v, want %s", in, h, p, err, want)
		}
	}
	for _, in := range []string{"", ":623", "10.0.0.1:", "10.0.0.1:0", "a b", "user@host", "https://h", "0.0.0.0", "224.0.0.1", "-bad-", "h:p"} {
		if _, _, err := ParseBMCAddress(in); !errors.Is(err, ErrInvalid) {
			t.Errorf("%q accepted", in)
		}
	}
}

func FuzzParseBMCAddress(f *testing.F) {
	for _, s := range []string{"10.0.0.1", "10.0.0.1:623", "[fe80::1]:623", "fe80::1", "bmc.example.org:443", "", ":", "[", "a:b:c", "http://x/", "999.1.1.1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		host, port, err := ParseBMCAddress(s)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("%q: error %v is not ErrInvalid", s, err)
			}
			return
		}
		if host == "" || port > 65535 {
			t.Fatalf("%q: accepted as %q:%d", s, host, port)
		}
		// What was accepted parses again to the same thing.
		again := host
		if strings.Contains(host, ":") {
			again = "[" + host + "]"
		}
		if port != 0 {
			again += ":" + fmt.Sprint(port)
		}
		h2, p2, err := ParseBMCAddress(again)
		if err != nil || h2 != host || p2 != port {
			t.Fatalf("%q -> %q:%d -> %q:%d %v", s, host, port, h2, p2, err)
		}
	})
}

func TestForgetBMC(t *testing.T) {
	inv, c, f := newBMCControl(t)
	ctx := context.Background()
	f.password["10.0.2.1:623"] = "pw"
	m, err := c.Enroll(ctx, enrollReq("g1", "10.0.2.1", "pw"))
	if err != nil {
		t.Fatal(err)
	}
	if err := inv.DeleteMachine(ctx, "g1"); err != nil {
		t.Fatal(err)
	}
	inv.ForgetBMC(ctx, "g1", m.GetBmc())
	for _, k := range []string{bmcSecretPrefix + "g1", bmcKey("10.0.2.1", 623)} {
		if _, err := inv.cfg.Store.Get(ctx, k); err == nil {
			t.Errorf("%s left behind", k)
		}
	}
	inv.ForgetBMC(ctx, "g1", m.GetBmc()) // idempotent
}
