// Package lldpd runs Debian's lldpd (/usr/sbin/lldpd) as a switch stand-in
// for LLDP tests: in a network namespace of its own, at one end of a veth
// pair whose other end stays in the test's namespace for the listener
// under test. The daemon is told its system name, port ID, port
// description and management address, and sends the IEEE 802.1 port VLAN
// ID and a VLAN name as custom TLVs (the VLAN itself needs no kernel
// module that way). It sends every second, so a listener hears it at
// once. Tests only: product code never imports it.
package lldpd

import (
	"bytes"
	"cmp"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/corralhq/corral/testsupport/require"
)

// Binary is where Debian's lldpd package installs the daemon.
const Binary = "/usr/sbin/lldpd"

// Config is what the daemon says about itself. Zero fields take the
// defaults in Start.
type Config struct {
	SystemName        string     // default "corral-test-switch"
	PortID            string     // a locally assigned port ID; default "Ethernet1/1"
	PortDescription   string     // default "corral test port"
	ManagementAddress netip.Addr // an IPv4 address on the daemon's end; default 192.0.2.1
	VLAN              uint16     // port VLAN ID sent; 0 sends none
	VLANName          string     // sent for VLAN when both are set
}

// Peer is a running lldpd and the veth end it is heard on.
type Peer struct {
	// Interface is the listening end's name, in the test's namespace.
	Interface string
	// Namespace is the daemon's network namespace (ip netns name).
	Namespace string
	cmd       *exec.Cmd
	log       *bytes.Buffer
}

var seq atomic.Int32

// StartSilent makes the namespace and veth pair without a daemon: a link
// nobody speaks LLDP on.
func StartSilent(t testing.TB) *Peer {
	t.Helper()
	p, _ := link(t, netip.MustParseAddr("192.0.2.1"))
	return p
}

// link makes the namespace and the veth pair, the far end (returned
// too) holding addr. The test's cleanup deletes the namespace, which
// takes the pair with it.
func link(t testing.TB, addr netip.Addr) (*Peer, string) {
	t.Helper()
	require.Root(t, "network namespaces, veth pairs")
	require.Tool(t, "ip")
	n := seq.Add(1)
	p := &Peer{
		Interface: fmt.Sprintf("lldp%d-%d", os.Getpid()%100000, n),
		Namespace: fmt.Sprintf("corral-lldp-%d-%d", os.Getpid(), n),
	}
	peer := fmt.Sprintf("sw%d-%d", os.Getpid()%100000, n)
	run(t, "netns", "add", p.Namespace)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", p.Namespace).Run() })
	run(t, "link", "add", p.Interface, "type", "veth", "peer", "name", peer, "netns", p.Namespace)
	run(t, "link", "set", p.Interface, "up")
	run(t, "-n", p.Namespace, "link", "set", "lo", "up")
	run(t, "-n", p.Namespace, "link", "set", peer, "up")
	run(t, "-n", p.Namespace, "addr", "add", addr.String()+"/24", "dev", peer)
	return p, peer
}

// Start creates the namespace and veth pair and starts lldpd in it; the
// test's cleanup stops the daemon (its process group, by pid) and deletes
// the namespace, which takes the veth pair with it. It skips the test
// without root or lldpd (fails under CI=true).
func Start(t testing.TB, cfg Config) *Peer {
	t.Helper()
	require.Root(t, "network namespaces, veth pairs, lldpd")
	require.Tool(t, "ip", Binary)
	cfg.SystemName = cmp.Or(cfg.SystemName, "corral-test-switch")
	cfg.PortID = cmp.Or(cfg.PortID, "Ethernet1/1")
	cfg.PortDescription = cmp.Or(cfg.PortDescription, "corral test port")
	if !cfg.ManagementAddress.IsValid() {
		cfg.ManagementAddress = netip.MustParseAddr("192.0.2.1")
	}
	p, peer := link(t, cfg.ManagementAddress)

	// lldpd's unprivileged half opens the control socket: a directory it
	// may enter (t.TempDir's parent is private to root).
	dir, err := os.MkdirTemp("", "corral-lldpd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	conf := []string{
		"configure system hostname " + quote(cfg.SystemName),
		"configure system interface pattern " + peer,
		"configure lldp tx-interval 1",
		fmt.Sprintf("configure ports %s lldp portidsubtype local %s description %s", peer, quote(cfg.PortID), quote(cfg.PortDescription)),
	}
	if cfg.VLAN != 0 {
		conf = append(conf, "configure lldp custom-tlv oui 00,80,c2 subtype 1 oui-info "+hexList([]byte{byte(cfg.VLAN >> 8), byte(cfg.VLAN)}))
		if cfg.VLANName != "" {
			info := append([]byte{byte(cfg.VLAN >> 8), byte(cfg.VLAN), byte(len(cfg.VLANName))}, cfg.VLANName...)
			conf = append(conf, "configure lldp custom-tlv add oui 00,80,c2 subtype 3 oui-info "+hexList(info))
		}
	}
	confFile := filepath.Join(dir, "lldpd.conf")
	if err := os.WriteFile(confFile, []byte(strings.Join(conf, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p.log = &bytes.Buffer{}
	p.cmd = exec.Command("ip", "netns", "exec", p.Namespace, Binary, "-d",
		"-u", filepath.Join(dir, "lldpd.socket"), "-O", confFile, "-I", peer, "-m", cfg.ManagementAddress.String())
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("lldpd: %v", err)
	}
	t.Cleanup(func() { p.stop(t) })
	return p
}

// stop ends the daemon's process group (the daemon and its privilege-
// separated child) and logs what it printed when the test failed.
func (p *Peer) stop(t testing.TB) {
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-done
	}
	if t.Failed() {
		t.Logf("lldpd output:\n%s", p.log)
	}
}

func run(t testing.TB, args ...string) {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
}

// quote makes s one lldpcli word.
func quote(s string) string { return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"` }

func hexList(b []byte) string {
	parts := make([]string, len(b))
	for i, c := range b {
		parts[i] = fmt.Sprintf("%02x", c)
	}
	return strings.Join(parts, ",")
}
