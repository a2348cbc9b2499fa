//go:build !linux

package connlimit

import (
	"errors"
	"net"
)

// unacked is not known off Linux: ResetOnClose then closes as usual.
func unacked(*net.TCPConn) (int, error) {
	return 0, errors.ErrUnsupported
}
