package tftp

import (
	"bytes"
	"context"
	"encoding/binary"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralhq/corral/images"
	"github.com/corralhq/corral/testsupport/syncbuf"
)

// rawClient speaks TFTP by hand from a chosen loopback address, so a test
// can hold a transfer open (never ACK) or ACK slowly.
type rawClient struct {
	t    *testing.T
	conn *net.UDPConn
	peer *net.UDPAddr // the transfer's port, once the server answered
}

func newRawClient(t *testing.T, from string) *rawClient {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(from)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawClient{t: t, conn: c}
}

// packet is a TFTP packet read back: DATA (3) with block, or ERROR (5)
// with code and message.
type packet struct {
	op, num uint16
	msg     string
	data    int
}

func (c *rawClient) rrq(server, file string) packet {
	c.t.Helper()
	b := []byte{0, 1}
	b = append(append(b, file...), 0)
	b = append(append(b, "octet"...), 0)
	addr, _ := net.ResolveUDPAddr("udp4", server)
	if _, err := c.conn.WriteToUDP(b, addr); err != nil {
		c.t.Fatal(err)
	}
	return c.read()
}

func (c *rawClient) read() packet {
	c.t.Helper()
	buf := make([]byte, 2048)
	c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, from, err := c.conn.ReadFromUDP(buf)
	if err != nil {
		c.t.Fatalf("no answer: %v", err)
	}
	c.peer = from
	p := packet{op: binary.BigEndian.Uint16(buf), num: binary.BigEndian.Uint16(buf[2:])}
	switch p.op {
	case 3:
		p.data = n - 4
	case 5:
		p.msg = string(bytes.TrimRight(buf[4:n], "\x00"))
	}
	return p
}

func (c *rawClient) ack(block uint16) {
	b := []byte{0, 4, 0, 0}
	binary.BigEndian.PutUint16(b[2:], block)
	c.conn.WriteToUDP(b, c.peer)
}

// abort ends the client's transfer with an ERROR packet, as a client that
// gives up does; the server frees the slot.
func (c *rawClient) abort() {
	c.conn.WriteToUDP([]byte{0, 5, 0, 0, 'b', 'y', 'e', 0}, c.peer)
}

func startLimited(t *testing.T, lim Limits) (string, *syncbuf.Buffer, *recorder) {
	t.Helper()
	cat, _ := testCatalog(t)
	logs, rec := &syncbuf.Buffer{}, &recorder{}
	s, err := New(Config{Listen: "127.0.0.1:0", Catalog: cat, Timeline: rec, MACs: macs{}, Limits: lim,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		if t.Failed() {
			t.Logf("server logs:\n%s", logs)
		}
	})
	return s.Addr().String(), logs, rec
}

// TestTransferCaps: transfers held open (DATA 1 never ACKed) count against
// the caps; a request over a cap gets an ERROR packet naming it, at once;
// once the holders give up, the same address is served again.
func TestTransferCaps(t *testing.T) {
	// Held transfers would last Timeout × (Retries+1) = 6 s: the test ends
	// them itself.
	addr, logs, rec := startLimited(t, Limits{Timeout: time.Second, Retries: 5, MaxTransfers: 3, MaxTransfersPerIP: 2})
	var held []*rawClient
	hold := func(from string) {
		c := newRawClient(t, from)
		if p := c.rrq(addr, images.IPXEEFI); p.op != 3 || p.num != 1 {
			t.Fatalf("from %s: %+v, want DATA 1", from, p)
		}
		held = append(held, c)
	}
	hold("127.0.0.1")
	hold("127.0.0.1")
	want := packet{op: 5, num: 1, msg: "too many transfers from 127.0.0.1 (limit 2), retry later"}
	if got := newRawClient(t, "127.0.0.1").rrq(addr, images.IPXEEFI); !cmp.Equal(want, got, cmp.AllowUnexported(packet{})) {
		t.Errorf("third from one address: got %+v, want %+v", got, want)
	}
	hold("127.0.0.2") // a third address: within the total
	if got := newRawClient(t, "127.0.0.3").rrq(addr, images.IPXEEFI); got.op != 5 || got.msg != "server busy: 3 transfers running (limit 3), retry later" {
		t.Errorf("over the total: %+v", got)
	}
	if !strings.Contains(logs.String(), "tftp transfer refused: limit reached") {
		t.Errorf("no log line for the refusals:\n%s", logs)
	}
	for _, c := range held {
		c.abort()
	}
	// The slots come back: a whole transfer from the first address works.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, _, err := fetch(t, addr, images.UndionlyKPXE, 0, false); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("not served after the holders left: %v", err)
		}
	}
	time.Sleep(50 * time.Millisecond)
	if !strings.Contains(rec.all(), "tftp-refused ipxe.efi") {
		t.Errorf("refusals not on the timeline:\n%s", rec.all())
	}
}

// TestTransferTimeout: a client that ACKs every block just in time is cut
// at TransferTimeout with an ERROR packet.
func TestTransferTimeout(t *testing.T) {
	addr, logs, _ := startLimited(t, Limits{Timeout: time.Second, Retries: 2, TransferTimeout: 400 * time.Millisecond})
	c := newRawClient(t, "127.0.0.1")
	p := c.rrq(addr, images.IPXEEFI)
	for p.op == 3 {
		time.Sleep(100 * time.Millisecond) // well within the 1 s block timeout
		c.ack(p.num)
		p = c.read()
	}
	if p.op != 5 || !strings.Contains(p.msg, "transfer took too long (limit 400ms)") {
		t.Fatalf("got %+v, want an ERROR naming the transfer timeout", p)
	}
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(logs.String(), "tftp transfer cut: too slow"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no log line:\n%s", logs)
		}
	}
}

func TestTFTPLimitsDefaultsAndValidate(t *testing.T) {
	d := DefaultLimits()
	if got := (Limits{MaxTransfers: 9, Retries: -1}).WithDefaults(); got.MaxTransfers != 9 || got.Retries != d.Retries || got.TransferTimeout != d.TransferTimeout {
		t.Errorf("WithDefaults = %+v", got)
	}
	for name, tc := range map[string]struct {
		lim  Limits
		want string
	}{
		"zero":             {},
		"defaults":         {lim: d},
		"negative timeout": {lim: Limits{TransferTimeout: -time.Second}, want: "--tftp-transfer-timeout -1s: want a positive duration"},
		"negative retries": {lim: Limits{Retries: -2}, want: "--tftp-retries -2: want a positive number"},
		"per ip above total": {lim: Limits{MaxTransfers: 2, MaxTransfersPerIP: 3},
			want: "--tftp-max-transfers-per-ip 3 is above --tftp-max-transfers 2"},
	} {
		t.Run(name, func(t *testing.T) {
			got := ""
			if err := tc.lim.Validate(); err != nil {
				got = err.Error()
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Validate (-want +got):\n%s", diff)
			}
		})
	}
}
