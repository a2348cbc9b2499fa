package dhcp

import (
	"context"
	"net"
	"net/netip"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"

	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/store/bolt"
)

// BenchmarkDORA measures DISCOVER→OFFER→REQUEST→ACK through Respond with
// leases and timeline on bbolt (durable, group-committed), many clients in
// flight. Figures, not assertions: see bench/README.md for the wire-level
// benchmark against Kea and dnsmasq.
func BenchmarkDORA(b *testing.B) {
	for name, pxe := range map[string]bool{"plain": false, "pxe": true} {
		b.Run(name, func(b *testing.B) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			st, err := bolt.Open(filepath.Join(b.TempDir(), "bench.db"), bolt.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			inv, _ := inventory.New(inventory.Config{Store: st})
			done := make(chan struct{})
			go func() { inv.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()
			c1, _ := net.ListenPacket("udp4", "127.0.0.1:0")
			defer c1.Close()
			s, err := New(ctx, Config{Mode: ModeFull, ServerIP: serverIP, Catalog: fullCatalog, Store: st, Inventory: inv, Timeline: inv, Conn: c1,
				Ranges: []Range{{Subnet: netip.MustParsePrefix("10.0.0.0/8"), Start: netip.MustParseAddr("10.1.0.0"), End: netip.MustParseAddr("10.200.0.0")}}})
			if err != nil {
				b.Fatal(err)
			}
			var n atomic.Int64
			b.SetParallelism(64)
			start := time.Now()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := int(n.Add(1))
					hw := net.HardwareAddr{0x52, 0x55, byte(i >> 24), byte(i >> 16), byte(i >> 8), byte(i)}
					d, _ := dhcpv4.NewDiscovery(hw)
					if pxe {
						biosPXE(d)
					}
					offer, _ := s.Respond(ctx, d, nil, dhcpv4.ServerPort)
					if offer == nil {
						b.Error("no offer")
						return
					}
					req, _ := dhcpv4.NewRequestFromOffer(offer)
					if ack, _ := s.Respond(ctx, req, nil, dhcpv4.ServerPort); ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck {
						b.Error("no ack")
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "leases/s")
		})
	}
}
