package e2e

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"golang.org/x/sys/unix"
)

// sniffer watches every IPv4 frame the lab bridge's own stack sends or
// receives (AF_PACKET on the bridge): what the appliance answered on the
// wire, whether anything spoke TFTP, and when the first script GET came.
type sniffer struct {
	mu          sync.Mutex
	replies     []*dhcpv4.DHCPv4 // from UDP port 67
	tftp        int              // UDP packets to or from port 69
	firstScript time.Time        // first TCP segment starting "GET /boot.ipxe"
	fd          int
	done        chan struct{}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// sniff starts a sniffer on the lab bridge; it stops when the test ends.
func (l *lab) sniff(t *testing.T) *sniffer {
	t.Helper()
	s := &sniffer{fd: -1, done: make(chan struct{})}
	inNS(t, l.ns, func() {
		ifc, err := net.InterfaceByName(l.bridge)
		if err != nil {
			t.Fatal(err)
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifc.Index}); err != nil {
			unix.Close(fd)
			t.Fatal(err)
		}
		s.fd = fd
	})
	stop := make(chan struct{})
	go s.run(stop)
	t.Cleanup(func() { close(stop); <-s.done; unix.Close(s.fd) })
	return s
}

func (s *sniffer) run(stop chan struct{}) {
	defer close(s.done)
	buf := make([]byte, 65536)
	for {
		select {
		case <-stop:
			return
		default:
		}
		// Poll first: a blocked read would not notice stop.
		if n, err := unix.Poll([]unix.PollFd{{Fd: int32(s.fd), Events: unix.POLLIN}}, 200); err != nil && !errors.Is(err, unix.EINTR) {
			return
		} else if n <= 0 {
			continue
		}
		n, _, err := unix.Recvfrom(s.fd, buf, unix.MSG_DONTWAIT)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			return
		}
		s.frame(buf[:n], time.Now())
	}
}

func (s *sniffer) frame(f []byte, at time.Time) {
	if len(f) < 14+20 || binary.BigEndian.Uint16(f[12:]) != 0x0800 {
		return
	}
	ip := f[14:]
	ihl := int(ip[0]&0x0f) * 4
	if ihl < 20 || len(ip) < ihl+8 {
		return
	}
	proto, l4 := ip[9], ip[ihl:]
	src, dst := binary.BigEndian.Uint16(l4), binary.BigEndian.Uint16(l4[2:])
	s.mu.Lock()
	defer s.mu.Unlock()
	switch proto {
	case unix.IPPROTO_UDP:
		if src == 69 || dst == 69 {
			s.tftp++
		}
		if src == dhcpv4.ServerPort {
			if m, err := dhcpv4.FromBytes(l4[8:]); err == nil {
				s.replies = append(s.replies, m)
			}
		}
	case unix.IPPROTO_TCP:
		if len(l4) < 20 {
			return
		}
		off := int(l4[12]>>4) * 4
		if off >= 20 && len(l4) > off && bytes.HasPrefix(l4[off:], []byte("GET /boot.ipxe")) && s.firstScript.IsZero() {
			s.firstScript = at
		}
	}
}

// seen returns what the sniffer has seen so far.
func (s *sniffer) seen() (replies []*dhcpv4.DHCPv4, tftp int, firstScript time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*dhcpv4.DHCPv4(nil), s.replies...), s.tftp, s.firstScript
}

// waitScript waits for the first script GET and returns when it came.
func (s *sniffer) waitScript(t *testing.T, timeout time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if _, _, at := s.seen(); !at.IsZero() {
			return at
		}
		if time.Now().After(deadline) {
			t.Fatalf("no GET /boot.ipxe on the lab bridge in %s", timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
