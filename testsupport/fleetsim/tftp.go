package fleetsim

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"time"
)

// TFTP opcodes (RFC 1350, 2347).
const (
	tftpRRQ   = 1
	tftpDATA  = 3
	tftpACK   = 4
	tftpERROR = 5
	tftpOACK  = 6
)

// tftpBlockSize is what firmware asks for (the largest that fits an
// Ethernet frame; corrald caps it there too).
const tftpBlockSize = 1468

// tftpGet fetches file from server:69 as PXE firmware does: RRQ with
// blksize and tsize, lock-step ACKs from the machine's address, each
// packet retransmitted after timeout up to 5 times. It returns the bytes
// received.
func (n *netNS) tftpGet(ctx context.Context, from netip.Addr, server netip.Addr, file string, timeout time.Duration) (int64, error) {
	var conn *net.UDPConn
	err := n.do(func() error {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: from.AsSlice()})
		conn = c
		return err
	})
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	// A deadline fails only on a closed socket, whose read fails anyway.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetReadDeadline(time.Now()) })
	defer stop()

	var rrq bytes.Buffer
	rrq.Write([]byte{0, tftpRRQ})
	for _, s := range []string{file, "octet", "blksize", strconv.Itoa(tftpBlockSize), "tsize", "0"} {
		rrq.WriteString(s)
		rrq.WriteByte(0)
	}
	last := rrq.Bytes()
	dst := &net.UDPAddr{IP: server.AsSlice(), Port: 69}
	var peer *net.UDPAddr // the server's transfer port (TID)
	blk := 512
	var got int64
	next := uint16(1)
	buf := make([]byte, 65536)
	tries := 0
	send := func(b []byte) error {
		to := dst
		if peer != nil {
			to = peer
		}
		_, err := conn.WriteToUDP(b, to)
		return err
	}
	ack := func(b uint16) []byte { return []byte{0, tftpACK, byte(b >> 8), byte(b)} }
	if err := send(last); err != nil {
		return 0, err
	}
	for {
		_ = conn.SetReadDeadline(time.Now().Add(timeout)) // see the AfterFunc above
		nr, from, err := conn.ReadFromUDP(buf)
		if err != nil {
			if ctx.Err() != nil {
				return got, ctx.Err()
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				if tries++; tries > 5 {
					return got, errors.New("tftp: timeout")
				}
				if err := send(last); err != nil {
					return got, err
				}
				continue
			}
			return got, err
		}
		if nr < 4 || !from.IP.Equal(dst.IP) || (peer != nil && from.Port != peer.Port) {
			continue
		}
		if peer == nil {
			peer = from
		}
		op, arg := binary.BigEndian.Uint16(buf[:2]), binary.BigEndian.Uint16(buf[2:4])
		switch op {
		case tftpERROR:
			return got, fmt.Errorf("tftp: error %d: %s", arg, bytes.TrimRight(buf[4:nr], "\x00"))
		case tftpOACK:
			opts := bytes.Split(bytes.TrimRight(buf[2:nr], "\x00"), []byte{0})
			for i := 0; i+1 < len(opts); i += 2 {
				if string(bytes.ToLower(opts[i])) == "blksize" {
					if v, err := strconv.Atoi(string(opts[i+1])); err == nil {
						blk = v
					}
				}
			}
			last, tries = ack(0), 0
		case tftpDATA:
			switch arg {
			case next:
				got += int64(nr - 4)
				last, tries = ack(arg), 0
				next++
				if nr-4 < blk {
					return got, send(last)
				}
			case next - 1:
				// Our ACK was lost: say it again.
			default:
				continue
			}
		default:
			continue
		}
		if err := send(last); err != nil {
			return got, err
		}
	}
}
