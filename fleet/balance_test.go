package fleet

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	fleetv1 "github.com/corralhq/corral/api/fleet/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// putRunner writes an appliance record serving DHCP on segs, heartbeated
// at hb.
func putRunner(t *testing.T, st store.Store, name string, hb time.Time, segs ...string) {
	t.Helper()
	ctx := context.Background()
	var rev int64
	if kv, err := st.Get(ctx, AppliancePrefix+name); err == nil {
		rev = kv.Revision
	}
	a := &fleetv1.Appliance{Name: name, DhcpSegments: segs, LastHeartbeat: timestamppb.New(hb)}
	if _, err := record.Put(ctx, st, AppliancePrefix+name, a, rev); err != nil {
		t.Fatal(err)
	}
}

// TestBalanceSplitsDISCOVERs: three live appliances serving one segment
// answer each MAC exactly once between them, about a third each; a client
// that has waited MaxSecs is answered by all; an appliance whose record
// expired loses its MACs to the others while theirs stay where they were
// (rendezvous hashing); a segment nobody publishes, and every MAC before
// the first read, is answered.
func TestBalanceSplitsDISCOVERs(t *testing.T) {
	st := mem.New()
	defer st.Close()
	now := time.Now()
	seg := netip.MustParsePrefix("10.9.0.0/24")
	for _, n := range []string{"a1", "a2", "a3"} {
		putRunner(t, st, n, now, "10.9.0.0/24", "10.8.0.0/24")
	}
	putRunner(t, st, "proxy", now) // serves no segment in full mode: never chosen
	bs := map[string]*Balance{}
	for _, n := range []string{"a1", "a2", "a3"} {
		bs[n] = &Balance{Store: st, Self: n, MaxSecs: 3}
	}
	const macs = 3000
	mac := func(i int) string { return fmt.Sprintf("52:54:00:%02x:%02x:%02x", i>>16&0xff, i>>8&0xff, i&0xff) }
	if !bs["a1"].Answers(mac(1), seg, 0) {
		t.Fatal("before its first read an appliance must answer")
	}
	for _, b := range bs {
		if err := b.read(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	owner := make([]string, macs)
	share := map[string]int{}
	for i := range macs {
		for n, b := range bs {
			if b.Answers(mac(i), seg, 0) {
				if owner[i] != "" {
					t.Fatalf("%s answered by %s and %s", mac(i), owner[i], n)
				}
				owner[i] = n
			}
		}
		if owner[i] == "" {
			t.Fatalf("%s answered by nobody", mac(i))
		}
		share[owner[i]]++
		for n, b := range bs {
			if !b.Answers(mac(i), seg, 3) {
				t.Fatalf("%s with secs 3 not answered by %s", mac(i), n)
			}
		}
	}
	t.Logf("share of %d MACs: %v", macs, share)
	for n, c := range share {
		if c < macs/4 || c > macs/2 {
			t.Errorf("%s answers %d of %d MACs: not split evenly", n, c, macs)
		}
	}
	if left := bs["a1"].LeftToPeers(); left != int64(macs-share["a1"]) {
		t.Errorf("a1 counted %d left to peers, want %d", left, macs-share["a1"])
	}
	for _, b := range bs {
		if !b.Answers(mac(7), netip.MustParsePrefix("10.7.0.0/24"), 0) {
			t.Fatal("a segment no appliance publishes must be answered")
		}
	}

	// a3 stops heartbeating: past the expiry its MACs move, the others' stay.
	putRunner(t, st, "a3", now.Add(-2*DefaultExpiry), "10.9.0.0/24")
	for _, n := range []string{"a1", "a2"} {
		if err := bs[n].read(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	moved := 0
	for i := range macs {
		a1, a2 := bs["a1"].Answers(mac(i), seg, 0), bs["a2"].Answers(mac(i), seg, 0)
		if a1 == a2 {
			t.Fatalf("%s after a3 expired: a1 %v, a2 %v", mac(i), a1, a2)
		}
		now := "a1"
		if a2 {
			now = "a2"
		}
		if owner[i] != "a3" && owner[i] != now {
			t.Fatalf("%s moved from %s to %s though %s is still live", mac(i), owner[i], now, owner[i])
		}
		if owner[i] == "a3" {
			moved++
		}
	}
	if moved != share["a3"] {
		t.Errorf("%d MACs moved, want a3's %d", moved, share["a3"])
	}

	// Alone on the segment, or off: everything is answered.
	off := &Balance{Store: st, Self: "a1"}
	if err := off.read(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !off.Answers(mac(1), seg, 0) || !off.Answers(mac(2), seg, 0) {
		t.Error("MaxSecs 0 must answer every DISCOVER")
	}
}
