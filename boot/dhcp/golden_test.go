package dhcp

import (
	"flag"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/insomniacslk/dhcp/dhcpv4"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// recorder is a Recorder that keeps every event in order (the timeline
// as written, synchronously).
type recorder struct {
	mu  sync.Mutex
	out []string
}

func (r *recorder) Event(mac, source, event, detail string, attrs map[string]string) {
	var b strings.Builder
	fmt.Fprintf(&b, "  event %s %s %s %q", mac, source, event, detail)
	for _, k := range slices.Sorted(maps.Keys(attrs)) {
		fmt.Fprintf(&b, " %s=%q", k, attrs[k])
	}
	r.mu.Lock()
	r.out = append(r.out, b.String())
	r.mu.Unlock()
}

func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.out
	r.out = nil
	return out
}

// TestGoldenExchanges pins the exact reply bytes, destinations and
// timeline entries of a fixed script of exchanges (every client kind,
// every request state, relayed and not, NAKs, DECLINE, RELEASE, INFORM,
// proxy mode, port 4011), so that work on the hot path's allocations
// cannot change an answer or a timeline entry unnoticed. Refresh with
// go test -run TestGoldenExchanges -update ./boot/dhcp/ after an
// intended change, and read the diff.
func TestGoldenExchanges(t *testing.T) {
	clock := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	now := func() time.Time { return clock }
	var got []string
	for _, mode := range []Mode{ModeFull, ModeProxy} {
		rec := &recorder{}
		f := newFixture(t, mode, func(c *Config) { c.Now, c.Timeline = now, rec })
		xid := uint32(0x1000)
		step := func(name string, m *dhcpv4.DHCPv4, port int) *dhcpv4.DHCPv4 {
			t.Helper()
			xid++
			m.TransactionID = dhcpv4.TransactionID{byte(xid >> 24), byte(xid >> 16), byte(xid >> 8), byte(xid)}
			p, err := dhcpv4.FromBytes(m.ToBytes())
			if err != nil {
				t.Fatal(err)
			}
			rep, dst := f.s.Respond(f.ctx, p, nil, port)
			line := fmt.Sprintf("%s %s: ", mode, name)
			if rep == nil {
				line += "no reply"
			} else {
				line += fmt.Sprintf("%s to %v\n  %x", rep.MessageType(), dst, rep.ToBytes())
			}
			got = append(got, line)
			got = append(got, rec.take()...)
			return rep
		}
		req := func(offer *dhcpv4.DHCPv4, kind func(*dhcpv4.DHCPv4), mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
			t.Helper()
			r, err := dhcpv4.NewRequestFromOffer(offer, mods...)
			if err != nil {
				t.Fatal(err)
			}
			kind(r)
			return r
		}
		kinds := []struct {
			name string
			kind func(*dhcpv4.DHCPv4)
		}{{"plain", plain}, {"bios", biosPXE}, {"efi", efiPXE}, {"ipxe", ipxeClient}, {"http", httpClient}}
		for i, k := range kinds {
			for _, via := range []bool{false, true} {
				hw := mac(0x700 + 2*i + map[bool]int{false: 0, true: 1}[via])
				name := fmt.Sprintf("%s relayed=%v", k.name, via)
				o := step(name+" DISCOVER", discover(t, hw, k.kind, relayed(via)), dhcpv4.ServerPort)
				if o == nil {
					continue
				}
				a := step(name+" REQUEST", req(o, k.kind, relayed(via)), dhcpv4.ServerPort)
				if a == nil || a.MessageType() != dhcpv4.MessageTypeAck {
					continue
				}
				ip := a.YourIPAddr
				rn := renew(hw, ip)
				relayed(via)(rn)
				step(name+" RENEW", rn, dhcpv4.ServerPort)
				step(name+" INIT-REBOOT", initReboot(hw, ip), dhcpv4.ServerPort)
				step(name+" port 4011", req(o, k.kind), PXEPort)
			}
		}
		if mode == ModeFull {
			hw, other := mac(0x7a0), mac(0x7a1)
			o := step("selecting DISCOVER", discover(t, hw, biosPXE), dhcpv4.ServerPort)
			step("selecting wrong address", selecting(hw, net.IPv4(10, 0, 0, 150)), dhcpv4.ServerPort)
			step("selecting out of range", selecting(hw, net.IPv4(10, 0, 0, 20)), dhcpv4.ServerPort)
			other4 := selecting(hw, o.YourIPAddr)
			other4.UpdateOption(dhcpv4.OptServerIdentifier(net.IPv4(10, 0, 0, 2)))
			step("selecting another server", other4, dhcpv4.ServerPort)
			step("init-reboot unknown in subnet", initReboot(other, net.IPv4(10, 0, 0, 20)), dhcpv4.ServerPort)
			step("init-reboot unknown in range", initReboot(other, net.IPv4(10, 0, 0, 180)), dhcpv4.ServerPort)
			step("init-reboot other subnet", initReboot(other, net.IPv4(10, 9, 0, 100)), dhcpv4.ServerPort)
			step("renew not ours", renew(other, o.YourIPAddr), dhcpv4.ServerPort)
			step("decline by stranger", decline(other, o.YourIPAddr), dhcpv4.ServerPort)
			step("decline by holder", decline(hw, o.YourIPAddr), dhcpv4.ServerPort)
			step("DISCOVER after decline", discover(t, hw, biosPXE), dhcpv4.ServerPort)
			a := step("plain DORA", req(step("plain DISCOVER", discover(t, other, plain), dhcpv4.ServerPort), plain), dhcpv4.ServerPort)
			rel, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRelease), dhcpv4.WithHwAddr(other), dhcpv4.WithClientIP(a.YourIPAddr))
			step("release", rel, dhcpv4.ServerPort)
			norel, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRelease), dhcpv4.WithHwAddr(other))
			step("release without ciaddr", norel, dhcpv4.ServerPort)
			inf, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeInform), dhcpv4.WithHwAddr(hw), dhcpv4.WithClientIP(net.IPv4(10, 0, 0, 50)))
			biosPXE(inf)
			step("inform", inf, dhcpv4.ServerPort)
			step("unknown relay", discover(t, mac(0x7a2), biosPXE, dhcpv4.WithGatewayIP(net.IPv4(172, 16, 0, 1))), dhcpv4.ServerPort)
			bootp, _ := dhcpv4.New(dhcpv4.WithHwAddr(mac(0x7a3)))
			bootp.Options = dhcpv4.Options{}
			step("bootp", bootp, dhcpv4.ServerPort)
			off, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeOffer), dhcpv4.WithHwAddr(mac(0x7a4)))
			off.OpCode = dhcpv4.OpcodeBootRequest
			step("offer from a client", off, dhcpv4.ServerPort)
			d := discover(t, mac(0x7a5), biosPXE)
			step("DISCOVER on 4011", d, PXEPort)
		}
	}
	file := filepath.Join("testdata", "exchanges.golden")
	text := strings.Join(got, "\n") + "\n"
	if *update {
		if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(want), text); diff != "" {
		t.Errorf("exchanges differ from %s (-want +got):\n%s", file, diff)
	}
}
