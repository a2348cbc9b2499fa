package netdev

import (
	"errors"
	"fmt"
	"golang.org/x/sys/unix"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"

	"github.com/corralhq/corral/hypervisor/internal/safename"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Config configures a Manager.
type Config struct {
	// Uplink is the node interface VLAN sub-interfaces hang off; "" makes
	// every Network host-local.
	Uplink string
	// NetNSPath, when set (e.g. /var/run/netns/NAME), makes the Manager
	// create and delete links inside that namespace; tests use it.
	NetNSPath string
	// Logger receives one line per change; nil discards.
	Logger *slog.Logger
}

// Manager creates and deletes bridges, VLAN sub-interfaces and taps. Its
// methods are safe for concurrent use (they are serialised); each call is
// a few netlink round trips and does not block otherwise.
type Manager struct {
	cfg Config
	log *slog.Logger
	mu  sync.Mutex
}

// NewManager validates cfg (the namespace must exist).
func NewManager(cfg Config) (*Manager, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.NetNSPath != "" {
		ns, err := netns.GetFromPath(cfg.NetNSPath)
		if err != nil {
			return nil, fmt.Errorf("netdev: namespace %s: %w", cfg.NetNSPath, err)
		}
		ns.Close()
	}
	return &Manager{cfg: cfg, log: log}, nil
}

// VhostAvailable reports whether /dev/vhost-net can be opened (the module
// is missing on some kernels: taps then use vhost=off).
func VhostAvailable() bool {
	f, err := os.OpenFile("/dev/vhost-net", os.O_RDWR, 0)
	if err != nil {
		return false
	}
	f.Close()
	return true
}

// do runs fn with a netlink handle in the configured namespace. The handle
// is rtnetlink only: NewHandle() without families also opens XFRM and
// netfilter sockets, which fail with "protocol not supported" on kernels
// where xfrm_user is a module nobody loaded (the hypervisor image). Tap
// creation opens /dev/net/tun, which lands in the calling thread's
// namespace, so the thread itself is moved when a namespace is set.
func (m *Manager) do(fn func(h *netlink.Handle) error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cfg.NetNSPath == "" {
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return fmt.Errorf("netdev: netlink: %w", err)
		}
		defer h.Close()
		return fn(h)
	}
	errc := make(chan error, 1)
	// A dedicated goroutine whose thread is thrown away afterwards if it
	// cannot be moved back: the caller's thread never changes namespace.
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			runtime.UnlockOSThread()
			return
		}
		defer orig.Close()
		target, err := netns.GetFromPath(m.cfg.NetNSPath)
		if err != nil {
			errc <- fmt.Errorf("netdev: namespace %s: %w", m.cfg.NetNSPath, err)
			runtime.UnlockOSThread()
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			errc <- fmt.Errorf("netdev: enter %s: %w", m.cfg.NetNSPath, err)
			return // thread state unknown: stays locked, dies with the goroutine
		}
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err == nil {
			err = fn(h)
			h.Close()
		}
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}

func linkList(h *netlink.Handle) ([]netlink.Link, error) {
	for range 5 {
		links, err := h.LinkList()
		if errors.Is(err, netlink.ErrDumpInterrupted) {
			continue
		}
		return links, err
	}
	return nil, fmt.Errorf("netdev: link dump interrupted 5 times")
}

// ApplyNetwork creates (or completes) the links of n: the bridge, the VLAN
// sub-interface of the uplink when planned, and the gateway address; all
// up. It is idempotent. A partially created network is rolled back.
func (m *Manager) ApplyNetwork(n Network) (Plan, error) {
	plan, err := PlanNetwork(n, m.cfg.Uplink)
	if err != nil {
		return Plan{}, err
	}
	var gw *netlink.Addr
	if n.GatewayCIDR != "" {
		gw, err = netlink.ParseAddr(n.GatewayCIDR)
		if err != nil {
			return Plan{}, apierr.Invalidf("network %q: gateway %q: %v", n.Name, n.GatewayCIDR, err)
		}
	}
	if plan.Note != "" {
		m.log.Info(plan.Note, "network", n.Name, "vlan", n.VLAN)
	}
	err = m.do(func(h *netlink.Handle) error {
		var created []netlink.Link
		undo := func() {
			for i := len(created) - 1; i >= 0; i-- {
				_ = h.LinkDel(created[i])
			}
		}
		br, err := h.LinkByName(plan.Bridge)
		switch {
		case isNotFound(err):
			br = &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: plan.Bridge}}
			if err := h.LinkAdd(br); err != nil {
				return fmt.Errorf("netdev: create bridge %s: %w", plan.Bridge, err)
			}
			created = append(created, br)
			if err := h.LinkSetAlias(br, aliasBridge+n.Name); err != nil {
				undo()
				return fmt.Errorf("netdev: alias bridge %s: %w", plan.Bridge, err)
			}
			m.log.Info("bridge created", "network", n.Name, "bridge", plan.Bridge)
		case err != nil:
			return fmt.Errorf("netdev: bridge %s: %w", plan.Bridge, err)
		case br.Attrs().Alias != aliasBridge+n.Name:
			return apierr.Preconditionf("link %s exists and is not Corral's bridge for network %q", plan.Bridge, n.Name)
		}
		if plan.VLANLink != "" {
			if err := m.ensureVLAN(h, plan, br, &created); err != nil {
				undo()
				return err
			}
		}
		if gw != nil {
			if err := h.AddrReplace(br, gw); err != nil {
				undo()
				return fmt.Errorf("netdev: gateway %s on %s: %w", n.GatewayCIDR, plan.Bridge, err)
			}
		}
		if err := h.LinkSetUp(br); err != nil {
			undo()
			return fmt.Errorf("netdev: up %s: %w", plan.Bridge, err)
		}
		return nil
	})
	return plan, err
}

func (m *Manager) ensureVLAN(h *netlink.Handle, plan Plan, br netlink.Link, created *[]netlink.Link) error {
	v, err := h.LinkByName(plan.VLANLink)
	if isNotFound(err) {
		parent, err := h.LinkByName(plan.VLANParent)
		if err != nil {
			return apierr.NotFoundf("uplink %s: %v", plan.VLANParent, err)
		}
		v = &netlink.Vlan{LinkAttrs: netlink.LinkAttrs{Name: plan.VLANLink, ParentIndex: parent.Attrs().Index}, VlanId: int(plan.VLANID)}
		if err := h.LinkAdd(v); err != nil {
			return fmt.Errorf("netdev: create vlan %d on %s: %w", plan.VLANID, plan.VLANParent, err)
		}
		*created = append(*created, v)
		if err := h.LinkSetAlias(v, aliasVLAN+plan.VLANParent); err != nil {
			return err
		}
		m.log.Info("vlan created", "link", plan.VLANLink, "uplink", plan.VLANParent, "vlan", plan.VLANID)
	} else if err != nil {
		return err
	} else if mi := v.Attrs().MasterIndex; mi != 0 && mi != br.Attrs().Index {
		// Another Network holds this VLAN on this node: moving the
		// sub-interface would silently take the VLAN from it.
		return apierr.Preconditionf("vlan %d on %s already serves another network's bridge on this node", plan.VLANID, plan.VLANParent)
	}
	if err := h.LinkSetMaster(v, br); err != nil {
		return fmt.Errorf("netdev: enslave %s to %s: %w", plan.VLANLink, plan.Bridge, err)
	}
	return h.LinkSetUp(v)
}

// DeleteNetwork removes the bridge of network (and its VLAN
// sub-interface). It returns apierr.ErrNotFound if there is no such bridge and
// apierr.ErrPrecondition while taps are still attached.
func (m *Manager) DeleteNetwork(network string) error {
	if err := safename.Check("network", network); err != nil {
		return err
	}
	name := BridgeName(network)
	return m.do(func(h *netlink.Handle) error {
		br, err := h.LinkByName(name)
		if isNotFound(err) {
			return apierr.NotFoundf("network %q has no bridge on this node", network)
		}
		if err != nil {
			return err
		}
		if br.Attrs().Alias != aliasBridge+network {
			return apierr.NotFoundf("link %s is not Corral's bridge for network %q", name, network)
		}
		links, err := linkList(h)
		if err != nil {
			return err
		}
		var taps []string
		var vlans []netlink.Link
		for _, l := range links {
			if l.Attrs().MasterIndex != br.Attrs().Index {
				continue
			}
			if strings.HasPrefix(l.Attrs().Alias, aliasVLAN) {
				vlans = append(vlans, l)
			} else {
				taps = append(taps, l.Attrs().Name)
			}
		}
		if len(taps) > 0 {
			return apierr.Preconditionf("network %q: bridge %s still has ports %s", network, name, strings.Join(taps, ", "))
		}
		for _, v := range vlans {
			if err := h.LinkDel(v); err != nil && !isNotFound(err) {
				return fmt.Errorf("netdev: delete %s: %w", v.Attrs().Name, err)
			}
		}
		if err := h.LinkDel(br); err != nil && !isNotFound(err) {
			return fmt.Errorf("netdev: delete %s: %w", name, err)
		}
		m.log.Info("bridge deleted", "network", network, "bridge", name)
		return nil
	})
}

// Tap describes one VM NIC's tap.
type Tap struct {
	Name    string
	Network string
	// Owner is "vm/index", kept in the alias for diagnostics.
	Owner string
}

// CreateTap creates a persistent tap (no packet info, vnet header, as QEMU
// opens it) on the bridge of t.Network and brings it up. The Network must
// have been applied (apierr.ErrNotFound otherwise). A tap of the same name left
// by an earlier attempt is replaced. On error nothing is left.
func (m *Manager) CreateTap(t Tap) error {
	if len(t.Name) > MaxNameLen || t.Name == "" {
		return apierr.Invalidf("tap name %q", t.Name)
	}
	bridge := BridgeName(t.Network)
	return m.do(func(h *netlink.Handle) error {
		br, err := h.LinkByName(bridge)
		if isNotFound(err) {
			return apierr.NotFoundf("network %q is not applied on this node (no bridge %s)", t.Network, bridge)
		}
		if err != nil {
			return err
		}
		if old, err := h.LinkByName(t.Name); err == nil {
			if !strings.HasPrefix(old.Attrs().Alias, aliasTap) {
				return apierr.Preconditionf("link %s exists and is not a Corral tap", t.Name)
			}
			if err := h.LinkDel(old); err != nil {
				return err
			}
		}
		tap := &netlink.Tuntap{
			LinkAttrs: netlink.LinkAttrs{Name: t.Name},
			Mode:      netlink.TUNTAP_MODE_TAP,
			Flags:     netlink.TUNTAP_NO_PI | netlink.TUNTAP_VNET_HDR,
		}
		if err := h.LinkAdd(tap); err != nil {
			return fmt.Errorf("netdev: create tap %s: %w", t.Name, err)
		}
		for _, f := range tap.Fds {
			f.Close()
		}
		fail := func(step string, err error) error {
			_ = h.LinkDel(tap)
			return fmt.Errorf("netdev: tap %s: %s: %w", t.Name, step, err)
		}
		if err := h.LinkSetAlias(tap, aliasTap+t.Owner); err != nil {
			return fail("alias", err)
		}
		if err := h.LinkSetMaster(tap, br); err != nil {
			return fail("enslave to "+bridge, err)
		}
		if err := h.LinkSetUp(tap); err != nil {
			return fail("up", err)
		}
		m.log.Info("tap created", "tap", t.Name, "bridge", bridge, "owner", t.Owner)
		return nil
	})
}

// DeleteTap removes a Corral tap; a missing tap is not an error.
func (m *Manager) DeleteTap(name string) error {
	return m.deleteOwned(name, aliasTap, "tap", "a Corral tap")
}

// deleteOwned removes link name if its alias says Corral made it as what
// (alias prefix); a missing link is not an error, a link of another
// owner is refused (described as owned, e.g. "a Corral tap").
func (m *Manager) deleteOwned(name, alias, what, owned string) error {
	return m.do(func(h *netlink.Handle) error {
		l, err := h.LinkByName(name)
		if isNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if !strings.HasPrefix(l.Attrs().Alias, alias) {
			return apierr.Preconditionf("link %s is not %s: not deleting it", name, owned)
		}
		if err := h.LinkDel(l); err != nil && !isNotFound(err) {
			return fmt.Errorf("netdev: delete %s %s: %w", what, name, err)
		}
		m.log.Info(what+" deleted", what, name)
		return nil
	})
}

// Link is one Corral-owned link as found on the node.
type Link struct {
	Name, Kind, Key, Master string
	Up                      bool
	HardwareAddr            net.HardwareAddr
}

// Links lists the Corral-owned links (bridges, VLANs, taps).
func (m *Manager) Links() ([]Link, error) {
	var out []Link
	err := m.do(func(h *netlink.Handle) error {
		links, err := linkList(h)
		if err != nil {
			return err
		}
		byIndex := map[int]string{}
		for _, l := range links {
			byIndex[l.Attrs().Index] = l.Attrs().Name
		}
		for _, l := range links {
			a := l.Attrs()
			kind, key, ok := strings.Cut(strings.TrimPrefix(a.Alias, "corral:"), ":")
			if !ok || !strings.HasPrefix(a.Alias, "corral:") {
				continue
			}
			out = append(out, Link{Name: a.Name, Kind: kind, Key: key, Master: byIndex[a.MasterIndex],
				Up: a.Flags&net.FlagUp != 0, HardwareAddr: a.HardwareAddr})
		}
		return nil
	})
	return out, err
}
