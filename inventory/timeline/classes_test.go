package timeline

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/mem"
)

// byClass counts mac's stored entries: record entries by event, and the
// boot LAN's.
func byClass(t *testing.T, st store.Store, mac string) (rec map[string]int, lan int) {
	t.Helper()
	tl := &Timeline{cfg: Config{Store: st}}
	es, err := tl.Entries(context.Background(), []string{mac}, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	rec = map[string]int{}
	for _, e := range es {
		if bootLANSources[e.GetSource()] {
			lan++
		} else {
			rec[e.GetEvent()]++
		}
	}
	return rec, lan
}

// victimRecord puts a machine's life on its timeline: registered, a
// refused registration, an operator's call.
func victimRecord(tl *Timeline, mac string) map[string]int {
	tl.Event(mac, "inventory", "registered", "registered by serial", nil)
	tl.Event(mac, "inventory", "register-refused", "Register refused: the token was issued for another MAC", map[string]string{"peer": "10.0.0.66"})
	tl.Event(mac, "api", "accept by token:abc (ops)", "OK", nil)
	tl.Event(mac, "agent", "progress: partition", "", nil)
	return map[string]int{"registered": 1, "register-refused": 1, "accept by token:abc (ops)": 1, "progress: partition": 1}
}

// TestTimelineBootLANFloodOfOneMAC: unauthenticated requests naming the
// victim's MAC (GET /images/x?mac=VICTIM) fill the boot-LAN class's own
// cap and never delete the victim's record entries.
func TestTimelineBootLANFloodOfOneMAC(t *testing.T) {
	st := mem.New()
	// The rates are above the flood: this is about the per-MAC caps.
	tl := newTL(t, Config{Store: st, Limit: 100, BootLAN: BootLAN{Limit: 50, MACBurst: 1 << 20, SourceBurst: 1 << 20}})
	want := victimRecord(tl, "52:54:00:aa:00:01")
	for i := range 2500 {
		tl.Event("52:54:00:aa:00:01", "http", "http-refused", "no such image", map[string]string{"path": "/images/x", "peer": fmt.Sprintf("10.1.%d.%d", i/250, i%250)})
	}
	if err := tl.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	rec, lan := byClass(t, st, "52:54:00:aa:00:01")
	if diff := cmp.Diff(want, rec); diff != "" {
		t.Errorf("the victim's record entries after 2,500 boot-LAN ones (-want +got):\n%s", diff)
	}
	if lan < 50 || lan > 50+50/10+1 {
		t.Errorf("%d boot-LAN entries kept; want the class's cap, 50 (and at most a trim interval more)", lan)
	}
}

// TestTimelineBootLANRates: boot-LAN entries are rate-limited per MAC and
// per source address, the rest dropped and counted; record entries are
// not.
func TestTimelineBootLANRates(t *testing.T) {
	st := mem.New()
	tl := newTL(t, Config{Store: st, BootLAN: BootLAN{MACBurst: 30, PerMAC: 0.001, SourceBurst: 50, PerSource: 0.001}})
	// 40 from one source for one MAC: the source's bucket is charged
	// first, then the MAC's (30).
	for range 40 {
		tl.Event("52:54:00:aa:00:01", "http", "artifact", "served", map[string]string{"peer": "10.0.0.1"})
	}
	// Another MAC from the same source: 10 left of the source's 50.
	for range 100 {
		tl.Event("52:54:00:aa:00:02", "tftp", "tftp-refused", "no such file", map[string]string{"peer": "10.0.0.1"})
	}
	// DHCP names no source: its MAC's rate alone.
	for range 100 {
		tl.Event("52:54:00:aa:00:03", "dhcp", "discover", "", nil)
	}
	for range 100 {
		tl.Event("52:54:00:aa:00:01", "inventory", "registered", "", nil)
	}
	if err := tl.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := stored(t, st)
	want := map[string]int{"52:54:00:aa:00:01": 30 + 100, "52:54:00:aa:00:02": 10, "52:54:00:aa:00:03": 30}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("entries by MAC (-want +got):\n%s", diff)
	}
	byMAC, bySource := tl.Limited()
	if byMAC != 10+70 || bySource != 90 {
		t.Errorf("limited %d by MAC, %d by source; want 80, 90", byMAC, bySource)
	}
}

// TestTimelineTotalCapHoldsRecords: past the total, a flood of spoofed
// MACs deletes the boot-LAN entries of the machines written to least
// recently and keeps their record entries.
func TestTimelineTotalCapHoldsRecords(t *testing.T) {
	st := mem.New()
	tl := newTL(t, Config{Store: st, Limit: 100, MaxEntries: 300, BootLAN: BootLAN{SourceBurst: 1 << 20, MACBurst: 1 << 20}})
	victim := "52:54:00:aa:00:01"
	want := victimRecord(tl, victim)
	for range 20 {
		tl.Event(victim, "dhcp", "discover", "", nil)
	}
	if err := tl.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	for n := 1; n <= 3000; n++ {
		tl.Event(mac(n), "dhcp", "ignored", "spoofed", nil)
	}
	if err := tl.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	rec, lan := byClass(t, st, victim)
	if diff := cmp.Diff(want, rec); diff != "" {
		t.Errorf("the victim's record entries after the flood (-want +got):\n%s", diff)
	}
	if lan != 0 {
		t.Errorf("the victim kept %d boot-LAN entries; want them evicted first", lan)
	}
	total := 0
	for _, n := range stored(t, st) {
		total += n
	}
	if total > 300 {
		t.Errorf("%d entries stored, limit 300", total)
	}
	tl.mu.Lock()
	held := tl.macs[victim] != nil && tl.macs[victim].held
	macs, listed := len(tl.macs), tl.lru.Len()+tl.held.Len()
	tl.mu.Unlock()
	if !held || macs != listed {
		t.Errorf("victim held %v; index holds %d MACs, lists %d", held, macs, listed)
	}
	// The victim boots again: its boot-LAN entries are evictable again.
	tl.Event(victim, "dhcp", "discover", "", nil)
	if err := tl.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	tl.mu.Lock()
	held = tl.macs[victim].held
	tl.mu.Unlock()
	if held {
		t.Error("the victim is still held after a boot-LAN entry")
	}
}

// TestTimelineKeysCarryTheClass: a key ends with its class; keys written
// before the classes are classed by their source.
func TestTimelineKeysCarryTheClass(t *testing.T) {
	st := mem.New()
	tl := newTL(t, Config{Store: st})
	tl.Event(mac(1), "http", "script", "", nil)
	tl.Event(mac(1), "inventory", "registered", "", nil)
	if err := tl.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	kvs, err := st.List(context.Background(), Prefix)
	if err != nil {
		t.Fatal(err)
	}
	var lan, rec int
	for _, kv := range kvs {
		switch {
		case strings.HasSuffix(kv.Key, bootLANSuffix):
			lan++
		case strings.HasSuffix(kv.Key, recordSuffix):
			rec++
		}
		// Without its suffix, the source says the same.
		legacy := store.KV{Key: strings.TrimSuffix(strings.TrimSuffix(kv.Key, bootLANSuffix), recordSuffix), Value: kv.Value}
		if bootLANEntry(legacy) != bootLANEntry(kv) {
			t.Errorf("%s: classed by source %v, by key %v", kv.Key, bootLANEntry(legacy), bootLANEntry(kv))
		}
	}
	if lan != 1 || rec != 1 {
		t.Errorf("%d boot-LAN keys, %d record keys; want 1 and 1", lan, rec)
	}
}
