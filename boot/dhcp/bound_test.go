package dhcp

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
)

// deadlineInventory records how long each call had until its deadline and
// then blocks until the context ends.
type deadlineInventory struct {
	mu   sync.Mutex
	left []time.Duration
	none bool
}

func (d *deadlineInventory) EnsureMachineForMAC(ctx context.Context, mac string) (*inventoryv1.Machine, bool, error) {
	dl, ok := ctx.Deadline()
	d.mu.Lock()
	if ok {
		d.left = append(d.left, time.Until(dl))
	} else {
		d.none = true
	}
	d.mu.Unlock()
	if !ok {
		return nil, false, errors.New("no deadline")
	}
	<-ctx.Done()
	return nil, false, ctx.Err()
}

// TestHandleBound: a packet's inventory and store calls run under a
// deadline of 3 s (to 3.1 s: the deadline context is shared by the packets
// of 100 ms) even when Run's context has ended, and a call that blocks
// ends with the deadline.
func TestHandleBound(t *testing.T) {
	inv := &deadlineInventory{}
	f := newFixture(t, ModeFull, func(c *Config) { c.Inventory = inv })
	peer, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	// handle takes no context: handlers outlive Run's, bounded by s.bound.
	start := time.Now()
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			f.s.handle(job{conn: f.s.conn, up: peer.LocalAddr().(*net.UDPAddr), m: discover(t, mac(0x900+i), biosPXE), port: dhcpv4.ServerPort})
		})
	}
	wg.Wait()
	took := time.Since(start)
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if inv.none || len(inv.left) != 3 {
		t.Fatalf("calls without a deadline: %v, deadlines %v", inv.none, inv.left)
	}
	for _, l := range inv.left {
		if l < handleTimeout-time.Second || l > handleTimeout+boundStep {
			t.Errorf("deadline %v after the packet, want %v to %v", l, handleTimeout, handleTimeout+boundStep)
		}
	}
	if took < handleTimeout-time.Second || took > handleTimeout+5*time.Second {
		t.Errorf("blocked calls ended after %v, want about %v", took, handleTimeout)
	}
}
