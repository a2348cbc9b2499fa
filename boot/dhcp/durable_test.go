package dhcp

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"

	bootv1 "github.com/corralhq/corral/api/boot/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/bolt"
	"github.com/corralhq/corral/store/record"
)

// crashCopy copies a bolt store's files as a crash leaves them (the page
// cache survives a process crash) and returns the copy's path.
func crashCopy(t *testing.T, path string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "corral.db")
	for _, suffix := range []string{"", ".journal", ".journal.1"} {
		b, err := os.ReadFile(path + suffix)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst+suffix, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// TestAckedLeaseSurvivesCrash: every lease ACKed on a bolt store is in the
// store after a crash (its files as they were at the last ACK, nothing
// closed or folded), and the restarted server offers each client its
// address again. The leases were made durable by the store's journal:
// the store file alone does not have them yet.
func TestAckedLeaseSurvivesCrash(t *testing.T) {
	path := filepath.Join(t.TempDir(), "corral.db")
	st, err := bolt.Open(path, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	f := newFixture(t, ModeFull, func(c *Config) { c.Store, c.Alone = st, true })
	acked := map[string]string{} // MAC → address
	for i := range 40 {
		kind := plain
		if i%4 == 0 {
			kind = biosPXE
		}
		_, ack := f.dora(t, mac(200+i), kind)
		acked[mac(200+i).String()] = ack.YourIPAddr.String()
	}
	cp := crashCopy(t, path)

	// The store file alone (journal lost) predates the ACKs.
	alone := crashCopy(t, cp)
	os.Remove(alone + ".journal")
	sa, err := bolt.Open(alone, bolt.Options{NoJournal: true})
	if err != nil {
		t.Fatal(err)
	}
	if kvs, err := sa.List(t.Context(), LeasePrefix); err != nil || len(kvs) == len(acked) {
		t.Errorf("store file without its journal holds %d leases (%v): the ACKs did not go through the journal", len(kvs), err)
	}
	sa.Close()

	st2, err := bolt.Open(cp, bolt.Options{})
	if err != nil {
		t.Fatalf("Open after the crash: %v", err)
	}
	defer st2.Close()
	for m, ip := range acked {
		var l bootv1.Lease
		if _, err := record.Get(t.Context(), st2, LeasePrefix+ip, &l); err != nil || l.GetMac() != m || l.GetState() != bootv1.Lease_STATE_ACTIVE {
			t.Errorf("lease %s of %s after the crash: %v, %v", ip, m, &l, err)
		}
	}
	if _, err := st2.Get(t.Context(), LeasePrefix+"10.0.0.250"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("an address never leased is stored: %v", err)
	}
	f2 := newFixture(t, ModeFull, func(c *Config) { c.Store, c.Alone = st2, true })
	for i := range 40 {
		hw := mac(200 + i)
		offer, _ := f2.do(t, discover(t, hw, plain))
		if offer == nil || offer.MessageType() != dhcpv4.MessageTypeOffer || offer.YourIPAddr.String() != acked[hw.String()] {
			t.Errorf("after the crash %s was offered %v, want its lease %s", hw, offer, acked[hw.String()])
		}
	}
}

// TestPacketLeasesShareTheCommitWindow: the lease a packet writes on a
// bolt store with a commit window may wait for it (the packet's context,
// bound, carries store.WithCommitWindow), so leases arriving within the
// window after a flush share the next one; a write without it (here the
// fixture's own context, as an API call has) is flushed at once.
func TestPacketLeasesShareTheCommitWindow(t *testing.T) {
	const window = 400 * time.Millisecond
	st, err := bolt.Open(filepath.Join(t.TempDir(), "corral.db"), bolt.Options{CommitWindow: window})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	f := newFixture(t, ModeFull, func(c *Config) { c.Store, c.Alone = st, true })
	request := func(hw net.HardwareAddr, packet bool) time.Duration {
		offer, _ := f.do(t, discover(t, hw, plain))
		if offer == nil {
			t.Fatalf("no OFFER for %s", hw)
		}
		req, err := dhcpv4.NewRequestFromOffer(offer)
		if err != nil {
			t.Fatal(err)
		}
		ctx := f.ctx
		if packet {
			ctx = f.s.bound.Load().ctx(time.Now())
		}
		p, err := dhcpv4.FromBytes(req.ToBytes())
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		ack, _ := f.s.Respond(ctx, p, nil, dhcpv4.ServerPort)
		took := time.Since(start)
		if ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck {
			t.Fatalf("no ACK for %s: %v", hw, ack)
		}
		return took
	}
	request(mac(300), false) // a flush: the window starts
	if took := request(mac(301), true); took < window/2 {
		t.Errorf("a packet's lease right after a flush was ACKed after %s: it did not wait for the %s window", took, window)
	}
	if took := request(mac(302), false); took > window/2 {
		t.Errorf("a write without the window's context right after a flush took %s: it waited", took)
	}
}
