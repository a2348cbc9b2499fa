package lldp_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralhq/corral/agent/lldp"
	"github.com/corralhq/corral/testsupport/lldpd"
)

// TestListenLLDPD: Debian's lldpd at the far end of a veth pair, told a
// system name, a port and its description, a management address and a
// port VLAN, is heard by Listen on the near end with those values, well
// before the window ends.
func TestListenLLDPD(t *testing.T) {
	peer := lldpd.Start(t, lldpd.Config{
		SystemName: "leaf-04.rack-4", PortID: "Ethernet1/12", PortDescription: "rack 4, machine 7",
		VLAN: 42, VLANName: "provisioning",
	})
	start := time.Now()
	got, err := lldp.Listen(context.Background(), lldp.Config{Interfaces: []string{peer.Interface}, Window: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	list := got[peer.Interface]
	if len(list) != 1 {
		t.Fatalf("heard %+v, want one neighbour on %s", got, peer.Interface)
	}
	n := list[0]
	if n.ChassisID == "" {
		t.Errorf("no chassis ID in %+v", n)
	}
	n.ChassisID = "" // lldpd's: the MAC of its interface
	want := lldp.Neighbor{PortID: "Ethernet1/12", PortDescription: "rack 4, machine 7", SystemName: "leaf-04.rack-4",
		ManagementAddress: "192.0.2.1", VLAN: 42, VLANNames: []string{"42 provisioning"}}
	if diff := cmp.Diff(want, n); diff != "" {
		t.Errorf("neighbour (-want +got):\n%s", diff)
	}
	if took > 20*time.Second {
		t.Errorf("Listen took %v: it should return once every interface has a neighbour", took)
	}
	t.Logf("heard %s port %s in %v", n.SystemName, n.PortID, took.Round(time.Millisecond))
}

// TestListenWindow: with nobody speaking LLDP, Listen returns when the
// window ends, with nothing heard; an interface that does not exist is
// an error but does not stop the others.
func TestListenWindow(t *testing.T) {
	peer := lldpd.StartSilent(t)
	start := time.Now()
	got, err := lldp.Listen(context.Background(), lldp.Config{Interfaces: []string{peer.Interface, "nonexistent0"}, Window: 1500 * time.Millisecond})
	if err == nil {
		t.Error("no error for a missing interface")
	}
	if len(got) != 0 {
		t.Errorf("heard %+v from nobody", got)
	}
	if took := time.Since(start); took < time.Second {
		t.Errorf("returned after %v, before the window", took)
	}
}

// TestListenCancel: Listen returns when its context ends.
func TestListenCancel(t *testing.T) {
	peer := lldpd.StartSilent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := lldp.Listen(ctx, lldp.Config{Interfaces: []string{peer.Interface}, Window: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("returned after %v", took)
	}
}
