package bmc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/store/record"
	"github.com/corralhq/corral/testsupport/machinefacts"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fakeBMC is one or more BMCs keyed by host:port. A BMC with a cert is
// a Redfish BMC and checks its certificate like the real adapter: before
// the password.
type fakeBMC struct {
	mu       sync.Mutex
	password map[string]string // host:port -> password
	cert     map[string]string // host:port -> fingerprint presented (Redfish)
	power    map[string]inventoryv1.PowerState
	boots    []inventory.BootRequest
	actions  []inventoryv1.PowerAction
	calls    int
	// passwords counts the calls that got as far as the password.
	passwords int
}

func newFakeBMC() *fakeBMC {
	return &fakeBMC{password: map[string]string{}, cert: map[string]string{}, power: map[string]inventoryv1.PowerState{}}
}

func (f *fakeBMC) check(t Target) (Result, error) {
	f.calls++
	pw, ok := f.password[t.String()]
	if !ok {
		return Result{}, fmt.Errorf("%w: %s: no answer: %w", apierr.ErrUnavailable, t, context.DeadlineExceeded)
	}
	res := Result{Provider: "fake"}
	if cert, redfish := f.cert[t.String()]; redfish && t.Protocol != inventoryv1.BmcProtocol_BMC_PROTOCOL_IPMI {
		switch {
		case t.TLSInsecure, t.TLSFirstUse, t.TLSSHA256 == cert:
			res.Provider, res.TLSSHA256 = RedfishProviderName, cert
		case t.TLSSHA256 == "":
			return Result{}, &CertificateError{}
		default:
			return Result{TLSSHA256: cert}, &CertificateError{Pinned: t.TLSSHA256, Presented: cert}
		}
	}
	f.passwords++
	if pw != t.Password {
		return res, fmt.Errorf("%w: %s", ErrAuth, t)
	}
	return res, nil
}

func (f *fakeBMC) PowerState(ctx context.Context, t Target) (inventoryv1.PowerState, Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	res, err := f.check(t)
	if err != nil {
		return 0, res, err
	}
	st := f.power[t.String()]
	if st == 0 {
		st = inventoryv1.PowerState_POWER_STATE_OFF
	}
	return st, res, nil
}

func (f *fakeBMC) SetPower(ctx context.Context, t Target, a inventoryv1.PowerAction) (Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	res, err := f.check(t)
	if err != nil {
		return res, err
	}
	f.actions = append(f.actions, a)
	switch a {
	case inventoryv1.PowerAction_POWER_ACTION_OFF, inventoryv1.PowerAction_POWER_ACTION_SOFT_OFF:
		f.power[t.String()] = inventoryv1.PowerState_POWER_STATE_OFF
	default:
		f.power[t.String()] = inventoryv1.PowerState_POWER_STATE_ON
	}
	return res, nil
}

func (f *fakeBMC) SetBootDevice(ctx context.Context, t Target, b inventory.BootRequest) (Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	res, err := f.check(t)
	if err != nil {
		return res, err
	}
	f.boots = append(f.boots, b)
	return res, nil
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

// testInv is an inventory and its store.
type testInv struct {
	*inventory.Inventory
	st store.Store
}

func newBMCControl(t *testing.T) (testInv, *Service, *fakeBMC) {
	t.Helper()
	st := mem.New()
	inv, err := inventory.New(inventory.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- inv.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	f := newFakeBMC()
	c, err := New(Config{Machines: inv, Events: inv, Store: st, Driver: f, Sealer: xorSealer{}})
	if err != nil {
		t.Fatal(err)
	}
	inv.OnDelete(c.Forget)
	return testInv{inv, st}, c, f
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
	if _, err := record.Get(ctx, inv.st, bmcSecretPrefix+"m1", &sec); err != nil || bytes.Contains(sec.GetSealedPassword(), []byte("pw1")) {
		t.Fatalf("secret record: %v %q", err, sec.GetSealedPassword())
	}
	ps, err := c.SetPower(ctx, "m1", inventoryv1.PowerAction_POWER_ACTION_ON)
	if err != nil || ps.GetState() != inventoryv1.PowerState_POWER_STATE_ON || ps.GetProvider() != "fake" {
		t.Fatalf("power on: %v %v", ps, err)
	}
	if err := c.SetBootDevice(ctx, "m1", inventory.BootRequest{Device: inventoryv1.BootDevice_BOOT_DEVICE_PXE, EFI: true}); err != nil {
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
		"malformed address":    {enrollReq("m1", "http://10.0.0.1/", "pw"), apierr.ErrInvalid},
		"bad port":             {enrollReq("m1", "10.0.0.1:99999", "pw"), apierr.ErrInvalid},
		"garbage host":         {enrollReq("m1", "not a host!", "pw"), apierr.ErrInvalid},
		"bad ipv4":             {enrollReq("m1", "999.1.1.1", "pw"), apierr.ErrInvalid},
		"ipv6 without bracket": {enrollReq("m1", "fe80::1:623x", "pw"), apierr.ErrInvalid},
		"empty address":        {enrollReq("m1", "", "pw"), apierr.ErrInvalid},
		"no password":          {enrollReq("m1", "10.0.0.1", ""), apierr.ErrInvalid},
		"bad name":             {enrollReq("-x", "10.0.0.1", "pw"), apierr.ErrInvalid},
		"unsupported protocol": {&inventoryv1.EnrollMachineRequest{Name: "m1", BmcAddress: "10.0.0.1", BmcUsername: "u", BmcPassword: "p", BmcProtocol: 9}, apierr.ErrInvalid},
		"bad cipher":           {&inventoryv1.EnrollMachineRequest{Name: "m1", BmcAddress: "10.0.0.1", BmcUsername: "u", BmcPassword: "p", BmcCipherSuite: 18}, apierr.ErrInvalid},
		"wrong password":       {enrollReq("m1", "10.0.0.5", "nope"), ErrAuth},
		"unreachable":          {enrollReq("m1", "10.0.0.99", "pw"), apierr.ErrUnavailable},
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
			if tc.want == ErrAuth {
				if st := status.Code(apierr.ToStatus(err)); st != codes.FailedPrecondition || !strings.Contains(apierr.ToStatus(err).Error(), "authentication failed") {
					t.Fatalf("status %v", apierr.ToStatus(err))
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
	if !errors.Is(err, apierr.ErrAlreadyExists) || !strings.Contains(err.Error(), `"m1"`) {
		t.Fatalf("duplicate: %v", err)
	}
	if f.calls != calls {
		t.Fatal("the BMC was contacted for a duplicate address")
	}
	if _, err := inv.GetMachine(ctx, "m2"); !errors.Is(err, apierr.ErrNotFound) {
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
			} else if !errors.Is(err, apierr.ErrAlreadyExists) {
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
	if _, err := c.Enroll(ctx, r); !errors.Is(err, apierr.ErrAlreadyExists) {
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
	if err := c.RefreshPower(ctx, "p1"); !errors.Is(err, apierr.ErrUnavailable) {
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
	if len(m.GetFlags()) != 1 || !strings.HasPrefix(m.GetFlags()[0], inventory.FlagBMCAddressMismatch) {
		t.Fatalf("enrolled elsewhere than in-band: flags %v", m.GetFlags())
	}
	m, _ = inv.ReconcileBMCAddress(ctx, "r1", "10.0.1.2")
	if len(m.GetFlags()) != 0 {
		t.Fatalf("match did not clear the flag: %v", m.GetFlags())
	}
	if _, err := inv.ReconcileBMCAddress(ctx, "r1", "bogus addr"); !errors.Is(err, apierr.ErrInvalid) {
		t.Fatalf("bogus in-band address: %v", err)
	}
}

func TestForget(t *testing.T) {
	inv, c, f := newBMCControl(t)
	ctx := context.Background()
	f.password["10.0.2.1:623"] = "pw"
	m, err := c.Enroll(ctx, enrollReq("g1", "10.0.2.1", "pw"))
	if err != nil {
		t.Fatal(err)
	}
	if err := inv.DeleteMachine(ctx, "g1"); err != nil { // runs c.Forget
		t.Fatal(err)
	}
	for _, k := range []string{bmcSecretPrefix + "g1", inventory.BMCAddressKey("10.0.2.1", 623)} {
		if _, err := inv.st.Get(ctx, k); err == nil {
			t.Errorf("%s left behind", k)
		}
	}
	c.Forget(ctx, m) // idempotent
}

// Fingerprints the fake Redfish BMCs present.
var (
	certA = strings.Repeat("a1", 32)
	certB = strings.Repeat("b2", 32)
)

func redfishReq(name, addr, pw string) *inventoryv1.EnrollMachineRequest {
	r := enrollReq(name, addr, pw)
	r.BmcProtocol = inventoryv1.BmcProtocol_BMC_PROTOCOL_REDFISH
	return r
}

// storeKeys lists every key in the store (to prove a refusal wrote
// nothing).
func storeKeys(t *testing.T, inv testInv) []string {
	t.Helper()
	kvs, err := inv.st.List(context.Background(), "/")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, kv := range kvs {
		keys = append(keys, kv.Key)
	}
	return keys
}

func TestEnrollRedfishCertificate(t *testing.T) {
	ctx := context.Background()
	const addr = "10.0.3.1:443"
	for name, tc := range map[string]struct {
		mutate     func(r *inventoryv1.EnrollMachineRequest)
		want       error  // nil: enrolled
		wantPin    string // the stored pin
		insecure   bool
		wantDetail string // in the enrolled timeline entry
		passwords  int    // calls that reached the password
		noTLS      bool   // the BMC answers IPMI only
	}{
		"first use pins the presented certificate": {wantPin: certA, wantDetail: "pinned (trust on first use)", passwords: 1},
		"given pin that matches": {mutate: func(r *inventoryv1.EnrollMachineRequest) { r.BmcTlsSha256 = certA },
			wantPin: certA, wantDetail: "pinned as given", passwords: 1},
		"given pin as openssl prints it": {mutate: func(r *inventoryv1.EnrollMachineRequest) {
			r.BmcTlsSha256 = strings.ToUpper(strings.TrimSuffix(strings.Repeat("a1:", 32), ":"))
		}, wantPin: certA, passwords: 1},
		"given pin that differs is refused before the password": {mutate: func(r *inventoryv1.EnrollMachineRequest) { r.BmcTlsSha256 = certB },
			want: ErrCertificate},
		"insecure": {mutate: func(r *inventoryv1.EnrollMachineRequest) { r.BmcInsecure = true },
			insecure: true, wantDetail: "certificate not verified (--bmc-insecure)", passwords: 1},
		"auto pins a Redfish answer": {mutate: func(r *inventoryv1.EnrollMachineRequest) { r.BmcProtocol = inventoryv1.BmcProtocol_BMC_PROTOCOL_AUTO },
			wantPin: certA, passwords: 1},
		"insecure and a pin": {mutate: func(r *inventoryv1.EnrollMachineRequest) { r.BmcInsecure, r.BmcTlsSha256 = true, certA },
			want: apierr.ErrInvalid},
		"pin for IPMI": {mutate: func(r *inventoryv1.EnrollMachineRequest) {
			r.BmcProtocol, r.BmcTlsSha256 = inventoryv1.BmcProtocol_BMC_PROTOCOL_IPMI, certA
		}, want: apierr.ErrInvalid},
		"insecure for IPMI": {mutate: func(r *inventoryv1.EnrollMachineRequest) {
			r.BmcProtocol, r.BmcInsecure = inventoryv1.BmcProtocol_BMC_PROTOCOL_IPMI, true
		}, want: apierr.ErrInvalid},
		"malformed pin": {mutate: func(r *inventoryv1.EnrollMachineRequest) { r.BmcTlsSha256 = "sha256:" + certA }, want: apierr.ErrInvalid},
		"auto pins nothing for an IPMI answer": {mutate: func(r *inventoryv1.EnrollMachineRequest) { r.BmcProtocol = inventoryv1.BmcProtocol_BMC_PROTOCOL_AUTO },
			noTLS: true, passwords: 1},
		"a pin for a BMC that answers IPMI under auto": {mutate: func(r *inventoryv1.EnrollMachineRequest) {
			r.BmcProtocol, r.BmcTlsSha256 = inventoryv1.BmcProtocol_BMC_PROTOCOL_AUTO, certA
		}, noTLS: true, want: apierr.ErrPrecondition, passwords: 1},
		"wrong password after a good certificate": {mutate: func(r *inventoryv1.EnrollMachineRequest) { r.BmcPassword = "nope" },
			want: ErrAuth, passwords: 1},
	} {
		t.Run(name, func(t *testing.T) {
			inv, c, f := newBMCControl(t)
			f.password[addr], f.cert[addr] = "pw", certA
			if tc.noTLS {
				delete(f.cert, addr)
			}
			req := redfishReq("rf1", addr, "pw")
			req.BootMac = "52:54:00:00:03:01"
			if tc.mutate != nil {
				tc.mutate(req)
			}
			before := storeKeys(t, inv)
			m, err := c.Enroll(ctx, req)
			if f.passwords != tc.passwords {
				t.Errorf("%d calls reached the password, want %d", f.passwords, tc.passwords)
			}
			if tc.want != nil {
				if !errors.Is(err, tc.want) {
					t.Fatalf("want %v, got %v", tc.want, err)
				}
				if diff := cmp.Diff(before, storeKeys(t, inv)); diff != "" {
					t.Fatalf("a refused enroll wrote to the store (-before +after):\n%s", diff)
				}
				if tc.want == ErrCertificate {
					st := apierr.ToStatus(err)
					if status.Code(st) != codes.FailedPrecondition || !strings.Contains(st.Error(), "presents certificate sha256 "+certA+", not the "+certB) {
						t.Fatalf("status: %v", st)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := m.GetBmc(); got.GetTlsSha256() != tc.wantPin || got.GetTlsInsecure() != tc.insecure {
				t.Fatalf("bmc: pin %q insecure %t, want %q %t", got.GetTlsSha256(), got.GetTlsInsecure(), tc.wantPin, tc.insecure)
			}
			if tc.wantDetail != "" {
				inv.FlushTimeline(ctx)
				es, _ := inv.Timeline(ctx, "rf1", "", 0)
				if len(es) == 0 || !strings.Contains(es[len(es)-1].GetDetail(), tc.wantDetail) {
					t.Fatalf("timeline: %v", es)
				}
			}
		})
	}
}

// TestBMCCertificateChanged: once pinned, a BMC presenting another
// certificate is refused by every call with the clear error, flagged
// once, and the pin survives enrolling again without a new one.
func TestBMCCertificateChanged(t *testing.T) {
	inv, c, f := newBMCControl(t)
	ctx := context.Background()
	const addr = "10.0.3.2:443"
	f.password[addr], f.cert[addr] = "pw", certA
	req := redfishReq("rf2", addr, "pw")
	req.BootMac = "52:54:00:00:03:02"
	if _, err := c.Enroll(ctx, req); err != nil {
		t.Fatal(err)
	}
	f.cert[addr] = certB // replaced BMC, or someone in the middle
	passwords := f.passwords
	wantMsg := "BMC certificate changed: pinned sha256 " + certA + ", presented " + certB + "; re-enroll with --bmc-tls-sha256 " + certB + " if this is expected"
	calls := map[string]func() error{
		"power status": func() error { _, err := c.GetPower(ctx, "rf2"); return err },
		"power on":     func() error { _, err := c.SetPower(ctx, "rf2", inventoryv1.PowerAction_POWER_ACTION_ON); return err },
		"boot device": func() error {
			return c.SetBootDevice(ctx, "rf2", inventory.BootRequest{Device: inventoryv1.BootDevice_BOOT_DEVICE_PXE})
		},
		"poller": func() error { return c.RefreshPower(ctx, "rf2") },
	}
	for name, call := range calls {
		err := call()
		if !errors.Is(err, ErrCertificate) || !strings.Contains(err.Error(), wantMsg) || status.Code(apierr.ToStatus(err)) != codes.FailedPrecondition {
			t.Errorf("%s: %v", name, err)
		}
	}
	if f.passwords != passwords || len(f.actions) != 0 || len(f.boots) != 0 {
		t.Fatalf("a BMC with a changed certificate got the password (%d) or was acted on (%v %v)", f.passwords-passwords, f.actions, f.boots)
	}
	m, _ := inv.GetMachine(ctx, "rf2")
	if diff := cmp.Diff([]string{FlagCertificateChanged + ": pinned sha256 " + certA + ", presented " + certB}, m.GetFlags()); diff != "" {
		t.Fatalf("flags (-want +got):\n%s", diff)
	}
	// Enrolling again without a pin keeps the old one: refused the same way.
	if _, err := c.Enroll(ctx, req); !errors.Is(err, ErrCertificate) || !strings.Contains(err.Error(), wantMsg) {
		t.Fatalf("re-enroll without the new pin: %v", err)
	}
	// The certificate comes back: the flag goes.
	f.cert[addr] = certA
	if _, err := c.GetPower(ctx, "rf2"); err != nil {
		t.Fatal(err)
	}
	if m, _ := inv.GetMachine(ctx, "rf2"); len(m.GetFlags()) != 0 {
		t.Fatalf("flags after the pinned certificate is back: %v", m.GetFlags())
	}
	// A new certificate, accepted by enrolling with it.
	f.cert[addr] = certB
	_ = c.RefreshPower(ctx, "rf2")
	r2 := redfishReq("rf2", addr, "pw")
	r2.BmcTlsSha256 = certB
	m, err := c.Enroll(ctx, r2)
	if err != nil || m.GetBmc().GetTlsSha256() != certB || len(m.GetFlags()) != 0 {
		t.Fatalf("re-enroll with the new pin: %v %v", m, err)
	}
	if _, err := c.GetPower(ctx, "rf2"); err != nil {
		t.Fatal(err)
	}
	// The timeline has one entry per change, not one per refused call.
	inv.FlushTimeline(ctx)
	es, _ := inv.Timeline(ctx, "rf2", "", 0)
	var got []string
	for _, e := range es {
		if strings.HasPrefix(e.GetEvent(), "bmc-certificate") {
			got = append(got, e.GetEvent())
		}
	}
	if diff := cmp.Diff([]string{FlagCertificateChanged, "bmc-certificate-restored", FlagCertificateChanged}, got); diff != "" {
		t.Fatalf("certificate events (-want +got):\n%s", diff)
	}
}

// TestBMCUnpinnedRedfishRefused: a Redfish BMC enrolled before pinning
// (no pin, not insecure) is refused before the password is opened or
// the BMC contacted, with the way out in the message; IPMI BMCs under
// auto are not affected.
func TestBMCUnpinnedRedfishRefused(t *testing.T) {
	ctx := context.Background()
	for name, tc := range map[string]struct {
		protocol inventoryv1.BmcProtocol
		provider string
		refused  bool
	}{
		"redfish":                {inventoryv1.BmcProtocol_BMC_PROTOCOL_REDFISH, RedfishProviderName, true},
		"auto, redfish answered": {inventoryv1.BmcProtocol_BMC_PROTOCOL_AUTO, RedfishProviderName, true},
		"auto, ipmi answered":    {inventoryv1.BmcProtocol_BMC_PROTOCOL_AUTO, "native-ipmi", false},
	} {
		t.Run(name, func(t *testing.T) {
			inv, c, f := newBMCControl(t)
			const addr = "10.0.3.3:443"
			f.password[addr] = "pw"
			if _, err := c.Enroll(ctx, enrollReq("old", addr, "pw")); err != nil {
				t.Fatal(err)
			}
			// What a record written before pinning looks like.
			if _, err := inv.UpdateMachine(ctx, "old", func(m *inventoryv1.Machine) error {
				m.Bmc.Protocol, m.Bmc.Provider, m.Bmc.TlsSha256 = tc.protocol, tc.provider, ""
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			calls := f.calls
			_, err := c.GetPower(ctx, "old")
			if !tc.refused {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrCertificate) || !strings.Contains(err.Error(), "no pinned certificate") || !strings.Contains(err.Error(), "enroll the machine again") {
				t.Fatalf("unpinned: %v", err)
			}
			if f.calls != calls {
				t.Fatal("the BMC was contacted")
			}
		})
	}
}

func TestParseTLSFingerprint(t *testing.T) {
	for name, tc := range map[string]struct{ in, want string }{
		"lower":      {certA, certA},
		"upper":      {strings.ToUpper(certA), certA},
		"colons":     {strings.TrimSuffix(strings.Repeat("A1:", 32), ":"), certA},
		"spaces":     {" " + certA + "\n", certA},
		"short":      {certA[:62], ""},
		"long":       {certA + "00", ""},
		"not hex":    {strings.Repeat("zz", 32), ""},
		"odd colons": {"a:1" + strings.Repeat(":a1", 31), ""},
		"prefixed":   {"sha256:" + certA, ""},
		"empty":      {"", ""},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := ParseTLSFingerprint(tc.in)
			if got != tc.want || (tc.want == "") != errors.Is(err, apierr.ErrInvalid) {
				t.Fatalf("ParseTLSFingerprint(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
		})
	}
}

// TestRegisterFindsEnrolledMachineByInbandBMC: a machine enrolled by its
// BMC before it ever booted is not claimed by a report that merely states
// the BMC's address (anyone can): the report is parked naming it, and
// once an operator adopts it the machine has the report's identity and
// boot MAC, and DHCP's placeholder and the parked record are gone.
func TestRegisterFindsEnrolledMachineByInbandBMC(t *testing.T) {
	inv, c, f := newBMCControl(t)
	ctx := context.Background()
	f.password["10.0.0.21:623"] = "pw"
	if _, err := c.Enroll(ctx, enrollReq("rack1-u12", "10.0.0.21", "pw")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := inv.EnsureMachineForMAC(ctx, "52:54:00:00:08:01"); err != nil {
		t.Fatal(err)
	}
	fs := machinefacts.QEMU("SN-U12", "", "52:54:00:00:08:01")
	fs.Bmc = &inventoryv1.Facts_BmcLan{Channel: 1, Ipv4Address: "10.0.0.21"}
	_, err := inv.Register(ctx, "52:54:00:00:08:01", fs, inventory.RegisterOptions{})
	if !errors.Is(err, inventory.ErrParked) || !strings.Contains(err.Error(), "rack1-u12") {
		t.Fatalf("a report stating an enrolled BMC's address = %v; want parked naming rack1-u12", err)
	}
	if enrolled, _ := inv.GetMachine(ctx, "rack1-u12"); enrolled.GetSerial() != "" || enrolled.GetBootMac() != "" {
		t.Fatalf("the enrolled machine took the claim: %v", enrolled)
	}
	if _, err := inv.AdoptMachine(ctx, inventory.ConflictName("52:54:00:00:08:01"), false); err != nil {
		t.Fatal(err)
	}
	m, err := inv.Register(ctx, "52:54:00:00:08:01", fs, inventory.RegisterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if m.GetName() != "rack1-u12" || m.GetSerial() != "SN-U12" || !hasMAC(m, "52:54:00:00:08:01") {
		t.Fatalf("report landed on %s (serial %q, macs %v), want rack1-u12", m.GetName(), m.GetSerial(), m.GetMacs())
	}
	if ms, _ := inv.ListMachines(ctx, &inventoryv1.ListMachinesRequest{}); len(ms) != 1 {
		t.Fatalf("%d machines, want 1 (placeholder and parked record merged)", len(ms))
	}
	// Deleting the machine frees its BMC address for another enrolment.
	if err := inv.DeleteMachine(ctx, "rack1-u12"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enroll(ctx, enrollReq("rack1-u13", "10.0.0.21", "pw")); err != nil {
		t.Fatalf("BMC address not freed by delete: %v", err)
	}
}
