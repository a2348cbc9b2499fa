package e2e

import "golang.org/x/sys/unix"

func setBroadcast(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_BROADCAST, 1) }
