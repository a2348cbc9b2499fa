package lldp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mdlayher/packet"
	"golang.org/x/sys/unix"
)

// DefaultWindow is how long Listen waits when Config.Window is zero.
const DefaultWindow = 35 * time.Second

// Config configures Listen.
type Config struct {
	// Interfaces are the NICs to listen on, by name.
	Interfaces []string
	// Window bounds the wait; zero means DefaultWindow. Listen returns
	// earlier when every interface has a neighbour or ctx ends.
	Window time.Duration
	// Logger receives a line per interface that cannot be listened on
	// and per frame refused; nil discards.
	Logger *slog.Logger
}

// Listen hears LLDP frames on every interface at once and returns the
// neighbours heard, by interface name (at most MaxNeighbors each,
// distinct by chassis and port ID, in the order heard). It returns when
// every interface has at least one neighbour, when the window passes or
// when ctx ends, whichever is first; frames already heard are kept in
// every case. An interface that cannot be opened is left out and its
// error joined into the returned one; the other interfaces still count.
// It needs CAP_NET_RAW.
func Listen(ctx context.Context, cfg Config) (map[string][]Neighbor, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	window := cfg.Window
	if window <= 0 {
		window = DefaultWindow
	}
	ctx, cancel := context.WithTimeout(ctx, window)
	defer cancel()

	var (
		mu      sync.Mutex
		heard   = map[string][]Neighbor{}
		waiting = 0
		errs    []error
		wg      sync.WaitGroup
	)
	add := func(name string, n Neighbor) {
		mu.Lock()
		defer mu.Unlock()
		list := heard[name]
		if len(list) >= MaxNeighbors || slices.ContainsFunc(list, func(o Neighbor) bool { return o.key() == n.key() }) {
			return
		}
		heard[name] = append(list, n)
		if len(list) == 0 {
			if waiting--; waiting == 0 {
				cancel()
			}
		}
	}
	type socket struct {
		name string
		conn *packet.Conn
		own  net.HardwareAddr
	}
	var socks []socket
	for _, name := range slices.Compact(slices.Sorted(slices.Values(cfg.Interfaces))) {
		conn, own, err := open(name)
		if err != nil {
			errs = append(errs, err)
			log.Warn("lldp: cannot listen", "iface", name, "err", err)
			continue
		}
		socks = append(socks, socket{name, conn, own})
	}
	waiting = len(socks)
	for _, s := range socks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			read(ctx, s.conn, s.own, func(n Neighbor) { add(s.name, n) }, func(err error) {
				log.Debug("lldp: frame refused", "iface", s.name, "err", err)
			})
		}()
	}
	wg.Wait()
	return heard, errors.Join(errs...)
}

// open opens a raw socket for LLDP frames on the named interface and
// joins the LLDP multicast group, so that a NIC filtering multicast
// passes the frames up. It returns the interface's own address too.
func open(name string) (*packet.Conn, net.HardwareAddr, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return nil, nil, fmt.Errorf("lldp: %w", err)
	}
	conn, err := packet.Listen(ifi, packet.Raw, EtherType, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("lldp: listen on %s: %w", name, err)
	}
	rc, err := conn.SyscallConn()
	if err == nil {
		mreq := &unix.PacketMreq{Ifindex: int32(ifi.Index), Type: unix.PACKET_MR_MULTICAST, Alen: 6}
		copy(mreq.Address[:], Multicast)
		var serr error
		if err = rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptPacketMreq(int(fd), unix.SOL_PACKET, unix.PACKET_ADD_MEMBERSHIP, mreq)
		}); err == nil {
			err = serr
		}
	}
	if err != nil {
		_ = conn.Close()
		return nil, nil, fmt.Errorf("lldp: join %s on %s: %w", Multicast, name, err)
	}
	return conn, ifi.HardwareAddr, nil
}

// read decodes frames from conn until ctx ends, then closes it. Frames
// the interface sent itself are skipped.
func read(ctx context.Context, conn *packet.Conn, own net.HardwareAddr, heard func(Neighbor), refused func(error)) {
	stop := context.AfterFunc(ctx, func() { _ = conn.SetReadDeadline(time.Now()) })
	defer func() {
		stop()
		_ = conn.Close()
	}()
	buf := make([]byte, MaxFrame)
	for ctx.Err() == nil {
		n, _, err := conn.ReadFrom(buf)
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, os.ErrDeadlineExceeded) {
				refused(err)
				return
			}
			continue
		}
		if n >= 12 && own != nil && net.HardwareAddr(buf[6:12]).String() == own.String() {
			continue
		}
		nb, err := Decode(buf[:n])
		if err != nil {
			refused(err)
			continue
		}
		heard(nb)
	}
}

// Carrier lists the physical NICs (those with a device behind them)
// under root's sys/class/net (root "" means "/") that have carrier now,
// sorted by name: the NICs worth listening on.
func Carrier(root string) []string {
	if root == "" {
		root = "/"
	}
	dir := filepath.Join(root, "sys/class/net")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		if _, err := os.Stat(filepath.Join(dir, e.Name(), "device")); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "carrier"))
		if err == nil && strings.TrimSpace(string(b)) == "1" {
			out = append(out, e.Name())
		}
	}
	return out
}
