package dhcp

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/insomniacslk/dhcp/dhcpv4"
)

type fakeObserver struct {
	mu       sync.Mutex
	seen     map[[2]string]int
	answered map[string][]time.Duration
}

func (o *fakeObserver) Answered(msgType string, took time.Duration) {
	o.mu.Lock()
	if o.answered == nil {
		o.answered = map[string][]time.Duration{}
	}
	o.answered[msgType] = append(o.answered[msgType], took)
	o.mu.Unlock()
}

func (o *fakeObserver) Packet(msgType, outcome string) {
	o.mu.Lock()
	o.seen[[2]string{msgType, outcome}]++
	o.mu.Unlock()
}

// TestObserver: every packet the running server receives is reported once
// by message type and outcome: a PXE DISCOVER answered, a RELEASE without
// an address ignored, and bytes that are no DHCP packet malformed. Only the
// answered one reports an answer time, measured from its read.
func TestObserver(t *testing.T) {
	o := &fakeObserver{seen: map[[2]string]int{}}
	f := newFixture(t, ModeFull, func(c *Config) { c.Observer = o })
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan error, 1)
	go func() { done <- f.s.Run(ctx) }()
	defer func() { cancel(); <-done }()

	cl, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	d := discover(t, mac(1), biosPXE)
	rel, err := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRelease), dhcpv4.WithHwAddr(mac(2)))
	if err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	for _, b := range [][]byte{d.ToBytes(), rel.ToBytes(), []byte("not a DHCP packet")} {
		if _, err := cl.WriteTo(b, f.s.Addr()); err != nil {
			t.Fatal(err)
		}
	}
	want := map[[2]string]int{{"discover", OutcomeOffer}: 1, {"release", OutcomeIgnored}: 1, {"unknown", OutcomeMalformed}: 1}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		o.mu.Lock()
		ok := cmp.Equal(want, o.seen)
		o.mu.Unlock()
		if ok {
			o.mu.Lock()
			defer o.mu.Unlock()
			if len(o.answered) != 1 || len(o.answered["discover"]) != 1 {
				t.Fatalf("answer times %v, want one for the discover", o.answered)
			}
			if took := o.answered["discover"][0]; took <= 0 || took > time.Since(sent) {
				t.Errorf("the discover's answer took %s, want more than 0 and at most the %s since it was sent", took, time.Since(sent))
			}
			return
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	t.Errorf("observed (-want +got):\n%s", cmp.Diff(want, o.seen))
}

func TestMessageTypeName(t *testing.T) {
	for mt, want := range map[dhcpv4.MessageType]string{
		dhcpv4.MessageTypeNone: "none", dhcpv4.MessageTypeDiscover: "discover", dhcpv4.MessageTypeInform: "inform",
		dhcpv4.MessageTypeAck: "ack", dhcpv4.MessageType(200): "other",
	} {
		if got := MessageTypeName(mt); got != want {
			t.Errorf("MessageTypeName(%d) = %q, want %q", mt, got, want)
		}
	}
}

// TestAnsweredNeverNegative: an arrival stamp later than now (the wall
// clock stepped back after the kernel stamped the request) is reported
// as no wait, not a negative one.
func TestAnsweredNeverNegative(t *testing.T) {
	o := &fakeObserver{seen: map[[2]string]int{}}
	f := newFixture(t, ModeFull, func(c *Config) { c.Observer = o })
	conn, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	f.s.handle(job{conn: conn, up: &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 68},
		m: discover(t, mac(3), biosPXE), port: dhcpv4.ServerPort, read: time.Now().Add(time.Hour)})
	o.mu.Lock()
	defer o.mu.Unlock()
	if got := o.answered["discover"]; len(got) != 1 || got[0] != 0 {
		t.Errorf("answer times %v, want one of 0", got)
	}
}
