// Command dora is a DHCPv4 load generator acting as a relay agent (giaddr
// = its own address, listening on port 67): it runs DISCOVER → OFFER →
// REQUEST → ACK exchanges for new MACs and prints leases/s and DORA
// latency percentiles. Two modes: -rate R -duration D (open loop, one new
// client every 1/R s) and -burst N (N new clients at once, retransmitting
// every second, until all are leased). It prints figures; it asserts
// nothing. See bench/README.md.
package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"net"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

type client struct {
	hw      net.HardwareAddr
	xid     dhcpv4.TransactionID
	start   time.Time
	offer   *dhcpv4.DHCPv4
	done    bool
	latency time.Duration
	sentAt  time.Time
}

func main() {
	local := flag.String("local", "", "local address (giaddr), e.g. 10.66.0.2")
	server := flag.String("server", "", "server address")
	rate := flag.Float64("rate", 0, "new clients per second (open loop)")
	dur := flag.Duration("duration", 10*time.Second, "test length in rate mode")
	burst := flag.Int("burst", 0, "burst mode: this many new clients at once")
	timeout := flag.Duration("timeout", 4*time.Second, "burst mode: give up after this long")
	flag.Parse()
	if *local == "" || *server == "" || (*rate == 0) == (*burst == 0) {
		fmt.Fprintln(os.Stderr, "usage: dora -local A -server B (-rate R [-duration D] | -burst N)")
		os.Exit(2)
	}
	conn, err := net.ListenPacket("udp4", *local+":67")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if uc, ok := conn.(*net.UDPConn); ok {
		uc.SetReadBuffer(8 << 20)
		uc.SetWriteBuffer(8 << 20)
	}
	dst := &net.UDPAddr{IP: net.ParseIP(*server), Port: 67}
	giaddr := net.ParseIP(*local).To4()
	var mu sync.Mutex
	byXID := map[dhcpv4.TransactionID]*client{}
	send := func(m *dhcpv4.DHCPv4) { conn.WriteTo(m.ToBytes(), dst) }
	discover := func(c *client) {
		m, _ := dhcpv4.NewDiscovery(c.hw, dhcpv4.WithTransactionID(c.xid), dhcpv4.WithGatewayIP(giaddr))
		c.sentAt = time.Now()
		send(m)
	}
	request := func(c *client) {
		r, _ := dhcpv4.NewRequestFromOffer(c.offer, dhcpv4.WithGatewayIP(giaddr))
		r.TransactionID = c.xid
		c.sentAt = time.Now()
		send(r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var acked, naks int
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		buf := make([]byte, 1500)
		for ctx.Err() == nil {
			conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			n, _, err := conn.ReadFrom(buf)
			if err != nil {
				continue
			}
			m, err := dhcpv4.FromBytes(buf[:n])
			if err != nil {
				continue
			}
			mu.Lock()
			c := byXID[m.TransactionID]
			if c == nil || c.done {
				mu.Unlock()
				continue
			}
			switch m.MessageType() {
			case dhcpv4.MessageTypeOffer:
				if c.offer == nil {
					c.offer = m
					request(c)
				}
			case dhcpv4.MessageTypeAck:
				c.done, c.latency = true, time.Since(c.start)
				acked++
			case dhcpv4.MessageTypeNak:
				naks++
				c.offer = nil
			}
			mu.Unlock()
		}
	}()
	newClient := func() *client {
		hw := make(net.HardwareAddr, 6)
		rand.Read(hw)
		hw[0] = 0x02
		var xid dhcpv4.TransactionID
		rand.Read(xid[:])
		c := &client{hw: hw, xid: xid, start: time.Now()}
		mu.Lock()
		byXID[xid] = c
		discover(c)
		mu.Unlock()
		return c
	}
	var all []*client
	start := time.Now()
	if *rate > 0 {
		interval := time.Duration(float64(time.Second) / *rate)
		next := time.Now()
		for time.Since(start) < *dur {
			all = append(all, newClient())
			next = next.Add(interval)
			if d := time.Until(next); d > 0 {
				time.Sleep(d)
			}
		}
		time.Sleep(time.Second) // answers in flight (DHCP clients wait 1 s+)
	} else {
		for i := 0; i < *burst; i++ {
			all = append(all, newClient())
		}
		deadline := start.Add(*timeout)
		for time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
			mu.Lock()
			done := 0
			for _, c := range all {
				switch {
				case c.done:
					done++
				case time.Since(c.sentAt) > time.Second: // client retransmission
					if c.offer != nil {
						request(c)
					} else {
						discover(c)
					}
				}
			}
			mu.Unlock()
			if done == len(all) {
				break
			}
		}
	}
	elapsed := time.Since(start)
	cancel()
	<-recvDone
	mu.Lock()
	defer mu.Unlock()
	var lat []time.Duration
	var last time.Duration
	for _, c := range all {
		if c.done {
			lat = append(lat, c.latency)
			if t := c.start.Sub(start) + c.latency; t > last {
				last = t
			}
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(p*float64(len(lat))))]
	}
	lost := len(all) - len(lat)
	if *rate > 0 {
		fmt.Printf("offered %.0f/s for %s: clients %d leased %d (%.2f%% not leased within the run) leases/s %.0f  DORA p50 %s p99 %s max %s naks %d\n",
			*rate, *dur, len(all), len(lat), 100*float64(lost)/float64(max(1, len(all))), float64(len(lat))/elapsed.Seconds(),
			pct(0.50).Round(10*time.Microsecond), pct(0.99).Round(10*time.Microsecond), pct(1).Round(10*time.Microsecond), naks)
	} else {
		fmt.Printf("burst %d new clients: leased %d, all leased after %s (limit %s), DORA p50 %s p99 %s naks %d\n",
			*burst, len(lat), last.Round(time.Millisecond), *timeout, pct(0.50).Round(time.Millisecond), pct(0.99).Round(time.Millisecond), naks)
	}
}
