package coldplug

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// ueventBuffer bounds the socket's receive queue: a boot's coldplug sees
// a few hundred uevents of a few hundred bytes each. When it overflows,
// the next read reports ENOBUFS and Run falls back to a full sysfs scan.
const ueventBuffer = 1 << 20

// ueventSocket is a NETLINK_KOBJECT_UEVENT socket subscribed to the
// kernel's uevent group: every device the kernel adds is announced on it
// with its MODALIAS, as udev learns of it.
type ueventSocket struct {
	f   *os.File
	buf []byte
}

// ListenUevents opens the kernel's uevent socket. It needs root (or
// CAP_NET_ADMIN in the initial network namespace).
func ListenUevents() (Events, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_KOBJECT_UEVENT)
	if err != nil {
		return nil, fmt.Errorf("uevent socket: %w", err)
	}
	// Best effort (FORCE passes rmem_max as root): without it the default
	// queue (~200 KB) still holds a boot's events, and an overflow is
	// detected.
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, ueventBuffer) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, ueventBuffer)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("uevent socket: bind: %w", err)
	}
	// A non-blocking descriptor joins Go's poller: reads honour deadlines.
	return &ueventSocket{f: os.NewFile(uintptr(fd), "uevent"), buf: make([]byte, 64*1024)}, nil
}

// Next implements Events. Messages not from the kernel (sender port 0),
// such as udev's re-broadcasts, are skipped.
func (u *ueventSocket) Next(deadline time.Time) (Uevent, error) {
	if err := u.f.SetReadDeadline(deadline); err != nil {
		return Uevent{}, err
	}
	rc, err := u.f.SyscallConn()
	if err != nil {
		return Uevent{}, err
	}
	for {
		var n int
		var from unix.Sockaddr
		var rerr error
		err := rc.Read(func(fd uintptr) bool {
			n, from, rerr = unix.Recvfrom(int(fd), u.buf, 0)
			return !errors.Is(rerr, unix.EAGAIN)
		})
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			return Uevent{}, ErrNoEvent
		case err != nil:
			return Uevent{}, err
		case errors.Is(rerr, unix.ENOBUFS):
			return Uevent{}, ErrOverflow
		case rerr != nil:
			return Uevent{}, rerr
		}
		if nl, ok := from.(*unix.SockaddrNetlink); !ok || nl.Pid != 0 {
			continue
		}
		if ev, ok := ParseUevent(u.buf[:n]); ok {
			return ev, nil
		}
	}
}

// Close implements Events.
func (u *ueventSocket) Close() error { return u.f.Close() }
