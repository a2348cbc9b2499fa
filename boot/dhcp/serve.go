package dhcp

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"
	"golang.org/x/sys/unix"

	"github.com/corralhq/corral/store"
)

// InterfaceIPv4 returns the first IPv4 address of an interface.
func InterfaceIPv4(name string) (netip.Addr, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("dhcp: interface %q: %w", name, err)
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("dhcp: interface %q: %w", name, err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP.To4()); ok && n.IP.To4() != nil {
				return ip, nil
			}
		}
	}
	return netip.Addr{}, fmt.Errorf("dhcp: interface %q has no IPv4 address", name)
}

// InterfacePrefix returns the IPv4 prefix of name that contains ip.
func InterfacePrefix(name string, ip netip.Addr) (netip.Prefix, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("interface %q: %w", name, err)
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return netip.Prefix{}, err
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil {
			ones, _ := n.Mask.Size()
			a4, _ := netip.AddrFromSlice(n.IP.To4())
			p := netip.PrefixFrom(a4, ones).Masked()
			if p.Contains(ip) {
				return p, nil
			}
		}
	}
	return netip.Prefix{}, fmt.Errorf("interface %q has no IPv4 network containing %s", name, ip)
}

// listen binds an interface-bound UDP socket with a large receive buffer.
func (s *Server) listen(port int) (net.PacketConn, error) {
	c, err := server4.NewIPv4UDPConn(s.cfg.Interface, &net.UDPAddr{Port: port})
	if err != nil {
		return nil, fmt.Errorf("dhcp: listen on %s port %d: %w", s.cfg.Interface, port, err)
	}
	SetReadBuffer(c, s.cfg.ReadBuffer, s.log)
	return c, nil
}

// SetReadBuffer raises a UDP socket's receive buffer to size: with
// SO_RCVBUFFORCE (root, past net.core.rmem_max) or else as far as
// rmem_max allows.
func SetReadBuffer(c *net.UDPConn, size int, log *slog.Logger) {
	rc, err := c.SyscallConn()
	if err == nil {
		var serr error
		cerr := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, size) })
		if cerr == nil && serr == nil {
			return
		}
	}
	if err := c.SetReadBuffer(size); err != nil {
		log.Warn("cannot raise the DHCP receive buffer", "bytes", size, "err", err)
	}
}

// Run serves until ctx ends, waits for handlers in flight and returns nil.
// In full mode it also follows the leases other appliances sharing the
// store write (see leases).
func (s *Server) Run(ctx context.Context) error {
	s.log.Info("serving DHCP", "mode", string(s.cfg.Mode), "interface", s.cfg.Interface, "server_ip", s.cfg.ServerIP.String(), "ranges", fmt.Sprint(s.cfg.Ranges))
	s.bound.Store(newBound(ctx)) // ctx's values, not its end
	var wg sync.WaitGroup
	errc := make(chan error, 2)
	serve := func(conn net.PacketConn, port int) {
		defer wg.Done()
		err := s.serve(conn, port)
		if ctx.Err() == nil {
			errc <- fmt.Errorf("dhcp: port %d: %w", port, err)
		}
	}
	wctx, stopWorkers := context.WithCancel(ctx) // also when a socket fails
	defer stopWorkers()
	for range min(workers, s.cfg.MaxInFlight) {
		wg.Add(1)
		go func() { defer wg.Done(); s.worker(wctx) }()
	}
	wg.Add(1)
	go serve(s.conn, dhcpv4.ServerPort)
	if s.cfg.Mode == ModeFull && !s.cfg.Alone {
		// Other appliances on the store may bind addresses of our ranges.
		wg.Add(1)
		go func() { defer wg.Done(); s.leases.follow(ctx) }()
	}
	if s.pxe != nil {
		wg.Add(1)
		go serve(s.pxe, PXEPort)
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	s.conn.Close()
	if s.pxe != nil {
		s.pxe.Close()
	}
	stopWorkers()
	wg.Wait()
	s.handlers.Wait()
	return err
}

// serve reads packets from conn until it fails (closed by Run) and hands
// each to a handler goroutine (dispatch bounds them). It replaces
// server4.Server.Serve, which allocated a 4 KiB buffer and formatted a
// debug line per packet: the buffer here is reused (dhcpv4.FromBytes
// copies what it keeps) and nothing is formatted for a good packet.
func (s *Server) serve(conn net.PacketConn, port int) error {
	buf := make([]byte, 4096)
	rio := s.rawIO(conn)
	isUDP := rio != nil
	var rd *udpReader
	if isUDP {
		rd = rio.reader(buf)
	}
	for {
		var n int
		var err error
		var peer net.Addr
		var from netip.AddrPort
		var read time.Time // the request's arrival, for the answer time
		if isUDP {
			n, from, read, err = rd.readFrom() // no *UDPAddr per packet
		} else {
			n, peer, err = conn.ReadFrom(buf)
			read = time.Now()
		}
		if err != nil {
			return err
		}
		m, err := dhcpv4.FromBytes(buf[:n])
		if err != nil {
			bad := s.bad.Add(1)
			s.observe(nil, OutcomeMalformed)
			s.warn.Warn(logMalformed, "ignoring malformed DHCP packet", "err", "Error parsing DHCPv4 request: "+err.Error(), "malformed_total", bad)
			continue
		}
		// The source is needed only on the PXE port (respondPXE answers
		// there); on port 67 the packet says where the answer goes.
		var up *net.UDPAddr
		if isUDP {
			if port == PXEPort {
				up = net.UDPAddrFromAddrPort(from)
			}
		} else {
			u, ok := peer.(*net.UDPAddr)
			if !ok {
				continue
			}
			if port == PXEPort {
				up = u
			}
		}
		if up != nil && (up.IP == nil || up.IP.To4().Equal(net.IPv4zero)) {
			// A client without an address: answer by broadcast.
			up = &net.UDPAddr{IP: net.IPv4bcast, Port: up.Port}
		}
		j := job{conn: conn, up: up, m: m, port: port, read: read}
		if s.quick(m, port) {
			s.handle(j)
			continue
		}
		// The in-flight bound is taken before the goroutine starts, so an
		// overload costs no goroutine per dropped packet.
		select {
		case s.sem <- struct{}{}:
		default:
			n := s.dropped.Add(1)
			s.observe(m, OutcomeOverload)
			s.warn.Warn(logOverloaded, "DHCP overloaded: dropping packets", "in_flight", s.cfg.MaxInFlight, "dropped_total", n)
			continue
		}
		s.handlers.Add(1)
		select {
		case s.work <- j:
		default: // every worker busy: a goroutine of its own
			go s.dispatch(j)
		}
	}
}

// rawIO is conn's raw reader/writer (nil: use conn's methods).
func (s *Server) rawIO(conn net.PacketConn) *udpIO {
	switch conn {
	case s.conn:
		return s.connIO
	case s.pxe:
		return s.pxeIO
	}
	return nil
}

// job is one packet for a worker.
type job struct {
	conn net.PacketConn
	up   *net.UDPAddr
	m    *dhcpv4.DHCPv4
	port int
	read time.Time // when it arrived (the kernel's stamp) or was read
}

// workers is how many handler goroutines live as long as Run: they keep
// their grown stacks, where a goroutine per packet grew a new one for
// every REQUEST (runtime.morestack was ~5 % of the CPU under load).
// Packets beyond them get a goroutine each, up to MaxInFlight.
const workers = 64

func (s *Server) worker(ctx context.Context) {
	for {
		select {
		case j := <-s.work:
			s.dispatch(j)
		case <-ctx.Done():
			return
		}
	}
}

// quick reports whether m is answered from memory alone, without a store
// or inventory call that could block: a full-mode DISCOVER from a client
// that does not network-boot (the offer is an in-memory reservation and
// such clients get no timeline entry but for a problem, which is queued).
// serve answers those on its own goroutine: half of a plain client's
// packets then cost no goroutine hand-off.
func (s *Server) quick(m *dhcpv4.DHCPv4, port int) bool {
	return port == dhcpv4.ServerPort && s.cfg.Mode == ModeFull && m.OpCode == dhcpv4.OpcodeBootRequest &&
		messageType(m) == dhcpv4.MessageTypeDiscover && !netBoot(m)
}

// dispatch handles one packet: serve took its slot in s.sem and counted it
// in s.handlers; dispatch gives both back.
func (s *Server) dispatch(j job) {
	defer func() { <-s.sem; s.handlers.Done() }()
	s.handle(j)
}

// handleTimeout bounds a packet's store and inventory calls; boundStep is
// how long one shared deadline context serves new packets, so a packet's
// calls end between handleTimeout and handleTimeout+boundStep after it
// arrived.
const (
	handleTimeout = 3 * time.Second
	boundStep     = 100 * time.Millisecond
)

// bound hands out the context packets are handled under: a deadline
// context made once per boundStep and shared by the packets of that
// step, where a context.WithTimeout per packet (a context, a timer and
// its cancel) was ~1 KB of garbage per lease. It ignores the parent's
// cancellation (a packet being answered when Run ends is still answered),
// like WithoutCancel did. Safe for concurrent use.
type bound struct {
	parent context.Context
	cur    atomic.Pointer[boundCtx]
	mu     sync.Mutex // making a new one
}

type boundCtx struct {
	ctx    context.Context
	cancel context.CancelFunc // called by the deadline's own timer as well
	until  time.Time          // when packets stop being given ctx
}

func newBound(parent context.Context) *bound {
	// The store writes of a packet (its lease) may wait for the bbolt
	// store's commit window to share a flush with the packets arriving
	// meanwhile (store/bolt/window.go); an API write never waits for it.
	// Its reads may be served by the nearest etcd member (store.WithLocalReads):
	// every decision they feed is written by compare-and-swap, which a
	// stale read loses and reads again. In a fleet every appliance reads
	// for every broadcast DISCOVER, and leader-confirmed reads were where
	// a storm queued (docs/architecture.md, "Several appliances: a fleet on etcd").
	return &bound{parent: store.WithLocalReads(store.WithCommitWindow(context.WithoutCancel(parent)))}
}

// ctx returns a context whose deadline is at least handleTimeout and at
// most handleTimeout+boundStep after now.
func (b *bound) ctx(now time.Time) context.Context {
	if c := b.cur.Load(); c != nil && now.Before(c.until) {
		return c.ctx
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if c := b.cur.Load(); c != nil && now.Before(c.until) {
		return c.ctx
	}
	ctx, cancel := context.WithDeadline(b.parent, now.Add(handleTimeout+boundStep))
	b.cur.Store(&boundCtx{ctx: ctx, cancel: cancel, until: now.Add(boundStep)})
	return ctx
}

// handle answers one packet and reports its outcome. Its store and
// inventory calls are bounded by handleTimeout (see bound).
func (s *Server) handle(j job) {
	m, conn := j.m, j.conn
	if s.leftToPeer(m, j.port) {
		s.observe(m, OutcomeLeft)
		return
	}
	reply, dst := s.Respond(s.bound.Load().ctx(time.Now()), m, j.up, j.port)
	if reply == nil {
		s.observe(m, OutcomeIgnored)
		return
	}
	out := reply.ToBytes()
	mt := messageType(reply)
	recycle(reply) // serialised: nothing refers to it any more
	var err error
	if rio := s.rawIO(conn); rio != nil {
		err = rio.writeTo(out, dst)
	} else {
		_, err = conn.WriteTo(out, dst)
	}
	if err != nil {
		s.observe(m, OutcomeNotSent)
		s.warn.Warn(logNotSent, "DHCP reply not sent", "mac", m.ClientHWAddr.String(), "dst", dst.String(), "err", err)
		return
	}
	if s.cfg.Observer != nil && !j.read.IsZero() {
		// The kernel's stamp is wall-clock time: a clock stepped back
		// meanwhile would make the wait negative.
		s.cfg.Observer.Answered(MessageTypeName(messageType(m)), max(time.Since(j.read), 0))
	}
	switch mt {
	case dhcpv4.MessageTypeOffer:
		s.observe(m, OutcomeOffer)
	case dhcpv4.MessageTypeAck:
		s.observe(m, OutcomeAck)
	case dhcpv4.MessageTypeNak:
		s.observe(m, OutcomeNak)
	default:
		s.observe(m, OutcomeOther)
	}
}

// leftToPeer reports whether m is a DISCOVER that Config.Balance leaves
// to another appliance of the fleet.
func (s *Server) leftToPeer(m *dhcpv4.DHCPv4, port int) bool {
	if s.cfg.Balance == nil || s.cfg.Mode != ModeFull || port == PXEPort || messageType(m) != dhcpv4.MessageTypeDiscover ||
		m.OpCode != dhcpv4.OpcodeBootRequest || len(m.ClientHWAddr) != 6 {
		return false
	}
	r, ok := s.rangeFor(m)
	if !ok {
		return false
	}
	return !s.cfg.Balance(m.ClientHWAddr.String(), r.Subnet, m.NumSeconds)
}
