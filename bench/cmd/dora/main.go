// Command dora is a DHCPv4 load generator acting as a relay agent (giaddr
// = its own address, listening on port 67): it runs DISCOVER → OFFER →
// REQUEST → ACK exchanges for new MACs and prints leases/s and DORA
// latency percentiles. Two modes: -rate R -duration D (open loop, one new
// client every 1/R s) and -burst N (N new clients at once, retransmitting
// every second, until all are leased). A NAKed client starts again at
// DISCOVER at once, as a real client does.
//
// With several -server addresses (a relay with several helper addresses:
// appliances sharing a segment) every DISCOVER and REQUEST goes to each;
// a client takes the first OFFER and REQUESTs it from that server. Every
// ACK is checked against what the other clients hold: an address ACKed to
// a second MAC while the first holds it is a duplicate. -release D makes
// each client RELEASE its lease D after its ACK (so a small range is
// recycled); -etcd URLS -etcd-prefix P compares, after the run, the live
// leases in the fleet's etcd store with what the clients hold. It prints
// figures; it asserts nothing. See bench/README.md.
package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"

	bootv1 "github.com/corralhq/corral/api/boot/v1"
	"github.com/corralhq/corral/boot/dhcp"
	"github.com/corralhq/corral/store/etcd"
	"github.com/corralhq/corral/store/record"
)

type client struct {
	hw      net.HardwareAddr
	xid     dhcpv4.TransactionID
	start   time.Time
	offer   *dhcpv4.DHCPv4
	done    bool
	latency time.Duration
	sentAt  time.Time
	ip      net.IP
	server  *net.UDPAddr // the server that ACKed
}

func main() {
	local := flag.String("local", "", "local address (giaddr), e.g. 10.66.0.2")
	server := flag.String("server", "", "server address; several, comma-separated, for appliances sharing a segment (each gets every DISCOVER and REQUEST)")
	release := flag.Duration("release", 0, "each client RELEASEs its lease this long after its ACK (0: never)")
	etcdURLs := flag.String("etcd", "", "after the run, compare the live leases in this etcd cluster (client URLs, comma-separated) with what the clients hold")
	etcdPrefix := flag.String("etcd-prefix", etcd.DefaultPrefix, "the fleet's key prefix in etcd (with -etcd)")
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
		// Smaller buffers drop packets under a burst: the figures would
		// say so, and this says why.
		if err := uc.SetReadBuffer(8 << 20); err != nil {
			fmt.Fprintln(os.Stderr, "warning: read buffer:", err)
		}
		if err := uc.SetWriteBuffer(8 << 20); err != nil {
			fmt.Fprintln(os.Stderr, "warning: write buffer:", err)
		}
	}
	var dsts []*net.UDPAddr
	for _, a := range strings.Split(*server, ",") {
		ip := net.ParseIP(strings.TrimSpace(a)).To4()
		if ip == nil {
			fmt.Fprintf(os.Stderr, "-server %q: want IPv4 addresses\n", *server)
			os.Exit(2)
		}
		dsts = append(dsts, &net.UDPAddr{IP: ip, Port: 67})
	}
	giaddr := net.ParseIP(*local).To4()
	var mu sync.Mutex
	byXID := map[dhcpv4.TransactionID]*client{}
	// A packet that could not be sent is one the client retransmits (or
	// a lease lost); sendErrs counts them for the summary. Under mu.
	var sendErrs int
	var firstSendErr error
	sendTo := func(b []byte, to net.Addr) {
		if _, err := conn.WriteTo(b, to); err != nil {
			if sendErrs++; firstSendErr == nil {
				firstSendErr = err
			}
		}
	}
	send := func(m *dhcpv4.DHCPv4) {
		b := m.ToBytes()
		for _, d := range dsts {
			sendTo(b, d)
		}
	}
	// holders is address → MAC from each ACK until the client's RELEASE
	// is sent; duplicates counts ACKs of a held address to another MAC.
	holders := map[string]string{}
	var duplicates int
	var dupLines []string
	type pending struct {
		c  *client
		at time.Time
	}
	var releases []pending // in ACK order, so in release-time order
	releaseDue := func(now time.Time) {
		n := 0
		for _, p := range releases {
			if now.Before(p.at) {
				break
			}
			c := p.c
			if holders[c.ip.String()] == c.hw.String() {
				delete(holders, c.ip.String())
			}
			m, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRelease), dhcpv4.WithHwAddr(c.hw), dhcpv4.WithClientIP(c.ip),
				dhcpv4.WithOption(dhcpv4.OptServerIdentifier(c.server.IP)))
			sendTo(m.ToBytes(), c.server)
			n++
		}
		releases = releases[n:]
	}
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
			// Fails only on a closed socket, whose read fails too.
			_ = conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
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
				c.ip = m.YourIPAddr
				c.server = &net.UDPAddr{IP: m.ServerIdentifier(), Port: 67}
				acked++
				ip := c.ip.String()
				if h := holders[ip]; h != "" && h != c.hw.String() {
					duplicates++
					if len(dupLines) < 10 {
						dupLines = append(dupLines, fmt.Sprintf("duplicate: %s ACKed to %s by %s while %s holds it", ip, c.hw, c.server.IP, h))
					}
				}
				holders[ip] = c.hw.String()
				if *release > 0 {
					releases = append(releases, pending{c, time.Now().Add(*release)})
				}
			case dhcpv4.MessageTypeNak:
				// A real client starts again at DISCOVER.
				naks++
				c.offer = nil
				discover(c)
			default: // DISCOVER, REQUEST and the rest are no answers to a client
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
			if *release > 0 {
				mu.Lock()
				releaseDue(time.Now())
				mu.Unlock()
			}
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
			releaseDue(time.Now())
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
	// The receiver has ended: from here this goroutine alone reads the
	// clients, the counts and holders.
	mu.Lock()
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
		fmt.Printf("offered %.0f/s for %s: clients %d leased %d (%.2f%% not leased within the run) leases/s %.0f  DORA p50 %s p99 %s max %s naks %d duplicates %d\n",
			*rate, *dur, len(all), len(lat), 100*float64(lost)/float64(max(1, len(all))), float64(len(lat))/elapsed.Seconds(),
			pct(0.50).Round(10*time.Microsecond), pct(0.99).Round(10*time.Microsecond), pct(1).Round(10*time.Microsecond), naks, duplicates)
	} else {
		fmt.Printf("burst %d new clients: leased %d, all leased after %s (limit %s), DORA p50 %s p99 %s naks %d duplicates %d\n",
			*burst, len(lat), last.Round(time.Millisecond), *timeout, pct(0.50).Round(time.Millisecond), pct(0.99).Round(time.Millisecond), naks, duplicates)
	}
	for _, l := range dupLines {
		fmt.Println(l)
	}
	if sendErrs > 0 {
		fmt.Printf("send errors %d (first: %v)\n", sendErrs, firstSendErr)
	}
	mu.Unlock()
	if *etcdURLs != "" {
		// RELEASEs sent last are in flight: let them land.
		time.Sleep(500 * time.Millisecond)
		if err := checkStore(strings.Split(*etcdURLs, ","), *etcdPrefix, holders); err != nil {
			fmt.Fprintln(os.Stderr, "store check:", err)
			os.Exit(1)
		}
	}
}

// checkStore compares the live leases in the fleet's etcd store with what
// the clients hold (address → MAC) and prints the differences' counts:
// a held lease that is not live in the store, or a MAC with two live
// leases, would be a bug; a live lease nobody holds is an ACK the client
// did not see (lost under load) or a RELEASE still in flight.
func checkStore(urls []string, prefix string, holders map[string]string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := etcd.Open(ctx, etcd.Options{Endpoints: urls, Prefix: prefix})
	if err != nil {
		return err
	}
	defer st.Close()
	ls, err := record.List(ctx, st, dhcp.LeasePrefix, func() *bootv1.Lease { return &bootv1.Lease{} })
	if err != nil {
		return err
	}
	now := time.Now().Unix()
	live := map[string]string{}
	perMAC := map[string]int{}
	for _, l := range ls {
		if l.GetState() == bootv1.Lease_STATE_ACTIVE && now < l.GetExpiresUnix() {
			live[l.GetIp()] = l.GetMac()
			perMAC[l.GetMac()]++
		}
	}
	missing, extra, twice := 0, 0, 0
	for ip, mac := range holders {
		if live[ip] != mac {
			missing++
		}
	}
	for ip, mac := range live {
		if holders[ip] != mac {
			extra++
		}
	}
	for _, n := range perMAC {
		if n > 1 {
			twice++
		}
	}
	fmt.Printf("store: %d lease records, %d live, %d held by clients; held but not live in the store %d; MACs with two live leases %d; live but not held %d (ACK not seen, or RELEASE in flight)\n",
		len(ls), len(live), len(holders), missing, twice, extra)
	return nil
}
