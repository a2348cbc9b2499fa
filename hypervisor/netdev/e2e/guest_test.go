// Package e2e runs hypervisor/netdev where the kernel has 802.1Q and
// bonding: in a QEMU guest on Debian's cloud kernel (testsupport/netguest),
// since this project's lab kernel has neither.
package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corralhq/corral/testsupport/guestimage"
	"github.com/corralhq/corral/testsupport/netguest"
	"github.com/corralhq/corral/testsupport/require"
)

// The guest's NICs on the host's bridge, in command-line order (eth0,
// eth1 in the guest).
var nics = []struct{ id, mac, tap string }{
	{"nic0", "52:54:00:51:00:01", "crlbt0"},
	{"nic1", "52:54:00:51:00:02", "crlbt1"},
}

// The VMs on the node guest's VLAN networks: QEMU guests on the host, each
// NIC joined over loopback UDP (in the test's own namespace, so the ports
// are free) to the node guest's NIC with nodeMAC, which the guest's init
// plugs into the network's bridge (testsupport/netguest/guestinit,
// vmNICs). vm1 and vm2 are on VLAN 100 on nodes A and B, vm3 on VLAN 200
// on node B, all in one subnet.
var vms = []struct {
	name, mac, nodeMAC, ip string
	vmPort, nodePort       int
	want                   map[string]bool // peer -> must answer
}{
	{"vm1", "52:54:00:50:00:01", "52:54:00:51:01:01", "10.50.0.1", 40101, 40201, map[string]bool{"10.50.0.2": true, "10.50.0.3": false}},
	{"vm2", "52:54:00:50:00:02", "52:54:00:51:01:02", "10.50.0.2", 40102, 40202, map[string]bool{"10.50.0.1": true, "10.50.0.3": false}},
	{"vm3", "52:54:00:50:00:03", "52:54:00:51:01:03", "10.50.0.3", 40103, 40203, map[string]bool{"10.50.0.1": false, "10.50.0.2": false}},
}

// TestVLANAndBondInGuest boots one node guest on Debian's cloud kernel
// whose init runs hypervisor/netdev:
//   - bond: bond0 active-backup over the guest's two NICs (both on a
//     bridge in a namespace of this test, which pings the bond's
//     address); the NIC the bond has active is taken down with QEMU's
//     set_link, the bond fails over to the other and the pings go on.
//   - vlan: two node namespaces in the guest whose uplinks are one veth
//     pair, with VLAN networks on each through the Manager. The VMs are
//     real: three QEMU guests on the host (same kernel, busybox init,
//     virtio NIC) pinging each other from their own kernels. Only their
//     port differs from production: each VM's NIC is joined to a NIC of
//     the node guest, which the guest enslaves to the Manager's bridge
//     where the VM's tap would be. vm1 and vm2 on VLAN 100 (one per node,
//     so the frames cross the uplink tagged) reach each other; vm3 on
//     VLAN 200 (same subnet) reaches neither and is reached by neither.
func TestVLANAndBondInGuest(t *testing.T) {
	if testing.Short() {
		t.Skip("guest end-to-end: skipped with -short")
	}
	require.Root(t, "network namespaces, taps, QEMU")
	require.Tool(t, append([]string{"ip", "ping"}, netguest.Tools...)...)
	cache, err := guestimage.CacheDir()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	t0 := time.Now()
	kernel, initrd, vmInitrd, err := netguest.Build(ctx, cache)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	initrdPath, vmInitrdPath := filepath.Join(dir, "initrd.gz"), filepath.Join(dir, "vm-initrd.gz")
	if err := os.WriteFile(initrdPath, initrd, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(vmInitrdPath, vmInitrd, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURE guests built in %s (node initramfs %d MiB, VM initramfs %d KiB)", time.Since(t0).Round(100*time.Millisecond), len(initrd)>>20, len(vmInitrd)>>10)

	// The bond's peer: a bridge in a namespace of ours with the guest's
	// two taps on it.
	ns := fmt.Sprintf("crl-bond-%d", os.Getpid())
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v %s", strings.Join(args, " "), err, out)
		}
	}
	ip("netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	ip("-n", ns, "link", "add", "br0", "type", "bridge")
	ip("-n", ns, "addr", "add", "10.51.0.1/24", "dev", "br0")
	ip("-n", ns, "link", "set", "br0", "up")
	ip("-n", ns, "link", "set", "lo", "up")
	args := []string{"netns", "exec", ns, "qemu-system-x86_64", "-nodefaults", "-no-user-config",
		"-machine", "pc,accel=tcg", "-cpu", "max", "-m", "1024", "-smp", "2",
		"-display", "none", "-vga", "none", "-no-reboot",
		"-kernel", kernel, "-initrd", initrdPath,
		"-append", netguest.Append + " netguest.run=bond,vlan",
		"-serial", "stdio", "-qmp", "unix:" + filepath.Join(dir, "qmp.sock") + ",server=on,wait=off"}
	for _, n := range nics {
		ip("-n", ns, "tuntap", "add", "dev", n.tap, "mode", "tap")
		ip("-n", ns, "link", "set", n.tap, "master", "br0", "up")
		args = append(args, "-netdev", "tap,id=h"+n.id+",ifname="+n.tap+",script=no,downscript=no,vhost=off",
			"-device", "virtio-net-pci,netdev=h"+n.id+",id="+n.id+",mac="+n.mac+",romfile=")
	}
	for _, v := range vms {
		args = append(args, "-netdev", fmt.Sprintf("socket,id=%s,udp=127.0.0.1:%d,localaddr=127.0.0.1:%d", v.name, v.vmPort, v.nodePort),
			"-device", "virtio-net-pci,netdev="+v.name+",mac="+v.nodeMAC+",romfile=")
	}
	cmd := exec.Command("ip", args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = cmd.Stdout
	boot := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{}) // closed once QEMU is reaped
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	})
	// The VMs boot while the node guest does (their pings fail until the
	// node has plugged their ports into its bridges).
	vmStart := time.Now()
	running := make([]*vmRun, len(vms))
	for i, v := range vms {
		var peers []string
		for p := range v.want {
			peers = append(peers, p)
		}
		sort.Strings(peers)
		running[i] = startVM(t, ns, kernel, vmInitrdPath, v.name, v.mac, v.ip, peers, v.vmPort, v.nodePort)
	}
	type line struct {
		s  string
		at time.Time // when it arrived
	}
	lines := make(chan line, 1024)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- line{strings.TrimRight(sc.Text(), "\r"), time.Now()}
		}
		close(lines)
	}()
	var console []string
	var matchedAt time.Time // when the line next last returned arrived
	next := func(what string, d time.Duration, match func(string) bool) string {
		t.Helper()
		timeout := time.After(d)
		for {
			select {
			case ll, ok := <-lines:
				l := ll.s
				if !ok {
					t.Fatalf("guest console closed waiting for %s:\n%s", what, strings.Join(console, "\n"))
				}
				console = append(console, l)
				if strings.HasPrefix(l, "NETGUEST ") {
					t.Logf("%6.1fs %s", ll.at.Sub(boot).Seconds(), l)
					if strings.Contains(l, " FAIL") {
						t.Fatalf("guest: %s", l)
					}
				}
				if match(l) {
					matchedAt = ll.at
					return l
				}
			case <-timeout:
				t.Fatalf("no %s within %s; console:\n%s", what, d, strings.Join(console, "\n"))
			}
		}
	}

	// Bond: ready with a slave active, both links up.
	bondLine := regexp.MustCompile(`^NETGUEST bond mode=active-backup up=true active=(eth[01]) mac=(\S+) slaves=eth0:up,eth1:up$`)
	m := bondLine.FindStringSubmatch(next("bond0 up", 3*time.Minute, bondLine.MatchString))
	active, mac := m[1], m[2]
	t.Logf("FIGURE power-on to bond0 up: %s", time.Since(boot).Round(100*time.Millisecond))
	ping := func() bool {
		return exec.Command("ip", "netns", "exec", ns, "ping", "-c", "1", "-W", "1", "10.51.0.2").Run() == nil
	}
	for i := 0; !ping(); i++ {
		if i == 30 {
			t.Fatalf("10.51.0.2 (bond0) never answered")
		}
	}
	down := ""
	for _, n := range nics {
		if n.mac == mac {
			down = n.id
		}
	}
	if down == "" {
		t.Fatalf("active slave %s has MAC %s, none of the guest's NICs", active, mac)
	}
	q := dialQMP(t, filepath.Join(dir, "qmp.sock"))
	q.do(t, `{"execute":"qmp_capabilities"}`)
	q.do(t, fmt.Sprintf(`{"execute":"set_link","arguments":{"name":%q,"up":false}}`, down))
	cut := time.Now()
	t.Logf("set_link %s (%s, the active %s) off", down, mac, active)
	// Ping through the failover: every second for 10 s; the bond must be
	// answering again within 3 s and from then on.
	var got []bool
	firstAfter := time.Duration(-1)
	for time.Since(cut) < 10*time.Second {
		s := time.Now()
		ok := ping()
		got = append(got, ok)
		if ok && firstAfter < 0 {
			firstAfter = time.Since(cut)
		}
		if d := time.Second - time.Since(s); d > 0 {
			time.Sleep(d)
		}
	}
	other := map[string]string{"eth0": "eth1", "eth1": "eth0"}[active]
	failover := regexp.MustCompile(`^NETGUEST bond mode=active-backup up=true active=` + other + ` .*slaves=.*` + active + `:down`)
	next("the bond to fail over to "+other, 30*time.Second, failover.MatchString)
	lost := 0
	for _, ok := range got {
		if !ok {
			lost++
		}
	}
	t.Logf("pings through the failover: %v", got)
	t.Logf("FIGURE bond failover: first answer %s after set_link off, %d of %d pings lost", firstAfter.Round(10*time.Millisecond), lost, len(got))
	if firstAfter < 0 || firstAfter > 3*time.Second {
		t.Errorf("bond0 answered %s after its active NIC went down, want within 3 s", firstAfter)
	}
	if n := len(got); n < 4 || !got[n-1] || !got[n-2] || !got[n-3] {
		t.Errorf("pings after the failover did not keep working: %v", got)
	}
	fmt.Fprintln(stdin, "bond-end")

	// VLAN: the guest has its networks and the VMs' ports on their
	// bridges; the VMs (booted with the node guest) ping each other.
	next("the vlan networks", time.Minute, func(l string) bool { return strings.HasPrefix(l, "NETGUEST vlan ready") })
	ready := matchedAt
	// Each VM must have pinged each peer at least 5 times after the
	// ports were plugged, each wanted peer answering the last 3 in a row;
	// no unwanted peer may answer ever.
	deadline := time.Now().Add(4 * time.Minute)
	for {
		done := true
		for i, v := range vms {
			for peer, want := range v.want {
				r := running[i].tally(peer, ready)
				if !want && r.ok > 0 {
					t.Fatalf("%s reached %s across VLANs; console:\n%s", v.name, peer, running[i].console())
				}
				if r.ok+r.fail < 5 || (want && r.tailOK < 3) {
					done = false
				}
			}
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			for i, v := range vms {
				t.Logf("--- %s console:\n%s", v.name, running[i].console())
			}
			t.Fatalf("the VMs did not show the expected pings within 4 minutes")
		}
		time.Sleep(500 * time.Millisecond)
	}
	for i, v := range vms {
		r := running[i]
		var parts []string
		for _, peer := range []string{"10.50.0.1", "10.50.0.2", "10.50.0.3"} {
			if _, ok := v.want[peer]; !ok {
				continue
			}
			x := r.tally(peer, ready)
			first := "never"
			if x.ok > 0 {
				first = fmt.Sprintf("%s after VM start, %s after the ports were plugged",
					x.firstOK.Sub(vmStart).Round(100*time.Millisecond), x.firstOK.Sub(ready).Round(100*time.Millisecond))
			}
			parts = append(parts, fmt.Sprintf("%s %d/%d answered (first %s)", peer, x.ok, x.ok+x.fail, first))
		}
		t.Logf("FIGURE %s (%s): NIC up %s after start; pings to %s", v.name, v.ip, r.upAt().Sub(vmStart).Round(100*time.Millisecond), strings.Join(parts, ", "))
	}
	t.Logf("FIGURE isolation verdict %s after the VMs' start, %s after the ports were plugged", time.Since(vmStart).Round(100*time.Millisecond), time.Since(ready).Round(100*time.Millisecond))
	fmt.Fprintln(stdin, "vlan-end")
	vl := next("the vlan scenario's verdict", time.Minute, func(l string) bool {
		return strings.HasPrefix(l, "NETGUEST vlan ok") || strings.HasPrefix(l, "NETGUEST vlan FAIL")
	})
	if !strings.HasPrefix(vl, "NETGUEST vlan ok") {
		t.Fatal(vl)
	}
	for _, r := range running {
		r.stop()
	}
	next("the guest to finish", time.Minute, func(l string) bool { return strings.HasPrefix(l, "NETGUEST done") })
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Errorf("guest did not power off")
	}
	t.Logf("FIGURE guest power-on to power-off: %s", time.Since(boot).Round(100*time.Millisecond))
}

// vmRun is a VM of the vlan scenario: its QEMU and the lines of its
// console, with the time each arrived.
type vmRun struct {
	stop  func()
	mu    sync.Mutex
	lines []string
	at    []time.Time
}

type pingTally struct {
	ok, fail, tailOK int
	firstOK          time.Time
}

// startVM boots a VM in namespace ns (whose loopback carries its NIC to
// the node guest's) and keeps its console until the test ends.
func startVM(t *testing.T, ns, kernel, initrd, name, mac, ip string, peers []string, port, nodePort int) *vmRun {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", ns, "qemu-system-x86_64", "-nodefaults", "-no-user-config",
		"-machine", "pc,accel=tcg", "-cpu", "max", "-m", "128", "-smp", "1",
		"-display", "none", "-vga", "none", "-no-reboot", "-name", name,
		"-kernel", kernel, "-initrd", initrd, "-append", netguest.VMAppend(ip+"/24", peers),
		"-serial", "stdio",
		"-netdev", fmt.Sprintf("socket,id=n0,udp=127.0.0.1:%d,localaddr=127.0.0.1:%d", nodePort, port),
		"-device", "virtio-net-pci,netdev=n0,mac="+mac+",romfile=")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	exited := make(chan struct{})
	r := &vmRun{}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			r.mu.Lock()
			r.lines = append(r.lines, strings.TrimRight(sc.Text(), "\r"))
			r.at = append(r.at, time.Now())
			r.mu.Unlock()
		}
		_ = cmd.Wait()
		close(exited)
	}()
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		})
	}
	t.Cleanup(r.stop)
	return r
}

// tally counts the VM's "VMPING peer ok|fail" lines; an answer before
// since fails the isolation check all the same, a failure is only counted
// from since.
func (r *vmRun) tally(peer string, since time.Time) pingTally {
	r.mu.Lock()
	defer r.mu.Unlock()
	var x pingTally
	for i, l := range r.lines {
		f := strings.Fields(l)
		if len(f) != 3 || f[0] != "VMPING" || f[1] != peer || (f[2] != "ok" && r.at[i].Before(since)) {
			continue
		}
		if f[2] == "ok" {
			if x.ok == 0 {
				x.firstOK = r.at[i]
			}
			x.ok++
			x.tailOK++
		} else {
			x.fail++
			x.tailOK = 0
		}
	}
	return x
}

// upAt is when the VM's init had its NIC up (zero before).
func (r *vmRun) upAt() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, l := range r.lines {
		if strings.HasPrefix(l, "VMUP ") {
			return r.at[i]
		}
	}
	return time.Time{}
}

func (r *vmRun) console() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ls := r.lines
	if len(ls) > 60 {
		ls = ls[len(ls)-60:]
	}
	return strings.Join(ls, "\n")
}

type qmp struct {
	c net.Conn
	r *bufio.Reader
}

func dialQMP(t *testing.T, sock string) *qmp {
	t.Helper()
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		t.Fatalf("QMP: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	q := &qmp{c: c, r: bufio.NewReader(c)}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if l, err := q.r.ReadString('\n'); err != nil || !strings.Contains(l, "QMP") {
		t.Fatalf("QMP greeting %q: %v", l, err)
	}
	return q
}

// do sends one QMP command and returns its reply, skipping events.
func (q *qmp) do(t *testing.T, cmd string) string {
	t.Helper()
	if !json.Valid([]byte(cmd)) {
		t.Fatalf("QMP command %s is not JSON", cmd)
	}
	if _, err := q.c.Write([]byte(cmd + "\n")); err != nil {
		t.Fatalf("QMP %s: %v", cmd, err)
	}
	for {
		l, err := q.r.ReadString('\n')
		if err != nil {
			t.Fatalf("QMP %s: %v", cmd, err)
		}
		if strings.Contains(l, `"error"`) {
			t.Fatalf("QMP %s: %s", cmd, l)
		}
		if strings.Contains(l, `"return"`) {
			return l
		}
	}
}
