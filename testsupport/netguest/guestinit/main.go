// Command guestinit is the /init of testsupport/netguest's guest: it loads
// the network modules and runs the scenarios named by netguest.run= on
// the kernel command line through hypervisor/netdev, reporting on the
// console in lines starting with "NETGUEST ", then powers off.
//
//   - bond: bond0, active-backup over eth0 and eth1 (miimon 100), address
//     10.51.0.2/24; the active slave and each slave's link are printed on
//     every change, for 10 minutes or until the vlan scenario ends.
//   - vlan: two node namespaces whose uplinks are the ends of one veth
//     pair; node A has network blue (VLAN 100), node B blue and red (VLAN
//     200, gateway 10.50.0.254/24). The VMs are QEMU guests on the host,
//     each joined to one of this guest's extra NICs (found by MAC, see
//     vmNICs), which is moved into its node's namespace and enslaved to
//     the network's bridge where the VM's tap would be: vm1 on A/blue, vm2
//     on B/blue, vm3 on B/red. The host checks the VMs' pings and ends the
//     scenario with "vlan-end"; then node B must reach vm3 from red's
//     gateway, node B's VLAN 100 sub-interface must have received packets,
//     and the networks are deleted through the Manager.
package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/corralhq/corral/hypervisor/netdev"
	"github.com/corralhq/corral/internal/apierr"
)

var out sync.Mutex

func say(format string, a ...any) {
	out.Lock()
	defer out.Unlock()
	fmt.Printf("NETGUEST "+format+"\n", a...)
}

func main() {
	start := time.Now()
	for _, m := range [][3]string{{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"devtmpfs", "/dev", "devtmpfs"}, {"tmpfs", "/run", "tmpfs"}, {"tmpfs", "/tmp", "tmpfs"}} {
		if err := unix.Mount(m[2], m[1], m[0], 0, ""); err != nil {
			say("FAIL mount %s: %v", m[1], err)
		}
	}
	_ = os.Symlink("/run", "/var/run")
	_ = os.MkdirAll("/run/netns", 0o755)
	for _, m := range moduleOrder() {
		params := ""
		if m == "bonding" {
			params = "max_bonds=0" // no default bond0: the Manager makes it
		}
		if err := insmod("/modules/"+m+".ko", params); err != nil {
			say("FAIL insmod %s: %v", m, err)
		}
	}
	say("modules loaded %s after init", time.Since(start).Round(time.Millisecond))
	cmdline, _ := os.ReadFile("/proc/cmdline")
	var run []string
	for _, f := range strings.Fields(string(cmdline)) {
		if v, ok := strings.CutPrefix(f, "netguest.run="); ok {
			run = strings.Split(v, ",")
		}
	}
	// The host ends the bond scenario with a line "bond-end" on the
	// console once it has failed a NIC over, and the vlan scenario with
	// "vlan-end" once it has seen the VMs' pings.
	stop, vlanEnd := make(chan struct{}), make(chan struct{})
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			switch strings.TrimSpace(sc.Text()) {
			case "bond-end":
				close(stop)
			case "vlan-end":
				close(vlanEnd)
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for _, r := range run {
		switch r {
		case "bond":
			wg.Add(1)
			go func() { defer wg.Done(); bond(stop) }()
		case "vlan":
			if err := vlan(vlanEnd); err != nil {
				say("vlan FAIL %v", err)
			} else {
				say("vlan ok")
			}
		default:
			say("FAIL unknown scenario %q", r)
		}
	}
	wg.Wait()
	say("done after %s", time.Since(start).Round(time.Millisecond))
	unix.Sync()
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
}

// moduleOrder is netguest.NodeModules (the order the builder wrote).
func moduleOrder() []string {
	return []string{"virtio_ring", "virtio", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio_pci",
		"failover", "net_failover", "virtio_net",
		"llc", "stp", "bridge", "mrp", "garp", "8021q", "tls", "bonding", "veth"}
}

func insmod(path, params string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	err = unix.FinitModule(int(f.Fd()), params, 0)
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	return err
}

// bond applies bond0 and reports its state until stop (after the host has
// had its time with it) or 10 minutes.
func bond(stop <-chan struct{}) {
	m, err := netdev.NewManager(netdev.Config{})
	if err != nil {
		say("bond FAIL %v", err)
		return
	}
	for _, n := range []string{"eth0", "eth1"} {
		if err := waitLink(n, 20*time.Second); err != nil {
			say("bond FAIL %v", err)
			return
		}
	}
	b := netdev.Bond{Name: "bond0", Slaves: []string{"eth0", "eth1"}, Mode: netdev.BondActiveBackup, MiimonMS: 100, Primary: "eth0"}
	if err := m.ApplyBond(b); err != nil {
		say("bond FAIL apply: %v", err)
		return
	}
	if err := m.ApplyBond(b); err != nil {
		say("bond FAIL second apply (idempotent): %v", err)
		return
	}
	l, err := netlink.LinkByName("bond0")
	if err == nil {
		var a *netlink.Addr
		a, err = netlink.ParseAddr("10.51.0.2/24")
		if err == nil {
			err = netlink.AddrReplace(l, a)
		}
	}
	if err != nil {
		say("bond FAIL address: %v", err)
		return
	}
	last := ""
	deadline := time.After(10 * time.Minute)
	for {
		st, err := m.BondStatus("bond0")
		line := ""
		if err != nil {
			line = "error " + err.Error()
		} else {
			var sl []string
			for _, n := range []string{"eth0", "eth1"} {
				state := "down"
				if st.Slaves[n] {
					state = "up"
				}
				sl = append(sl, n+":"+state)
			}
			mac := ""
			if st.Active != "" {
				if l, err := netlink.LinkByName(st.Active); err == nil {
					mac = l.Attrs().PermHWAddr.String()
					if mac == "" {
						mac = l.Attrs().HardwareAddr.String()
					}
				}
			}
			line = fmt.Sprintf("mode=%s up=%t active=%s mac=%s slaves=%s", st.Mode, st.Up, st.Active, mac, strings.Join(sl, ","))
		}
		if line != last {
			say("bond %s", line)
			last = line
		}
		select {
		case <-stop:
			return
		case <-deadline:
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func waitLink(name string, d time.Duration) error {
	end := time.Now().Add(d)
	for {
		if _, err := netlink.LinkByName(name); err == nil {
			return nil
		} else if time.Now().After(end) {
			return fmt.Errorf("no %s after %s: %v", name, d, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// inNS runs fn on a thread in namespace name (created when create).
func inNS(name string, create bool, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if create {
			h, err := netns.NewNamed(name)
			if err != nil {
				errc <- err
				return
			}
			h.Close()
		} else {
			h, err := netns.GetFromName(name)
			if err != nil {
				errc <- err
				return
			}
			err = netns.Set(h)
			h.Close()
			if err != nil {
				errc <- err
				return
			}
		}
		errc <- fn()
	}()
	return <-errc
}

// vmNICs are this guest's NICs that carry the host's VMs, by MAC (the
// test gives them in this order), and where each is plugged.
var vmNICs = []struct{ vm, mac, node, network string }{
	{"vm1", "52:54:00:51:01:01", "nodea", "blue"},
	{"vm2", "52:54:00:51:01:02", "nodeb", "blue"},
	{"vm3", "52:54:00:51:01:03", "nodeb", "red"},
}

// vlan runs the VLAN scenario until end (or 10 minutes).
func vlan(end <-chan struct{}) error {
	t0 := time.Now()
	for _, n := range []string{"nodea", "nodeb"} {
		if err := inNS(n, true, func() error {
			lo, err := netlink.LinkByName("lo")
			if err == nil {
				err = netlink.LinkSetUp(lo)
			}
			return err
		}); err != nil {
			return fmt.Errorf("namespace %s: %w", n, err)
		}
	}
	// The wire between the nodes: a veth pair, one end in each namespace.
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "upa"}, PeerName: "upb"}); err != nil {
		return fmt.Errorf("veth: %w", err)
	}
	for end, ns := range map[string]string{"upa": "nodea", "upb": "nodeb"} {
		if err := moveUp(end, ns, ""); err != nil {
			return err
		}
	}
	mgr := map[string]*netdev.Manager{}
	for n, up := range map[string]string{"nodea": "upa", "nodeb": "upb"} {
		m, err := netdev.NewManager(netdev.Config{Uplink: up, NetNSPath: "/run/netns/" + n})
		if err != nil {
			return err
		}
		mgr[n] = m
	}
	nets := []struct {
		node string
		n    netdev.Network
	}{
		{"nodea", netdev.Network{Name: "blue", VLAN: 100}},
		{"nodeb", netdev.Network{Name: "blue", VLAN: 100}},
		{"nodeb", netdev.Network{Name: "red", VLAN: 200, GatewayCIDR: "10.50.0.254/24"}},
	}
	for _, n := range nets {
		p, err := mgr[n.node].ApplyNetwork(n.n)
		if err != nil {
			return fmt.Errorf("%s: apply %s: %w", n.node, n.n.Name, err)
		}
		say("vlan %s: network %s vlan %d: bridge %s, sub-interface %s of %s", n.node, n.n.Name, n.n.VLAN, p.Bridge, p.VLANLink, p.VLANParent)
	}
	// A second Network on a VLAN node B already serves is refused (and
	// leaves nothing): it would take the VLAN from blue.
	if _, err := mgr["nodeb"].ApplyNetwork(netdev.Network{Name: "green", VLAN: 100}); !errors.Is(err, apierr.ErrPrecondition) {
		return fmt.Errorf("network green on blue's VLAN 100: %v, want apierr.ErrPrecondition", err)
	}
	// Each VM's port: the NIC with its MAC, on its network's bridge.
	links, err := netlink.LinkList()
	if err != nil {
		return err
	}
	ports := map[string]string{} // VM -> the NIC that is its port
	for _, v := range vmNICs {
		name := ""
		for _, l := range links {
			if l.Attrs().HardwareAddr.String() == v.mac {
				name = l.Attrs().Name
			}
		}
		if name == "" {
			return fmt.Errorf("%s: no NIC with MAC %s", v.vm, v.mac)
		}
		if err := moveUp(name, v.node, netdev.BridgeName(v.network)); err != nil {
			return fmt.Errorf("%s: %w", v.vm, err)
		}
		ports[v.vm] = name
		say("vlan %s: NIC %s (%s) on %s's bridge %s", v.vm, name, v.mac, v.node, netdev.BridgeName(v.network))
	}
	before := vlanCounters()
	say("vlan ready %s after the scenario began", time.Since(t0).Round(time.Millisecond))
	select {
	case <-end:
	case <-time.After(10 * time.Minute):
		return errors.New("no vlan-end from the host within 10 minutes")
	}
	// Positive control for vm3: node B reaches it on red from the gateway.
	alive := false
	for i := 0; i < 10 && !alive; i++ {
		_ = inNS("nodeb", false, func() error {
			alive = exec.Command("/bin/busybox", "ping", "-c", "1", "-W", "1", "10.50.0.3").Run() == nil
			return nil
		})
	}
	if !alive {
		return errors.New("vm3 does not answer red's gateway on node B")
	}
	say("vlan: vm3 answers red's gateway on node B")
	// The frames between the nodes carried 802.1Q tags: node B's VLAN 100
	// sub-interface received what vm1 sent, and node A's what vm2 sent.
	after := vlanCounters()
	for _, k := range []string{"nodea upa.100", "nodeb upb.100", "nodeb upb.200"} {
		say("vlan counters %s: rx %d packets, tx %d packets while the VMs ran", k, after[k][0]-before[k][0], after[k][1]-before[k][1])
	}
	if after["nodeb upb.100"][0] == before["nodeb upb.100"][0] || after["nodea upa.100"][0] == before["nodea upa.100"][0] {
		return errors.New("a VLAN 100 sub-interface received nothing while the VMs ran")
	}
	// Cleanup through the same code: the VMs' ports leave the bridges
	// (as a VM's tap would be deleted), then the networks go.
	for _, v := range vmNICs {
		if err := inNS(v.node, false, func() error {
			l, err := netlink.LinkByName(ports[v.vm])
			if err != nil {
				return err
			}
			if err := netlink.LinkSetNoMaster(l); err != nil {
				return err
			}
			return netlink.LinkSetDown(l)
		}); err != nil {
			return fmt.Errorf("unplug %s: %w", v.vm, err)
		}
	}
	for _, n := range nets {
		if err := mgr[n.node].DeleteNetwork(n.n.Name); err != nil {
			return fmt.Errorf("%s: delete %s: %w", n.node, n.n.Name, err)
		}
	}
	for n, m := range mgr {
		if ls, _ := m.Links(); len(ls) != 0 {
			return fmt.Errorf("%s: links left after delete: %v", n, ls)
		}
	}
	return nil
}

// moveUp moves link name into namespace ns, enslaves it to master there
// (unless ""), and sets it up.
func moveUp(name, ns, master string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	h, err := netns.GetFromName(ns)
	if err != nil {
		return err
	}
	err = netlink.LinkSetNsFd(l, int(h))
	h.Close()
	if err != nil {
		return fmt.Errorf("move %s to %s: %w", name, ns, err)
	}
	return inNS(ns, false, func() error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		if master != "" {
			br, err := netlink.LinkByName(master)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetMaster(l, br); err != nil {
				return err
			}
		}
		return netlink.LinkSetUp(l)
	})
}

// vlanCounters are the rx and tx packet counts of the nodes' VLAN
// sub-interfaces, keyed "node uplink.vlan".
func vlanCounters() map[string][2]uint64 {
	c := map[string][2]uint64{}
	for _, x := range []struct {
		node, up string
		id       uint16
	}{{"nodea", "upa", 100}, {"nodeb", "upb", 100}, {"nodeb", "upb", 200}} {
		_ = inNS(x.node, false, func() error {
			l, err := netlink.LinkByName(netdev.VLANName(x.up, x.id))
			if err == nil && l.Attrs().Statistics != nil {
				c[fmt.Sprintf("%s %s.%d", x.node, x.up, x.id)] = [2]uint64{l.Attrs().Statistics.RxPackets, l.Attrs().Statistics.TxPackets}
			}
			return err
		})
	}
	return c
}
