package inventory

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/testsupport/machinefacts"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
)

// facts is the report of a small QEMU machine.
var facts = machinefacts.QEMU

func TestRegisterSerialFirstAndNICSwap(t *testing.T) {
	inv := newInv(t, Config{})
	ctx := context.Background()
	// DHCP saw the MAC first: a placeholder machine exists.
	stub, _, err := inv.EnsureMachineForMAC(ctx, "52:54:00:00:00:01")
	if err != nil {
		t.Fatal(err)
	}
	m, err := inv.Register(ctx, "52:54:00:00:00:01", facts("SN-1", "6a1c0f3e-1111-4a5b-9c2d-000000000001", "52:54:00:00:00:01"), RegisterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if m.GetName() != stub.GetName() || m.GetState() != inventoryv1.Machine_INVENTORIED || m.GetBootIntent() != inventoryv1.BootIntent_BOOT_INTENT_LOCAL {
		t.Fatalf("after first register: %v %v %v", m.GetName(), m.GetState(), m.GetBootIntent())
	}
	if m.GetSerial() != "SN-1" || len(m.GetFactHistory()) != 0 {
		t.Fatalf("serial %q history %d", m.GetSerial(), len(m.GetFactHistory()))
	}
	// Same machine boots from a swapped NIC (new MAC); DHCP made a new
	// stub. Its serial is no proof: the report is parked until an
	// operator adopts it.
	if _, _, err := inv.EnsureMachineForMAC(ctx, "52:54:00:00:00:99"); err != nil {
		t.Fatal(err)
	}
	swapped := facts("SN-1", "6a1c0f3e-1111-4a5b-9c2d-000000000001", "52:54:00:00:00:99")
	if _, err := inv.Register(ctx, "52:54:00:00:00:99", swapped, RegisterOptions{}); !errors.Is(err, ErrParked) || !errors.Is(err, apierr.ErrPermissionDenied) {
		t.Fatalf("report from a new NIC = %v, want ErrParked", err)
	}
	parked, err := inv.GetMachine(ctx, ConflictName("52:54:00:00:00:99"))
	if err != nil || parked.GetState() != inventoryv1.Machine_CONFLICT || parked.GetConflict().GetMachine() != m.GetName() {
		t.Fatalf("parked record: %v (%v)", parked, err)
	}
	if _, err := inv.AdoptMachine(ctx, parked.GetName(), false); err != nil {
		t.Fatal(err)
	}
	m2, err := inv.Register(ctx, "52:54:00:00:00:99", swapped, RegisterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if m2.GetName() != m.GetName() {
		t.Fatalf("NIC swap made a new machine %s (want %s)", m2.GetName(), m.GetName())
	}
	all, _ := inv.ListMachines(ctx, &inventoryv1.ListMachinesRequest{})
	if len(all) != 1 {
		t.Fatalf("%d machines after NIC swap, want 1 (stub and parked record merged)", len(all))
	}
	var nicChanges []string
	for _, c := range m2.GetFactHistory() {
		if strings.HasPrefix(c.GetPath(), "nic[") {
			nicChanges = append(nicChanges, c.GetPath())
		}
	}
	if len(nicChanges) != 2 {
		t.Fatalf("history should note the NIC swap (one gone, one new): %v", m2.GetFactHistory())
	}
	if got, err := inv.MachineByMAC(ctx, "52:54:00:00:00:99"); err != nil || got.GetName() != m.GetName() {
		t.Fatalf("new MAC not bound: %v %v", got, err)
	}
}

// TestRegisterFromAListedNIC: a machine that booted from one NIC and
// listed two is recognised, with no operator, when it boots from the
// other: the report comes from a MAC its own report listed.
func TestRegisterFromAListedNIC(t *testing.T) {
	inv := newInv(t, Config{})
	ctx := context.Background()
	f := facts("SN-2NIC", "", "52:54:00:00:0c:01", "52:54:00:00:0c:02")
	m, err := inv.Register(ctx, "52:54:00:00:0c:01", f, RegisterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inv.MachineByMAC(ctx, "52:54:00:00:0c:02"); !errors.Is(err, apierr.ErrNotFound) {
		t.Fatalf("a listed, unconfirmed MAC was bound at Register: %v", err)
	}
	m2, err := inv.Register(ctx, "52:54:00:00:0c:02", f, RegisterOptions{})
	if err != nil || m2.GetName() != m.GetName() || m2.GetBootMac() != "52:54:00:00:0c:02" {
		t.Fatalf("report from the second NIC = %v, %v", m2.GetName(), err)
	}
}

func TestRegisterPlaceholderSerialUsesUUIDThenMAC(t *testing.T) {
	inv := newInv(t, Config{})
	ctx := context.Background()
	a, err := inv.Register(ctx, "52:54:00:00:01:01", facts("To Be Filled By O.E.M.", "00000000-0000-0000-0000-000000000000", "52:54:00:00:01:01"), RegisterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := inv.Register(ctx, "52:54:00:00:01:02", facts("Default string", "03000200-0400-0500-0006-000700080009", "52:54:00:00:01:02"), RegisterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a.GetName() == b.GetName() || a.GetSerial() != "" || b.GetSerial() != "" {
		t.Fatalf("placeholder serials merged machines or were stored: %s %s %q %q", a.GetName(), b.GetName(), a.GetSerial(), b.GetSerial())
	}
	// A UUID identifies even when the serial is a placeholder: a second
	// report of it from a MAC the machine never listed is parked.
	c1, err := inv.Register(ctx, "52:54:00:00:02:01", facts("0123456789", "11111111-2222-3333-4444-555555555555", "52:54:00:00:02:01"), RegisterOptions{})
	if err != nil || c1.GetSystemUuid() == "" {
		t.Fatalf("first report: %v %v", c1, err)
	}
	_, err = inv.Register(ctx, "52:54:00:00:02:02", facts("0123456789", "11111111-2222-3333-4444-555555555555", "52:54:00:00:02:02"), RegisterOptions{})
	if !errors.Is(err, ErrParked) || !strings.Contains(err.Error(), "its uuid names machine "+c1.GetName()) {
		t.Fatalf("same UUID from an unknown MAC = %v, want parked naming %s", err, c1.GetName())
	}
}

// TestRegisterDuplicateSerialFlagged: a second machine reporting a known
// serial with another UUID is parked; adopted as a machine of its own,
// both carry the duplicate-serial flag.
func TestRegisterDuplicateSerialFlagged(t *testing.T) {
	inv := newInv(t, Config{})
	ctx := context.Background()
	a, _ := inv.Register(ctx, "52:54:00:00:03:01", facts("SN-DUP", "aaaaaaaa-0000-4000-8000-000000000001", "52:54:00:00:03:01"), RegisterOptions{})
	_, err := inv.Register(ctx, "52:54:00:00:03:02", facts("SN-DUP", "bbbbbbbb-0000-4000-8000-000000000002", "52:54:00:00:03:02"), RegisterOptions{})
	if !errors.Is(err, ErrParked) {
		t.Fatalf("a known serial with another UUID = %v, want parked", err)
	}
	b, err := inv.AdoptMachine(ctx, ConflictName("52:54:00:00:03:02"), true)
	if err != nil {
		t.Fatal(err)
	}
	if a.GetName() == b.GetName() || b.GetName() != MachineNameForMAC("52:54:00:00:03:02") || b.GetState() != inventoryv1.Machine_INVENTORIED {
		t.Fatalf("adopted as %s (%s); want its own machine %s", b.GetName(), b.GetState(), MachineNameForMAC("52:54:00:00:03:02"))
	}
	a, _ = inv.GetMachine(ctx, a.GetName())
	for _, m := range []*inventoryv1.Machine{a, b} {
		if len(m.GetFlags()) == 0 || !strings.HasPrefix(m.GetFlags()[0], FlagDuplicateSerial) {
			t.Errorf("%s not flagged: %v", m.GetName(), m.GetFlags())
		}
	}
	// The adopted machine's next report lands on it.
	if m, err := inv.Register(ctx, "52:54:00:00:03:02", facts("SN-DUP", "bbbbbbbb-0000-4000-8000-000000000002", "52:54:00:00:03:02"), RegisterOptions{}); err != nil || m.GetName() != b.GetName() {
		t.Fatalf("next report = %v, %v", m.GetName(), err)
	}
}

func TestRegisterFactHistory(t *testing.T) {
	inv := newInv(t, Config{})
	ctx := context.Background()
	f := facts("SN-H", "", "52:54:00:00:04:01")
	inv.Register(ctx, "52:54:00:00:04:01", f, RegisterOptions{})
	f2 := proto.CloneOf(f)
	f2.Memory.Dimms = append(f2.Memory.Dimms, &inventoryv1.Facts_Dimm{Locator: "DIMM 1", SizeBytes: 2 << 30, Serial: "D1"})
	f2.Memory.TotalBytes = 4 << 30
	f2.Disks = f2.Disks[:1]
	m, err := inv.Register(ctx, "52:54:00:00:04:01", f2, RegisterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	paths := map[string]bool{}
	for _, c := range m.GetFactHistory() {
		paths[c.GetPath()] = true
		if c.GetAt() == nil {
			t.Error("change without a date")
		}
	}
	for _, want := range []string{"memory.dimm_count", "memory.total_bytes", "disk[DISK-B]", "dimm[D1]"} {
		if !paths[want] {
			t.Errorf("history lacks %s: %v", want, paths)
		}
	}
}

func TestRegisterBadInputStoresNothing(t *testing.T) {
	inv := newInv(t, Config{})
	ctx := context.Background()
	big := facts("SN", "", "52:54:00:00:05:01")
	big.System.Vendor = strings.Repeat("x", MaxFactString+1)
	manyDisks := facts("SN", "")
	for range MaxDisks + 1 {
		manyDisks.Disks = append(manyDisks.Disks, &inventoryv1.Facts_Disk{Name: "d"})
	}
	badUTF8 := facts("SN", "")
	badUTF8.Cpu.Model = "\xff\xfe"
	badNIC := facts("SN", "", "not-a-mac")
	cases := map[string]struct {
		mac string
		f   *inventoryv1.Facts
	}{
		"bad boot mac":   {"zz", facts("SN", "")},
		"nil facts":      {"52:54:00:00:05:01", nil},
		"long string":    {"52:54:00:00:05:01", big},
		"too many disks": {"52:54:00:00:05:01", manyDisks},
		"bad utf8":       {"52:54:00:00:05:01", badUTF8},
		"bad nic mac":    {"52:54:00:00:05:01", badNIC},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := inv.Register(ctx, tc.mac, tc.f, RegisterOptions{}); !errors.Is(err, apierr.ErrInvalid) {
				t.Fatalf("want apierr.ErrInvalid, got %v", err)
			}
		})
	}
	if ms, _ := inv.ListMachines(ctx, &inventoryv1.ListMachinesRequest{}); len(ms) != 0 {
		t.Fatalf("bad input stored %d machines", len(ms))
	}
}

func TestSelectors(t *testing.T) {
	inv := newInv(t, Config{})
	ctx := context.Background()
	inv.Register(ctx, "52:54:00:00:06:01", facts("S1", "", "52:54:00:00:06:01"), RegisterOptions{})
	f := facts("S2", "", "52:54:00:00:06:02")
	f.System.Vendor = "Dell Inc."
	f.Memory.TotalBytes = 64 << 30
	f.Disks = f.Disks[:1]
	inv.Register(ctx, "52:54:00:00:06:02", f, RegisterOptions{})
	cases := map[string]struct {
		sel  []string
		want []string
	}{
		"memory":     {[]string{"memory_bytes>=64Gi"}, []string{"S2"}},
		"disks":      {[]string{"disk.count>=2"}, []string{"S1"}},
		"vendor":     {[]string{"vendor=dell inc."}, []string{"S2"}},
		"vendor not": {[]string{"vendor!=Dell Inc."}, []string{"S1"}},
		"combined":   {[]string{"disk.count<2", "memory_bytes>60G"}, []string{"S2"}},
		"none":       {[]string{"cpu.threads>64"}, nil},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ms, err := inv.ListMachines(ctx, &inventoryv1.ListMachinesRequest{Selectors: tc.sel})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, m := range ms {
				got = append(got, m.GetSerial())
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("got %v want %v", got, tc.want)
			}
		})
	}
	for _, bad := range []string{"memory_bytes>=lots", "vendor>Dell", "nokey=1", "justtext", "memory_bytes>=-1"} {
		if _, err := inv.ListMachines(ctx, &inventoryv1.ListMachinesRequest{Selectors: []string{bad}}); !errors.Is(err, apierr.ErrInvalid) {
			t.Errorf("selector %q: want apierr.ErrInvalid, got %v", bad, err)
		}
	}
}

func FuzzRegister(f *testing.F) {
	f.Add("52:54:00:00:07:01", "SN", "uuid", "vda", uint64(1<<30))
	f.Add("zz", "", "", "", uint64(0))
	f.Add("52:54:00:00:07:01", "To Be Filled By O.E.M.", "00000000-0000-0000-0000-000000000000", "\xff", uint64(1))
	f.Fuzz(func(t *testing.T, mac, serial, uuid, disk string, size uint64) {
		inv, err := New(Config{Store: memStore()})
		if err != nil {
			t.Fatal(err)
		}
		fs := facts(serial, uuid, mac)
		fs.Disks = append(fs.Disks, &inventoryv1.Facts_Disk{Name: disk, SizeBytes: size})
		m, err := inv.Register(context.Background(), mac, fs, RegisterOptions{})
		if err != nil {
			if !errors.Is(err, apierr.ErrInvalid) {
				t.Fatalf("unexpected error class: %v", err)
			}
			if ms, _ := inv.ListMachines(context.Background(), &inventoryv1.ListMachinesRequest{}); len(ms) != 0 {
				t.Fatal("invalid report stored a machine")
			}
			return
		}
		if m.GetState() != inventoryv1.Machine_INVENTORIED {
			t.Fatalf("state %v", m.GetState())
		}
	})
}

// TestRegisterNeverTakesOverAKnownMachine: a report from a known machine's
// MAC that lacks or contradicts its recorded serial or system UUID is
// refused with PermissionDenied naming the machine, recorded on its
// timeline, and the machine's record is left exactly as it was; a report
// that only borrows its MAC as a NIC becomes a separate, flagged machine.
func TestRegisterNeverTakesOverAKnownMachine(t *testing.T) {
	const (
		victimMAC  = "52:54:00:00:09:01"
		victimSN   = "SN-VICTIM"
		victimUUID = "6a1c0f3e-9999-4a5b-9c2d-000000000001"
		otherMAC   = "52:54:00:00:09:02"
	)
	cases := map[string]struct {
		boot    string
		f       *inventoryv1.Facts
		refused string // substring of the error; "" = admitted as another machine
	}{
		"no serial and no uuid":            {boot: victimMAC, f: facts("", "", victimMAC), refused: "carries no"},
		"placeholder identity":             {boot: victimMAC, f: facts("To Be Filled By O.E.M.", "00000000-0000-0000-0000-000000000000", victimMAC), refused: "carries no"},
		"another serial":                   {boot: victimMAC, f: facts("SN-ATTACKER", "", victimMAC), refused: `serial "SN-ATTACKER" is not the recorded "SN-VICTIM"`},
		"another serial and uuid":          {boot: victimMAC, f: facts("SN-ATTACKER", "11111111-2222-4333-8444-555555555555", victimMAC), refused: "is not the recorded"},
		"right serial wrong uuid":          {boot: victimMAC, f: facts(victimSN, "11111111-2222-4333-8444-555555555555", victimMAC), refused: `system UUID "11111111-2222-4333-8444-555555555555" is not the recorded`},
		"victim mac as a nic":              {boot: otherMAC, f: facts("", "", otherMAC, victimMAC)},
		"victim mac as nic, own serial":    {boot: otherMAC, f: facts("SN-OTHER", "", otherMAC, victimMAC)},
		"victim serial from another mac":   {boot: otherMAC, f: facts(victimSN, "", otherMAC), refused: "carries no system UUID"},
		"victim identity from another mac": {boot: otherMAC, f: facts(victimSN, victimUUID, otherMAC, victimMAC), refused: "which neither boots from"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			inv := newInv(t, Config{})
			ctx := context.Background()
			victim, err := inv.Register(ctx, victimMAC, facts(victimSN, victimUUID, victimMAC), RegisterOptions{})
			if err != nil {
				t.Fatal(err)
			}
			before, _ := inv.GetMachine(ctx, victim.GetName())
			admitted := false
			m, err := inv.Register(ctx, tc.boot, tc.f, RegisterOptions{
				Admit: func(Match) error { admitted = true; return nil },
			})
			after, _ := inv.GetMachine(ctx, victim.GetName())
			if diff := cmp.Diff(before, after, protocmp.Transform()); diff != "" {
				t.Errorf("victim record changed (-before +after):\n%s", diff)
			}
			if tc.refused != "" {
				if !errors.Is(err, ErrParked) || !errors.Is(err, apierr.ErrPermissionDenied) || !strings.Contains(err.Error(), tc.refused) || !strings.Contains(err.Error(), victim.GetName()) {
					t.Fatalf("Register = %v, %v; want parked (PermissionDenied) naming %s and %q", m.GetName(), err, victim.GetName(), tc.refused)
				}
				parked, err := inv.GetMachine(ctx, ConflictName(tc.boot))
				if err != nil || parked.GetState() != inventoryv1.Machine_CONFLICT || parked.GetConflict().GetMachine() != victim.GetName() {
					t.Fatalf("parked record = %v, %v", parked, err)
				}
				if owner, err := inv.MachineByMAC(ctx, victimMAC); err != nil || owner.GetName() != victim.GetName() {
					t.Fatalf("the victim's MAC now boots %v (%v)", owner.GetName(), err)
				}
				if admitted {
					t.Error("a refused report reached Admit")
				}
				if err := inv.FlushTimeline(ctx); err != nil {
					t.Fatal(err)
				}
				es, _ := inv.Timeline(ctx, victim.GetName(), "", 0)
				if !hasEvent(es, "register-conflict", tc.refused) {
					t.Errorf("no register-conflict entry on the victim's timeline: %v", es)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if m.GetName() == victim.GetName() || hasMAC(m, victimMAC) {
				t.Fatalf("report landed on %s with MACs %v", m.GetName(), m.GetMacs())
			}
			if owner, err := inv.MachineByMAC(ctx, victimMAC); err != nil || owner.GetName() != victim.GetName() {
				t.Errorf("the victim's MAC now boots %v (%v)", owner.GetName(), err)
			}
		})
	}
}

// TestRegisterAdmitRefusesBeforeWriting: an Admit error leaves the store as
// it was (not even the duplicate-serial flag of the other machine).
func TestRegisterAdmitRefusesBeforeWriting(t *testing.T) {
	st := mem.New()
	inv := newInv(t, Config{Store: st})
	ctx := context.Background()
	if _, err := inv.Register(ctx, "52:54:00:00:0a:01", facts("SN-DUP", "aaaaaaaa-0000-4000-8000-000000000001", "52:54:00:00:0a:01"), RegisterOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := inv.FlushTimeline(ctx); err != nil {
		t.Fatal(err)
	}
	before, _ := st.List(ctx, "/inventory/")
	no := errors.New("no")
	var got Match
	_, err := inv.Register(ctx, "52:54:00:00:0a:02", facts("SN-NEW", "bbbbbbbb-0000-4000-8000-000000000002", "52:54:00:00:0a:02"), RegisterOptions{
		Admit: func(m Match) error { got = m; return no },
	})
	if !errors.Is(err, no) {
		t.Fatalf("Register = %v; want Admit's error", err)
	}
	if got.By != "new" || got.Machine != nil || got.Name != MachineNameForMAC("52:54:00:00:0a:02") || !got.Identified {
		t.Errorf("Admit saw %+v", got)
	}
	after, _ := st.List(ctx, "/inventory/")
	var b, a []string
	for _, kv := range before {
		b = append(b, fmt.Sprint(kv.Key, kv.Revision))
	}
	for _, kv := range after {
		a = append(a, fmt.Sprint(kv.Key, kv.Revision))
	}
	if diff := cmp.Diff(b, a); diff != "" {
		t.Errorf("store changed by a refused report (-before +after):\n%s", diff)
	}
}

// TestRegisterIdentitylessMachineIsClaimed documents the residual risk: a
// machine whose firmware reports no real serial and no real UUID is
// claimed by any report from its MAC.
func TestRegisterIdentitylessMachineIsClaimed(t *testing.T) {
	inv := newInv(t, Config{})
	ctx := context.Background()
	const mac = "52:54:00:00:0b:01"
	a, err := inv.Register(ctx, mac, facts("Default string", "", mac), RegisterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := inv.Register(ctx, mac, facts("SN-LATER", "", mac), RegisterOptions{})
	if err != nil || b.GetName() != a.GetName() || b.GetSerial() != "SN-LATER" {
		t.Fatalf("identity-less machine: %v %v", b, err)
	}
	// From now on it has an identity: a report without it is refused.
	if _, err := inv.Register(ctx, mac, facts("", "", mac), RegisterOptions{}); !errors.Is(err, apierr.ErrPermissionDenied) {
		t.Fatalf("report without the serial now recorded: %v", err)
	}
}

// TestIdentityMismatch: a report may land on a machine only when it
// carries every identifier the machine holds, equal (claims.go).
func TestIdentityMismatch(t *testing.T) {
	const u1, u2 = "aaaaaaaa-0000-4000-8000-000000000001", "bbbbbbbb-0000-4000-8000-000000000002"
	cases := map[string]struct {
		m  *inventoryv1.Machine
		id identity
		ok bool
	}{
		"nothing recorded":            {m: &inventoryv1.Machine{}, ok: true},
		"serial matches":              {m: &inventoryv1.Machine{Serial: "S"}, id: identity{serial: "S"}, ok: true},
		"uuid matches, upper case":    {m: &inventoryv1.Machine{SystemUuid: strings.ToUpper(u1)}, id: identity{uuid: u1}, ok: true},
		"both match, more reported":   {m: &inventoryv1.Machine{Serial: "S", SystemUuid: u1}, id: identity{serial: "S", uuid: u1, board: "B", ek: "e"}, ok: true},
		"serial matches, no uuid":     {m: &inventoryv1.Machine{Serial: "S", SystemUuid: u1}, id: identity{serial: "S"}},
		"uuid matches, no serial":     {m: &inventoryv1.Machine{Serial: "S", SystemUuid: u1}, id: identity{uuid: u1}},
		"serial only vs uuid only":    {m: &inventoryv1.Machine{Serial: "S"}, id: identity{uuid: u1}},
		"nothing reported":            {m: &inventoryv1.Machine{Serial: "S"}},
		"serial differs":              {m: &inventoryv1.Machine{Serial: "S"}, id: identity{serial: "T"}},
		"serial matches uuid differs": {m: &inventoryv1.Machine{Serial: "S", SystemUuid: u1}, id: identity{serial: "S", uuid: u2}},
		"board differs":               {m: &inventoryv1.Machine{Serial: "S", BaseboardSerial: "B"}, id: identity{serial: "S", board: "C"}},
		"TPM key bound, none proved":  {m: &inventoryv1.Machine{Serial: "S", EkIdentity: "e"}, id: identity{serial: "S"}},
		"TPM key bound, another":      {m: &inventoryv1.Machine{Serial: "S", EkIdentity: "e"}, id: identity{serial: "S", ek: "f"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			why := tc.id.mismatch(tc.m)
			if (why == "") != tc.ok {
				t.Fatalf("mismatch = %q; want ok=%t", why, tc.ok)
			}
		})
	}
}

func hasEvent(es []*inventoryv1.TimelineEntry, event, detail string) bool {
	for _, e := range es {
		if e.GetEvent() == event && strings.Contains(e.GetDetail(), detail) {
			return true
		}
	}
	return false
}
