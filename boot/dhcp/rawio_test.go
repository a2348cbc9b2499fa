package dhcp

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"
)

// TestUDPIO: the raw reader returns each datagram with its source address
// and port, the raw writer delivers to an IPv4 destination from the
// socket's own address, an IPv6 destination goes through the UDPConn, and
// a read on a closed socket returns net.ErrClosed instead of blocking.
func TestUDPIO(t *testing.T) {
	srv, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	peer, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	u := newUDPIO(srv)
	if u == nil {
		t.Fatal("newUDPIO of a UDP socket returned nil")
	}
	if newUDPIO(nil) != nil {
		t.Error("newUDPIO of a non-UDP conn is not nil")
	}

	// Read: several datagrams, each whole, with the peer's address and
	// the kernel's stamp of its arrival: each waits 30 ms in the queue
	// before it is read, and the stamp says so (a read's own time would
	// not).
	if !u.stamped {
		t.Error("the socket does not stamp arrivals (SO_TIMESTAMPNS)")
	}
	buf := make([]byte, 4096)
	rd := u.reader(buf) // one reader for every datagram, as serve has
	for _, msg := range [][]byte{[]byte("discover"), bytes.Repeat([]byte{0xa5}, 1400), {0}} {
		// The stamp lies between the send and the start of the read:
		// a read's own time would come after readStart. A loaded
		// machine may queue the datagram late (loopback delivery
		// deferred to ksoftirqd), so "after the send" has no upper
		// bound but the read; when it came in time, the stamp must show
		// its 30 ms in the queue.
		before := time.Now().Round(0)
		if _, err := peer.WriteToUDP(msg, srv.LocalAddr().(*net.UDPAddr)); err != nil {
			t.Fatal(err)
		}
		after := time.Now().Round(0)
		time.Sleep(30 * time.Millisecond)
		readStart := time.Now().Round(0)
		n, from, arrived, err := rd.readFrom()
		if err != nil {
			t.Fatal(err)
		}
		inTime := !arrived.After(after.Add(time.Millisecond))
		if arrived.Before(before.Add(-time.Millisecond)) || arrived.After(readStart) || (inTime && readStart.Sub(arrived) < 25*time.Millisecond) {
			t.Errorf("arrival %s: %s after the send began, %s before the read began; want it stamped between the send and the read", arrived, arrived.Sub(before), readStart.Sub(arrived))
		}
		if !bytes.Equal(buf[:n], msg) {
			t.Errorf("read %d bytes %.16x, want %d bytes %.16x", n, buf[:n], len(msg), msg)
		}
		if want := peer.LocalAddr().(*net.UDPAddr).AddrPort(); from != want {
			t.Errorf("source %s, want %s", from, want)
		}
	}

	// Write: the peer receives it from the server's address and port.
	msg := []byte("offer")
	if err := u.writeTo(msg, peer.LocalAddr().(*net.UDPAddr)); err != nil {
		t.Fatal(err)
	}
	peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, from, err := peer.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf[:n], msg) {
		t.Errorf("peer got %q, want %q", buf[:n], msg)
	}
	if want := srv.LocalAddr().(*net.UDPAddr).AddrPort(); from != want {
		t.Errorf("peer got it from %s, want %s", from, want)
	}

	// An IPv6 destination on an IPv4 socket: the UDPConn's error, not a
	// datagram to a mangled address.
	if err := u.writeTo(msg, &net.UDPAddr{IP: net.IPv6loopback, Port: 9}); err == nil {
		t.Error("write to an IPv6 address from an IPv4 socket succeeded")
	}

	if err := u.writeTo(msg, nil); err == nil {
		t.Error("write to no address succeeded")
	}

	// Closed while a read waits: the read returns.
	done := make(chan error, 1)
	go func() { _, _, _, err := u.reader(buf).readFrom(); done <- err }()
	time.Sleep(20 * time.Millisecond)
	srv.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("read on a closed socket: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a read on a closed socket did not return")
	}
}

// TestSockaddrAddrPort decodes both families' socket addresses, ports in
// network byte order.
func TestSockaddrAddrPort(t *testing.T) {
	six, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6loopback})
	if err != nil {
		t.Skip("no IPv6 loopback here:", err)
	}
	defer six.Close()
	peer, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6loopback})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	if _, err := peer.WriteToUDP([]byte("x"), six.LocalAddr().(*net.UDPAddr)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	_, from, _, err := newUDPIO(six).reader(buf).readFrom()
	if err != nil {
		t.Fatal(err)
	}
	if want := netip.AddrPortFrom(netip.IPv6Loopback(), uint16(peer.LocalAddr().(*net.UDPAddr).Port)); from != want {
		t.Errorf("IPv6 source %s, want %s", from, want)
	}
}
