package netdev

import (
	"errors"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/testsupport/require"
)

func TestParseBond(t *testing.T) {
	good := map[string]Bond{
		"bond0=eno1,eno2":                          {Name: "bond0", Slaves: []string{"eno1", "eno2"}, Mode: BondActiveBackup, MiimonMS: DefaultMiimonMS},
		"up=a,b,c,mode=802.3ad,miimon=50":          {Name: "up", Slaves: []string{"a", "b", "c"}, Mode: Bond8023AD, MiimonMS: 50},
		"bond0=eth0,eth1,primary=eth1,miimon=1000": {Name: "bond0", Slaves: []string{"eth0", "eth1"}, Mode: BondActiveBackup, MiimonMS: 1000, Primary: "eth1"},
	}
	for in, want := range good {
		got, err := ParseBond(in)
		if err != nil {
			t.Errorf("%q: %v", in, err)
			continue
		}
		if got.Name != want.Name || !slices.Equal(got.Slaves, want.Slaves) || got.Mode != want.Mode || got.MiimonMS != want.MiimonMS || got.Primary != want.Primary {
			t.Errorf("%q: %+v, want %+v", in, got, want)
		}
	}
	bad := []string{
		"", "bond0", "bond0=eth0", "bond0=eth0,eth0", "bond0=eth0,bond0",
		"bond0=a,b,mode=balance-rr", "bond0=a,b,miimon=5", "bond0=a,b,miimon=10001", "bond0=a,b,miimon=x", "bond0=a,b,miimon=-1",
		"bond0=a,b,primary=c", "bond0=a,b,mode=802.3ad,primary=a", "bond0=a,b,speed=10",
		"averyveryverylongname=a,b", "bond0=a,averyveryverylongname", "bo/nd=a,b", "bond0=a,b\n", "bond0=a,b\x1b[2J",
		"bond0=a,b,c,d,e,f,g,h,i", "bond0=" + strings.Repeat("a,", 200) + "b",
	}
	for _, in := range bad {
		if _, err := ParseBond(in); !errors.Is(err, apierr.ErrInvalid) {
			t.Errorf("%q: %v, want apierr.ErrInvalid", in, err)
		}
	}
}

// TestBondOnHost runs ApplyBond against this kernel: where bonding works
// the bond is made, enslaves both NICs, is idempotent and deleted; where
// it does not (this project's lab kernel) nothing may be left. The
// failover itself is tested in a guest (hypervisor/netdev/e2e).
func TestBondOnHost(t *testing.T) {
	ns := newNetNS(t)
	base := filepath.Base(ns)
	for _, p := range [][2]string{{"nic0", "peer0"}, {"nic1", "peer1"}} {
		if out, err := exec.Command("ip", "-n", base, "link", "add", p[0], "type", "veth", "peer", "name", p[1]).CombinedOutput(); err != nil {
			t.Fatalf("veth: %v %s", err, out)
		}
	}
	m, _ := NewManager(Config{NetNSPath: ns})
	b := Bond{Name: "cbond0", Slaves: []string{"nic0", "nic1"}}
	if err := m.ApplyBond(Bond{Name: "cbond0", Slaves: []string{"nic0", "nic9"}}); !errors.Is(err, apierr.ErrNotFound) {
		t.Errorf("bond over a missing NIC: %v, want apierr.ErrNotFound", err)
	}
	if err := m.ApplyBond(b); err != nil {
		if links, _ := m.Links(); len(links) != 0 {
			t.Fatalf("failed apply left %v", names(links))
		}
		require.KernelLacks(t, "bonding (%v); nothing left behind verified, failover tested in hypervisor/netdev/e2e", err)
	}
	if err := m.ApplyBond(b); err != nil {
		t.Fatalf("second apply (idempotent): %v", err)
	}
	st, err := m.BondStatus("cbond0")
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode != BondActiveBackup || len(st.Slaves) != 2 {
		t.Errorf("status %+v", st)
	}
	if err := m.DeleteBond("cbond0"); err != nil {
		t.Fatal(err)
	}
	if err := m.DeleteBond("nic0"); !errors.Is(err, apierr.ErrPrecondition) {
		t.Errorf("delete a NIC as a bond: %v, want apierr.ErrPrecondition", err)
	}
}
