package connlimit

import (
	"net"

	"golang.org/x/sys/unix"
)

// unacked is how many bytes written to c the peer has not acknowledged
// yet, sent or not (SIOCOUTQ).
func unacked(c *net.TCPConn) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n int
	var ioErr error
	if err := raw.Control(func(fd uintptr) { n, ioErr = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) }); err != nil {
		return 0, err
	}
	return n, ioErr
}
