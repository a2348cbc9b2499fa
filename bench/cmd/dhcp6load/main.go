// Command dhcp6load is a DHCPv6 load client: -concurrency clients at a
// time, each a new DUID, run SOLICIT → ADVERTISE → REQUEST → REPLY
// against the servers on -iface (to ff02::1:2) for -duration, closed
// loop (a client that finishes or times out is replaced by a new one).
// It prints leases/s (REPLYs carrying an address per second) and the
// SOLICIT→REPLY time's p50, p99 and max over the exchanges that
// finished; it asserts nothing. See bench/README.md.
package main

import (
	"crypto/rand"
	"encoding/binary"
	"flag"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv6"
	"github.com/insomniacslk/dhcp/iana"
)

type exchange struct {
	start time.Time
	duid  dhcpv6.DUID
	done  chan time.Duration // the REPLY's time; closed on failure
}

func main() {
	ifname := flag.String("iface", "", "interface to send on (required)")
	conc := flag.Int("concurrency", 32, "exchanges in flight")
	dur := flag.Duration("duration", 10*time.Second, "how long to run")
	pxe := flag.Bool("pxe", false, "ask as PXE firmware (arch 7, option 59 requested): corrald then records each new DUID's MAC as a machine")
	timeout := flag.Duration("timeout", 2*time.Second, "an exchange not done in this time counts as failed")
	flag.Parse()
	if *ifname == "" {
		fmt.Fprintln(os.Stderr, "dhcp6load: -iface is required")
		os.Exit(2)
	}
	pc, err := net.ListenPacket("udp6", "[::]:546")
	if err != nil {
		fmt.Fprintln(os.Stderr, "dhcp6load:", err)
		os.Exit(1)
	}
	conn := pc.(*net.UDPConn)
	if err := conn.SetReadBuffer(4 << 20); err != nil {
		fmt.Fprintln(os.Stderr, "dhcp6load: read buffer:", err)
	}
	dst := &net.UDPAddr{IP: net.ParseIP("ff02::1:2"), Port: 547, Zone: *ifname}

	var mu sync.Mutex
	pending := map[dhcpv6.TransactionID]*exchange{}
	send := func(m *dhcpv6.Message) {
		if _, err := conn.WriteTo(m.ToBytes(), dst); err != nil {
			fmt.Fprintln(os.Stderr, "dhcp6load: send:", err)
		}
	}
	// The reader: an ADVERTISE is answered with a REQUEST under the same
	// transaction id's exchange, a REPLY with an address ends it.
	go func() {
		buf := make([]byte, 4096)
		for {
			n, _, err := conn.ReadFrom(buf)
			if err != nil {
				return
			}
			at := time.Now()
			m, err := dhcpv6.MessageFromBytes(buf[:n])
			if err != nil {
				continue
			}
			mu.Lock()
			e := pending[m.TransactionID]
			if e != nil && m.MessageType == dhcpv6.MessageTypeReply {
				delete(pending, m.TransactionID)
			}
			mu.Unlock()
			if e == nil {
				continue
			}
			ia := m.Options.OneIANA()
			if ia == nil || ia.Options.OneAddress() == nil {
				continue // NoAddrsAvail: left to time out
			}
			switch m.MessageType {
			case dhcpv6.MessageTypeAdvertise:
				req := newMessage(dhcpv6.MessageTypeRequest, e.duid, m.TransactionID, *pxe)
				req.AddOption(dhcpv6.OptServerID(m.Options.ServerID()))
				out := &dhcpv6.OptIANA{IaId: ia.IaId}
				out.Options.Add(&dhcpv6.OptIAAddress{IPv6Addr: ia.Options.OneAddress().IPv6Addr})
				req.UpdateOption(out)
				send(req)
			case dhcpv6.MessageTypeReply:
				e.done <- at.Sub(e.start)
			default: // not a server's answer to a client
			}
		}
	}()

	var lat []time.Duration
	var latMu sync.Mutex
	failed := 0
	begin := time.Now()
	end := begin.Add(*dur)
	var wg sync.WaitGroup
	for range *conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				var hw [6]byte
				rand.Read(hw[:])
				hw[0] = 0x02
				e := &exchange{duid: &dhcpv6.DUIDLL{HWType: iana.HWTypeEthernet, LinkLayerAddr: hw[:]}, done: make(chan time.Duration, 1)}
				var xid dhcpv6.TransactionID
				rand.Read(xid[:])
				mu.Lock()
				pending[xid] = e
				mu.Unlock()
				e.start = time.Now()
				send(newMessage(dhcpv6.MessageTypeSolicit, e.duid, xid, *pxe))
				select {
				case d := <-e.done:
					latMu.Lock()
					lat = append(lat, d)
					latMu.Unlock()
				case <-time.After(*timeout):
					mu.Lock()
					delete(pending, xid)
					mu.Unlock()
					latMu.Lock()
					failed++
					latMu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(begin)
	conn.Close()
	slices.Sort(lat)
	pct := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(p*float64(len(lat))))]
	}
	var maxLat time.Duration
	if len(lat) > 0 {
		maxLat = lat[len(lat)-1]
	}
	fmt.Printf("leases %d failed %d in %.1fs: %.0f leases/s, SOLICIT->REPLY p50 %s p99 %s max %s\n",
		len(lat), failed, elapsed.Seconds(), float64(len(lat))/elapsed.Seconds(),
		pct(0.50).Round(10*time.Microsecond), pct(0.99).Round(10*time.Microsecond), maxLat.Round(10*time.Microsecond))
}

// newMessage is a client message with one IA_NA (IAID 1) and elapsed
// time 0; pxe adds what PXEv6 firmware sends (arch 7, option 59 asked).
func newMessage(t dhcpv6.MessageType, duid dhcpv6.DUID, xid dhcpv6.TransactionID, pxe bool) *dhcpv6.Message {
	m := &dhcpv6.Message{MessageType: t, TransactionID: xid}
	m.AddOption(dhcpv6.OptClientID(duid))
	m.AddOption(dhcpv6.OptElapsedTime(0))
	if pxe {
		m.AddOption(dhcpv6.OptClientArchType(iana.EFI_X86_64))
		m.AddOption(dhcpv6.OptRequestedOption(dhcpv6.OptionBootfileURL))
	}
	var iaid [4]byte
	binary.BigEndian.PutUint32(iaid[:], 1)
	m.AddOption(&dhcpv6.OptIANA{IaId: iaid})
	return m
}
