package dhcp

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// udpIO reads and writes a UDP socket's datagrams with raw system calls
// through the runtime's poller (syscall.RawConn): a read or write that
// would block waits in the poller as net.UDPConn's does, and the call
// itself does not enter the scheduler's syscall state.
//
// Why (bench/README.md, DHCP; commit d87f016, 2026-11-24): the socket is non-blocking,
// so recvmsg and sendto return in ~15-25 µs and the syscall state buys
// nothing. Its entry wakes the runtime's sysmon thread whenever the
// process was idle, and sysmon then polls every 20 µs until the process is
// idle again: at 2,000 leases/s, one packet every ~250 µs, that was
// ~5,000 sysmon wake-ups a second, a fifth of corrald's CPU, and on one
// pinned core every one of them is a context switch away from the
// packet path. store/bolt's committer avoids the state for the same
// reason (sync.go).
type udpIO struct {
	conn *net.UDPConn
	rc   syscall.RawConn
	// stamped: the kernel stamps each datagram's arrival (newUDPIO).
	stamped bool
}

// newUDPIO returns conn's raw reader/writer, or nil if conn is not a UDP
// socket (the callers then use conn's own methods). It asks the kernel to
// stamp each datagram with its arrival time (SO_TIMESTAMPNS), so that a
// request's wait in the socket's queue counts in the answer time
// (corral_dhcp_answer_seconds); without the stamp the read's own time
// stands in.
func newUDPIO(conn net.PacketConn) *udpIO {
	uc, ok := conn.(*net.UDPConn)
	if !ok {
		return nil
	}
	rc, err := uc.SyscallConn()
	if err != nil {
		return nil
	}
	u := &udpIO{conn: uc, rc: rc}
	_ = rc.Control(func(fd uintptr) {
		u.stamped = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_TIMESTAMPNS, 1) == nil
	})
	return u
}

// udpReader is one reading goroutine's state for udpReader.readFrom,
// kept from one datagram to the next: the callback and what it fills in
// would otherwise be three heap allocations per packet (bench/README.md,
// DHCP; commit f6413d8, 2026-11-25). msg points into the reader itself.
type udpReader struct {
	u     *udpIO
	buf   []byte
	n     uintptr
	errno syscall.Errno
	sa    syscall.RawSockaddrAny
	iov   syscall.Iovec
	msg   syscall.Msghdr
	oob   [64]byte // room for the arrival stamp's control message
	fn    func(fd uintptr) bool
}

// reader returns a reader of datagrams into buf (len(buf) > 0), for one
// goroutine.
func (u *udpIO) reader(buf []byte) *udpReader {
	r := &udpReader{u: u, buf: buf}
	r.iov.Base = &r.buf[0]
	r.iov.SetLen(len(r.buf))
	r.msg.Name = (*byte)(unsafe.Pointer(&r.sa))
	r.msg.Iov = &r.iov
	r.msg.Iovlen = 1
	r.msg.Control = &r.oob[0]
	r.fn = r.recvmsg
	return r
}

// recvmsg is the RawConn callback: false asks the poller to wait.
func (r *udpReader) recvmsg(fd uintptr) bool {
	for {
		// The kernel writes back how much of each it filled.
		r.msg.Namelen = syscall.SizeofSockaddrAny
		r.msg.SetControllen(len(r.oob))
		r.n, _, r.errno = syscall.RawSyscall(syscall.SYS_RECVMSG, fd, uintptr(unsafe.Pointer(&r.msg)), 0)
		switch r.errno {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false // wait for the poller
		default:
			// Done: success, or an error the caller reads from errno.
		}
		return true
	}
}

// readFrom reads one datagram into the reader's buffer and returns its
// length, source and arrival time (the kernel's stamp, else now). It
// blocks until one arrives or the socket is closed.
func (r *udpReader) readFrom() (int, netip.AddrPort, time.Time, error) {
	if err := r.u.rc.Read(r.fn); err != nil {
		return 0, netip.AddrPort{}, time.Time{}, err
	}
	if r.errno != 0 {
		return 0, netip.AddrPort{}, time.Time{}, &net.OpError{Op: "read", Net: "udp", Source: r.u.conn.LocalAddr(), Err: r.errno}
	}
	return int(r.n), sockaddrAddrPort(&r.sa), r.arrival(), nil
}

// arrival is the datagram's SO_TIMESTAMPNS stamp, or now when the kernel
// gave none (not asked for, or the control buffer was cut short).
func (r *udpReader) arrival() time.Time {
	if r.u.stamped && r.msg.Flags&syscall.MSG_CTRUNC == 0 && int(r.msg.Controllen) >= syscall.CmsgLen(int(unsafe.Sizeof(syscall.Timespec{}))) {
		h := (*syscall.Cmsghdr)(unsafe.Pointer(&r.oob[0]))
		if h.Level == syscall.SOL_SOCKET && h.Type == syscall.SCM_TIMESTAMPNS {
			ts := (*syscall.Timespec)(unsafe.Pointer(&r.oob[syscall.CmsgLen(0)]))
			return time.Unix(ts.Sec, ts.Nsec)
		}
	}
	return time.Now()
}

// sockaddrAddrPort decodes an IPv4 or IPv6 socket address (the zero
// AddrPort for any other family).
func sockaddrAddrPort(sa *syscall.RawSockaddrAny) netip.AddrPort {
	switch sa.Addr.Family {
	case syscall.AF_INET:
		p := (*syscall.RawSockaddrInet4)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom4(p.Addr), netPort(p.Port))
	case syscall.AF_INET6:
		p := (*syscall.RawSockaddrInet6)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom16(p.Addr).Unmap(), netPort(p.Port))
	}
	return netip.AddrPort{}
}

// netPort reads a port kept in network byte order.
func netPort(p uint16) uint16 {
	b := (*[2]byte)(unsafe.Pointer(&p))
	return uint16(b[0])<<8 | uint16(b[1])
}

// udpWriter is one udpIO.writeTo call's state; writers are pooled, for
// the same reason as udpReader (writes come from many handlers at once).
type udpWriter struct {
	b     []byte
	sa    syscall.RawSockaddrInet4
	n     uintptr
	errno syscall.Errno
	fn    func(fd uintptr) bool
}

var writerPool = sync.Pool{New: func() any {
	w := &udpWriter{}
	w.fn = w.sendto
	return w
}}

// sendto is the RawConn callback: false asks the poller to wait.
func (w *udpWriter) sendto(fd uintptr) bool {
	for {
		w.n, _, w.errno = syscall.RawSyscall6(syscall.SYS_SENDTO, fd,
			uintptr(unsafe.Pointer(&w.b[0])), uintptr(len(w.b)), 0,
			uintptr(unsafe.Pointer(&w.sa)), syscall.SizeofSockaddrInet4)
		switch w.errno {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		default:
			// Done: success, or an error the caller reads from errno.
		}
		return true
	}
}

// writeTo sends b (len(b) > 0) to an IPv4 destination, blocking while the
// socket's send buffer is full. Other destinations (and none) go through
// the UDPConn, which refuses what it cannot send.
func (u *udpIO) writeTo(b []byte, dst *net.UDPAddr) error {
	var ip4 net.IP
	if dst != nil {
		ip4 = dst.IP.To4()
	}
	if ip4 == nil || dst.Port <= 0 || dst.Port > 0xffff {
		_, err := u.conn.WriteTo(b, dst)
		return err
	}
	w := writerPool.Get().(*udpWriter)
	w.b = b
	w.sa = syscall.RawSockaddrInet4{Family: syscall.AF_INET}
	pb := (*[2]byte)(unsafe.Pointer(&w.sa.Port))
	pb[0], pb[1] = byte(dst.Port>>8), byte(dst.Port)
	copy(w.sa.Addr[:], ip4)
	err := u.rc.Write(w.fn)
	if err == nil && w.errno != 0 {
		err = &net.OpError{Op: "write", Net: "udp", Source: u.conn.LocalAddr(), Addr: dst, Err: w.errno}
	}
	if err == nil && int(w.n) != len(b) {
		err = fmt.Errorf("udp write to %s: sent %d of %d bytes", dst, w.n, len(b))
	}
	w.b, w.n, w.errno = nil, 0, 0
	writerPool.Put(w)
	return err
}
