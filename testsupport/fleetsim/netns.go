package fleetsim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Addresses inside the two namespaces. They exist nowhere else (the
// namespaces are joined to each other only), so fixed subnets cannot
// collide with another run's or the host's.
var (
	serverAddr  = netip.MustParseAddr("10.210.0.1") // corrald's boot interface
	relayAddr   = netip.MustParseAddr("10.210.0.2") // the client side's own address
	segment     = netip.MustParsePrefix("10.210.0.0/16")
	poolStart   = netip.MustParseAddr("10.210.128.0") // local DHCP range
	poolEnd     = netip.MustParseAddr("10.210.255.254")
	relayNet    = netip.MustParsePrefix("10.211.0.0/16") // the relayed segment
	giaddr      = netip.MustParseAddr("10.211.0.1")      // the relay's address on it
	relayStart  = netip.MustParseAddr("10.211.0.10")
	relayEnd    = netip.MustParseAddr("10.211.255.254")
	extraNodes  = netip.MustParsePrefix("10.212.0.0/16") // nodes that were no simulated machine
	etcdAddr    = netip.MustParseAddr("10.210.0.20")     // a fleet's etcd members
	poolPrefix  = netip.MustParsePrefix("10.210.128.0/17")
	apiPort     = 20180
	httpPort    = 8080
	metricsPort = 9180
)

// topology is the pair of namespaces a run makes: corrald's (server) and
// the machines' (client), joined by one veth. Every leased address is
// added to the client end as a /32, and the server routes the pool and
// the relayed segment through the client end: the server namespace then
// holds one neighbour entry (the client end), not one per machine, which
// the kernel's shared neighbour table (gc_thresh3 1024 by default) could
// not hold for a 5,000-machine row.
//
// A fleet (several appliances) is one namespace per appliance and one for
// the etcd members, each joined by a veth to a bridge in the machines'
// namespace: the bridge is then the client end (it holds the machines'
// addresses, and a broadcast sent on it reaches every appliance, as on a
// shared boot segment), and every appliance namespace routes the pool
// through it as the single server namespace does.
type topology struct {
	id       string
	serverNS string // the first appliance's (apps[0])
	clientNS string
	serverIf string
	clientIf string // the veth's client end, or the bridge in a fleet
	// apps are the appliances' ends of the segment, in order; etcd the
	// etcd members' (a fleet only).
	apps           []segPort
	etcd           *segPort
	client         *netNS
	link           netlink.Link
	nl             *netlink.Handle
	mu             sync.Mutex // serialises netlink requests on nl
	created        []string   // namespaces to delete
	rootNS, nsFile *os.File
}

// segPort is a namespace's end of the boot segment: its interface and
// address there.
type segPort struct {
	ns, ifname string
	addr       netip.Addr
}

// maxAppliances bounds Config.Appliances: each takes an address of
// applianceAddr's.
const maxAppliances = 8

// applianceAddr is appliance i's address on the segment: the single
// appliance's (serverAddr) for the first, then .3, .4, ...
func applianceAddr(i int) netip.Addr {
	if i == 0 {
		return serverAddr
	}
	b := serverAddr.As4()
	b[3] = byte(2 + i)
	return netip.AddrFrom4(b)
}

// ipCmd runs ip(8) with args; its error quotes the command and its output.
func ipCmd(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// newTopology makes the namespaces (names unique to id) and the veth;
// with apps > 1 the bridge, a namespace per appliance and one for etcd.
func newTopology(ctx context.Context, id string, apps int) (t *topology, err error) {
	t = &topology{id: id, serverNS: "fsim-s" + id, clientNS: "fsim-c" + id, serverIf: "fss" + id, clientIf: "fsc" + id}
	defer func() {
		if err != nil {
			t.Close()
		}
	}()
	addNS := func(ns string) error {
		if err := ipCmd(ctx, "netns", "add", ns); err != nil {
			return err
		}
		t.created = append(t.created, ns)
		return ipCmd(ctx, "-n", ns, "link", "set", "lo", "up")
	}
	if err := addNS(t.clientNS); err != nil {
		return t, err
	}
	bits := fmt.Sprint(segment.Bits())
	// join makes ns (with the veth ifname at addr) and its peer in the
	// client namespace: the client end itself, or a port of the bridge.
	join := func(p segPort, peer string, bridge bool) error {
		if err := addNS(p.ns); err != nil {
			return err
		}
		steps := [][]string{
			{"-n", p.ns, "link", "add", p.ifname, "type", "veth", "peer", "name", peer, "netns", t.clientNS},
			{"-n", p.ns, "addr", "add", p.addr.String() + "/" + bits, "dev", p.ifname},
			{"-n", p.ns, "link", "set", p.ifname, "up"},
		}
		if bridge {
			steps = append(steps, []string{"-n", t.clientNS, "link", "set", peer, "master", t.clientIf})
		}
		steps = append(steps, []string{"-n", t.clientNS, "link", "set", peer, "up"})
		for _, s := range steps {
			if err := ipCmd(ctx, s...); err != nil {
				return err
			}
		}
		return nil
	}
	fleet := apps > 1
	if fleet {
		t.clientIf = "fsb" + id
		for _, s := range [][]string{{"-n", t.clientNS, "link", "add", t.clientIf, "type", "bridge"}, {"-n", t.clientNS, "link", "set", t.clientIf, "up"}} {
			if err := ipCmd(ctx, s...); err != nil {
				return t, err
			}
		}
	}
	for i := range apps {
		p := segPort{ns: t.serverNS, ifname: t.serverIf, addr: applianceAddr(i)}
		peer := t.clientIf
		if i > 0 {
			p.ns = fmt.Sprintf("fsim-s%s-%d", id, i+1)
		}
		if fleet {
			peer = fmt.Sprintf("fsp%s%d", id, i+1)
		}
		if err := join(p, peer, fleet); err != nil {
			return t, err
		}
		t.apps = append(t.apps, p)
	}
	if fleet {
		p := segPort{ns: "fsim-e" + id, ifname: "fse" + id, addr: etcdAddr}
		if err := join(p, "fsp"+id+"e", true); err != nil {
			return t, err
		}
		t.etcd = &p
	}
	steps := [][]string{
		{"-n", t.clientNS, "addr", "add", relayAddr.String() + "/" + bits, "dev", t.clientIf},
		{"-n", t.clientNS, "addr", "add", giaddr.String() + "/32", "dev", t.clientIf},
		{"-n", t.clientNS, "link", "set", t.clientIf, "up"},
	}
	for _, p := range t.apps {
		steps = append(steps,
			[]string{"-n", p.ns, "route", "add", poolPrefix.String(), "via", relayAddr.String()},
			[]string{"-n", p.ns, "route", "add", relayNet.String(), "via", relayAddr.String()},
			[]string{"-n", p.ns, "route", "add", extraNodes.String(), "via", relayAddr.String()})
	}
	for _, s := range steps {
		if err := ipCmd(ctx, s...); err != nil {
			return t, err
		}
	}
	// Thousands of connections from one namespace to one port: widen
	// the backlog and port range on both sides.
	for _, ns := range t.created {
		if err := ipCmd(ctx, "netns", "exec", ns, "sh", "-c",
			"sysctl -qw net.core.somaxconn=65535 net.ipv4.tcp_max_syn_backlog=65535 net.ipv4.ip_local_port_range='1024 65000' net.core.rmem_max=16777216 net.core.wmem_max=16777216 2>/dev/null || true"); err != nil {
			return t, err
		}
	}
	if t.rootNS, err = os.Open("/proc/self/ns/net"); err != nil {
		return t, err
	}
	if t.nsFile, err = os.Open("/var/run/netns/" + t.clientNS); err != nil {
		return t, err
	}
	t.client = &netNS{fd: int(t.nsFile.Fd()), root: int(t.rootNS.Fd())}
	err = t.client.do(func() error {
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return err
		}
		t.nl = h
		t.link, err = h.LinkByName(t.clientIf)
		return err
	})
	return t, err
}

// addAddr puts a leased (or a node's) address on the client end.
func (t *topology) addAddr(a netip.Addr) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	err := t.nl.AddrAdd(t.link, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}})
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	return err
}

// Close deletes the namespaces (and with them the veth and every
// address). Safe to call more than once.
func (t *topology) Close() {
	if t.nl != nil {
		t.nl.Close()
		t.nl = nil
	}
	for _, ns := range t.created {
		_ = ipCmd(context.Background(), "netns", "del", ns)
	}
	t.created = nil
	if t.nsFile != nil {
		t.nsFile.Close()
		t.nsFile = nil
	}
	if t.rootNS != nil {
		t.rootNS.Close()
		t.rootNS = nil
	}
}

// netNS runs code with the calling goroutine's thread inside a network
// namespace: sockets made there stay in it after the thread returns.
// Since Go 1.10 a locked thread that changed namespace never spawns the
// runtime's other threads (the template thread does), so nothing else
// leaks into the namespace.
type netNS struct{ fd, root int }

func (n *netNS) do(f func() error) error {
	runtime.LockOSThread()
	if err := unix.Setns(n.fd, unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("setns: %w", err)
	}
	err := f()
	if rerr := unix.Setns(n.root, unix.CLONE_NEWNET); rerr != nil {
		// Leave the thread locked: it exits with the goroutine instead
		// of running others in the wrong namespace.
		return errors.Join(err, fmt.Errorf("setns back: %w", rerr))
	}
	runtime.UnlockOSThread()
	return err
}

// dialer dials TCP from the client namespace with a given source address.
func (n *netNS) dial(ctx context.Context, from netip.Addr, addr string) (net.Conn, error) {
	d := net.Dialer{}
	if from.IsValid() {
		d.LocalAddr = &net.TCPAddr{IP: from.AsSlice()}
	}
	var c net.Conn
	err := n.do(func() error {
		var err error
		c, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	return c, err
}

// bindDevice binds a socket to an interface and allows broadcast.
func bindDevice(ifname string) func(network, address string, c syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if serr = unix.SetsockoptString(int(fd), unix.SOL_SOCKET, unix.SO_BINDTODEVICE, ifname); serr != nil {
				return
			}
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_BROADCAST, 1)
		})
		return errors.Join(err, serr)
	}
}
