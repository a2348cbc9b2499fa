package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corralhq/corral/testsupport/lab"
	"github.com/corralhq/corral/testsupport/require"
)

// The end-to-end tests run the real corral-lab binary: corrald in a
// network namespace, QEMU machines under TCG behind ipmi_sim BMCs. They
// need root, QEMU, OVMF and OpenIPMI (corral-lab apt-get installs what is
// missing) and take minutes; -short skips them.

var (
	labBin string
	srcDir string
)

func TestMain(m *testing.M) {
	flag.Parse()
	code := func() int {
		if testing.Short() || os.Geteuid() != 0 {
			return m.Run()
		}
		dir, err := os.MkdirTemp("", "corral-lab-e2e-bin")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		wd, _ := os.Getwd()
		srcDir = filepath.Clean(filepath.Join(wd, "../.."))
		labBin = filepath.Join(dir, "corral-lab")
		if out, err := exec.Command("go", "build", "-o", labBin, ".").CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build corral-lab: %v\n%s", err, out)
			return 1
		}
		return m.Run()
	}()
	os.Exit(code)
}

func need(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("corral-lab end-to-end: minutes of QEMU under TCG; skipped with -short")
	}
	require.Root(t, "corral-lab end-to-end: network namespaces, taps")
	require.Tool(t, "ip", "go")
}

// rack is one lab under test.
type rack struct {
	t   *testing.T
	dir string
	st  *lab.State
}

// up runs corral-lab up and registers corral-lab down at cleanup.
func up(t *testing.T, args ...string) *rack {
	t.Helper()
	dir, err := os.MkdirTemp("", "corral-lab-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	r := &rack{t: t, dir: dir}
	t.Cleanup(func() {
		if _, err := lab.LoadState(dir); err == nil {
			out, err := exec.Command(labBin, "--dir", dir, "down").CombinedOutput()
			t.Logf("corral-lab down (cleanup): %v\n%s", err, out)
		}
		if t.Failed() || os.Getenv("CORRAL_KEEP_LAB") != "" {
			t.Logf("lab files kept in %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	full := append([]string{"--dir", dir, "up", "--source", srcDir}, args...)
	t0 := time.Now()
	cmd := exec.Command(labBin, full...)
	out, err := cmd.CombinedOutput()
	t.Logf("corral-lab %s (%s):\n%s", strings.Join(full, " "), time.Since(t0).Round(time.Second), out)
	if st, lerr := lab.LoadState(dir); lerr == nil {
		r.st = st
	}
	if err != nil {
		r.logs()
		t.Fatalf("corral-lab up: %v", err)
	}
	return r
}

// in returns r reporting to t (a subtest): failing the parent from a
// subtest is not allowed.
func (r *rack) in(t *testing.T) *rack { c := *r; c.t = t; return &c }

func (r *rack) lab(args ...string) string {
	r.t.Helper()
	out, err := exec.Command(labBin, append([]string{"--dir", r.dir}, args...)...).CombinedOutput()
	if err != nil {
		r.t.Fatalf("corral-lab %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// corral runs the CLI from the host through the lab's veth.
func (r *rack) corral(args ...string) ([]byte, error) {
	return exec.Command(r.st.Bin.Corral, append([]string{"--config", r.st.ClientConfig}, args...)...).CombinedOutput()
}

func (r *rack) mustCorral(args ...string) []byte {
	r.t.Helper()
	out, err := r.corral(args...)
	if err != nil {
		r.t.Fatalf("corral %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// machine is the part of a Machine record (proto JSON names) checked here.
type machine struct {
	Name        string   `json:"name"`
	Serial      string   `json:"serial"`
	BootMAC     string   `json:"boot_mac"`
	MACs        []string `json:"macs"`
	State       string   `json:"state"`
	StateReason string   `json:"state_reason"`
	NodeName    string   `json:"node_name"`
	EKIdentity  string   `json:"ek_identity"`
	Facts       struct {
		Baseboard struct {
			Serial string `json:"serial"`
		} `json:"baseboard"`
		Disks []struct {
			Serial string `json:"serial"`
		} `json:"disks"`
	} `json:"facts"`
}

type node struct {
	Name   string `json:"name"`
	Serial string `json:"serial"`
	State  string `json:"state"`
}

func (r *rack) machines() map[string]machine {
	r.t.Helper()
	var ms []machine
	if err := json.Unmarshal(r.mustCorral("get", "machines", "-o", "json"), &ms); err != nil {
		r.t.Fatal(err)
	}
	out := map[string]machine{}
	for _, lm := range r.st.Machines {
		for _, m := range ms {
			if m.BootMAC == lm.MAC || m.Serial == lm.Serial {
				out[lm.Name] = m
			}
		}
	}
	return out
}

func (r *rack) nodes() map[string]node {
	r.t.Helper()
	var ns []node
	out, err := r.corral("get", "nodes", "-o", "json")
	if err != nil || json.Unmarshal(out, &ns) != nil {
		return nil
	}
	ms := r.machines()
	res := map[string]node{}
	for _, lm := range r.st.Machines {
		for _, n := range ns {
			if (ms[lm.Name].NodeName != "" && n.Name == ms[lm.Name].NodeName) || (n.Serial != "" && n.Serial == lm.Serial) {
				res[lm.Name] = n
			}
		}
	}
	return res
}

// waitFor polls cond every 3 s until it holds or timeout passes. A Go
// panic on a machine's console (the agent died) fails at once.
func (r *rack) waitFor(what string, timeout time.Duration, cond func() bool) {
	r.t.Helper()
	t0 := time.Now()
	for !cond() {
		for _, m := range r.st.Machines {
			b, _ := os.ReadFile(m.Console())
			if i := strings.Index(string(b), "panic: "); i >= 0 {
				r.t.Fatalf("%s: waiting for %s: a program on %s's console panicked:\n%s", time.Since(t0).Round(time.Second), what, m.Name, string(b[i:min(len(b), i+1500)]))
			}
		}
		if time.Since(t0) > timeout {
			r.logs()
			r.t.Fatalf("%s: not within %s\n%s", what, timeout, r.lab("status", "--events", "12"))
		}
		time.Sleep(3 * time.Second)
	}
	r.t.Logf("%s after %s", what, time.Since(t0).Round(time.Second))
}

// logs prints the tails of corrald's log and the consoles.
func (r *rack) logs() {
	if r.st == nil {
		return
	}
	tailf := func(p string, n int) string {
		b, _ := os.ReadFile(p)
		if len(b) > n {
			b = b[len(b)-n:]
		}
		return string(b)
	}
	r.t.Logf("--- corrald.log\n%s", tailf(filepath.Join(r.st.RunDir, "corrald.log"), 4096))
	for _, m := range r.st.Machines {
		r.t.Logf("--- %s console\n%s", m.Name, tailf(m.Console(), 3072))
	}
}

func labMachine(st *lab.State, name string) lab.Machine {
	for _, m := range st.Machines {
		if m.Name == name {
			return m
		}
	}
	return lab.Machine{}
}

func corraldHas(t *testing.T, r *rack, flag string) bool {
	out, _ := exec.Command(r.st.Bin.Corrald, "serve", "--help").CombinedOutput()
	return strings.Contains(string(out), "--"+flag+" ")
}

// TestLab: corral-lab up with one BIOS and one UEFI machine behind BMCs;
// both PXE-boot and are inventoried with their serials; accepted, they
// install (each node key made on its machine: the plans carry none, the
// node serves the key whose request the appliance signed, and no private
// key on the appliance is it), boot the hypervisor image and their nodes
// become READY; a `corral do` DAG puts a VM on one; that machine's QEMU is killed (node
// NOT_READY) and powered on through its BMC (READY again, disk intact);
// corral-lab down leaves nothing behind.
func TestLab(t *testing.T) {
	need(t)
	r := up(t, "--machines", "2", "--with-bmc", "--firmware", "bios,uefi", "--until", "inventoried", "--wait", "6m")
	st := r.st

	t.Run("inventoried", func(t *testing.T) {
		r := r.in(t)
		ms := r.machines()
		for _, lm := range st.Machines {
			m, ok := ms[lm.Name]
			if !ok {
				t.Fatalf("%s (MAC %s) has no machine record", lm.Name, lm.MAC)
			}
			if m.Serial != lm.Serial {
				t.Errorf("%s: serial %q, want %q", lm.Name, m.Serial, lm.Serial)
			}
			if m.Facts.Baseboard.Serial != "" && m.Facts.Baseboard.Serial != lm.Board {
				t.Errorf("%s: baseboard serial %q, want %q", lm.Name, m.Facts.Baseboard.Serial, lm.Board)
			}
			disks := map[string]bool{}
			for _, d := range m.Facts.Disks {
				disks[d.Serial] = true
			}
			for _, d := range lm.Disks {
				if !disks[d.Serial] {
					t.Errorf("%s: disk serial %s not in facts %v", lm.Name, d.Serial, disks)
				}
			}
			switch m.State {
			case "INVENTORIED", "INSTALLING", "DEPLOYED":
			default:
				t.Errorf("%s: state %s (%s), want INVENTORIED or later", lm.Name, m.State, m.StateReason)
			}
			// The UEFI machine went through firmware PXE → TFTP iPXE
			// (snponly.efi, or ipxe.efi where the catalog lacks it); the
			// BIOS one through QEMU's iPXE ROM straight to HTTP.
			tl := string(r.mustCorral("machine", "timeline", m.Name, "-o", "json"))
			tftp := strings.Contains(tl, "snponly.efi") || strings.Contains(tl, "ipxe.efi")
			if lm.Firmware == "uefi" && !tftp {
				t.Errorf("%s (UEFI): no TFTP snponly.efi or ipxe.efi in the timeline", lm.Name)
			}
			if lm.Firmware == "bios" && tftp {
				t.Errorf("%s (BIOS): fetched an EFI iPXE", lm.Name)
			}
			// Each machine has a swtpm TPM: it proved its endorsement
			// key, and the record binds it (docs/security.md, "Claims").
			if len(m.EKIdentity) != 64 || !strings.Contains(tl, "tpm-proved") {
				t.Errorf("%s: TPM key %q bound, tpm-proved on the timeline: %t; want both", lm.Name, m.EKIdentity, strings.Contains(tl, "tpm-proved"))
			}
		}
		if a, b := ms[st.Machines[0].Name].EKIdentity, ms[st.Machines[1].Name].EKIdentity; a == b {
			t.Errorf("the machines share a TPM key %q", a)
		}
		if ms[st.Machines[0].Name].Serial == ms[st.Machines[1].Name].Serial {
			t.Errorf("the machines share a serial")
		}
		t.Logf("corral-lab status:\n%s", r.lab("status"))
	})

	ready := t.Run("ready", func(t *testing.T) {
		r := r.in(t)
		if !st.AutoAccept {
			require.Missing(t, "corrald has no --auto-accept: machines stay INVENTORIED")
		}
		r.waitFor("both nodes READY", 12*time.Minute, func() bool {
			ns := r.nodes()
			for _, lm := range st.Machines {
				if ns[lm.Name].State != "READY" {
					return false
				}
			}
			return true
		})
		kexec := corraldHas(t, r, "kexec-timeout")
		for name, m := range r.machines() {
			if m.State != "DEPLOYED" {
				t.Errorf("%s: state %s, want DEPLOYED", name, m.State)
			}
			// The install booted the hypervisor image with kexec,
			// and the agent's kexec did not fail. A node slower than
			// --kexec-timeout (a loaded machine) is rebooted the old way:
			// logged, not failed.
			if tl := string(r.mustCorral("machine", "timeline", name)); kexec {
				switch f := kexecFallback.FindString(tl); {
				case !kexecEntry.MatchString(tl):
					t.Errorf("%s: the timeline shows no kexec into the hypervisor image:\n%s", name, tl)
				case strings.Contains(f, "failed"):
					t.Errorf("%s: the kexec into the hypervisor image failed:\n%s", name, tl)
				case f != "":
					t.Logf("%s: the kexec'd node was not READY within --kexec-timeout: rebooted the old way", name)
				}
			}
		}
		t.Logf("corral-lab report:\n%s", r.lab("report"))
	})

	if ready {
		// The node keys were made on the machines: the plans carried
		// none, and the appliance never had them (nodekey_test.go).
		t.Run("node-keys", func(t *testing.T) { checkNodeKeys(t, r.in(t)) })
	}

	vmOK := ready && t.Run("vm", func(t *testing.T) {
		r := r.in(t)
		nodeName := r.nodes()["lab-1"].Name
		dag := fmt.Sprintf(`ApplyNetwork:
  type: Network
  action: ApplyNetwork
  args:
    name: lab-net
    ipv4_cidr: 192.168.77.0/24
CreateBlockStorage:
  type: BlockStorage
  action: CreateBlockStorage
  args:
    name: lab-disk
    annotations:
      n0core/provisioning/block_storage/request_node_name: %[1]s
    request_bytes: 1073741824
    limit_bytes: 1073741824
CreateVirtualMachine:
  type: VirtualMachine
  action: CreateVirtualMachine
  args:
    name: lab-vm
    annotations:
      n0core/provisioning/virtual_machine/request_node_name: %[1]s
    request_cpu_milli_core: 10
    limit_cpu_milli_core: 1000
    request_memory_bytes: 268435456
    limit_memory_bytes: 268435456
    block_storage_names:
      - lab-disk
    nics:
      - network_name: lab-net
  depends_on:
    - ApplyNetwork
    - CreateBlockStorage
`, nodeName)
		f := filepath.Join(r.dir, "lab-dag.yaml")
		if err := os.WriteFile(f, []byte(dag), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("corral do:\n%s", r.mustCorral("do", f))
		r.waitFor("lab-vm RUNNING", 3*time.Minute, func() bool {
			out, _ := r.corral("get", "vm", "lab-vm", "-o", "json")
			return strings.Contains(string(out), `"RUNNING"`)
		})
		t.Logf("corral describe vm lab-vm:\n%s", r.mustCorral("describe", "vm", "lab-vm"))
	})

	if ready {
		t.Run("node-loss", func(t *testing.T) {
			r := r.in(t)
			lm := labMachine(st, "lab-1")
			pid := 0
			if b, err := os.ReadFile(lm.QEMUPidFile()); err == nil {
				fmt.Sscan(string(b), &pid)
			}
			if pid <= 0 {
				t.Fatalf("lab-1: no QEMU pid in %s", lm.QEMUPidFile())
			}
			before, nBefore := lastNodeLine(lm.Console())
			if before == "" {
				t.Fatalf("lab-1's console has no \"corral: node ...\" line from the hypervisor boot")
			}
			_, bsErr := r.corral("get", "bs", "lab-disk")
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatalf("kill lab-1 QEMU %d: %v", pid, err)
			}
			t.Logf("killed lab-1's QEMU (pid %d)", pid)
			// 30 s without heartbeats + one 15 s sweep, with slack.
			r.waitFor("lab-1 node NOT_READY", 75*time.Second, func() bool { return r.nodes()["lab-1"].State == "NOT_READY" })
			t.Logf("corral machine power on lab-1:\n%s", r.mustCorral("machine", "power", "on", "lab-1"))
			r.waitFor("lab-1 node READY again", 8*time.Minute, func() bool { return r.nodes()["lab-1"].State == "READY" })
			// The data disk is mounted as it was: the node comes back with
			// the identity of the same install (a reinstall would format it).
			after, nAfter := lastNodeLine(lm.Console())
			t.Logf("before: %s\nafter:  %s", before, after)
			if nAfter <= nBefore {
				t.Errorf("no new hypervisor boot line on lab-1's console (%d before, %d after)", nBefore, nAfter)
			}
			if after != before {
				t.Errorf("lab-1 came back as %q, was %q: data disk not the same", after, before)
			}
			if bsErr == nil {
				if out, err := r.corral("get", "bs", "lab-disk", "-o", "json"); err != nil || !strings.Contains(string(out), "AVAILABLE") && !strings.Contains(string(out), "IN_USE") {
					t.Errorf("lab-disk after the reboot: %v\n%s", err, out)
				}
			}
			if vmOK {
				// The node itself starts the VM again from its data disk
				// (spec, volume, network): the record alone could be stale.
				r.waitFor("lab-1 restarts lab-vm from its data disk", 2*time.Minute, func() bool {
					b, _ := os.ReadFile(lm.Console())
					return restarted.Match(b)
				})
				if b, _ := os.ReadFile(lm.Console()); restartFailed.Match(b) || strings.Contains(string(b), `msg="restore network"`) {
					t.Errorf("lab-1 could not restore lab-vm or its network (console above in the failure dump)")
				}
				r.waitFor("lab-vm RUNNING after the node's reboot", 3*time.Minute, func() bool {
					out, _ := r.corral("get", "vm", "lab-vm", "-o", "json")
					return strings.Contains(string(out), `"RUNNING"`)
				})
			}
		})
	}

	t.Run("down", func(t *testing.T) { checkDown(t, r.in(t)) })
}

// lastNodeLine returns the newest "corral: node NAME (machine M, install
// ID) from DIR" line the hypervisor image printed on a console.
// and how many such lines there are (one per hypervisor boot, or two
// when the console doubles lines).
func lastNodeLine(console string) (string, int) {
	b, _ := os.ReadFile(console)
	last, n := "", 0
	for _, line := range strings.Split(string(b), "\n") {
		if i := strings.Index(line, "corral: node "); i >= 0 && strings.Contains(line, "install ") {
			last = strings.TrimSpace(line[i:])
			n++
		}
	}
	return last, n
}

// The lifecycle's kexec timeline entries (corral machine timeline: source,
// then event).
var (
	kexecEntry    = regexp.MustCompile(`\blifecycle\s+kexec\s`)
	kexecFallback = regexp.MustCompile(`\blifecycle\s+kexec-(failed|timeout)\b`)
)

// The node agent's log lines on the console when it restarts a VM after a
// reboot (slog text: msg, then node=, then vm=).
var (
	restarted     = regexp.MustCompile(`msg="restarting vm whose qemu is gone" .*\bvm=lab-vm\b`)
	restartFailed = regexp.MustCompile(`msg="restart vm" .*\bvm=lab-vm\b`)
)

// checkDown runs corral-lab down and checks nothing of the lab is left.
func checkDown(t *testing.T, r *rack) {
	st := r.st
	t.Logf("corral-lab down:\n%s", r.lab("down"))
	if out, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(out), st.Namespace) {
		t.Errorf("namespace %s left behind", st.Namespace)
	}
	if exec.Command("ip", "link", "show", "dev", st.VethHost).Run() == nil {
		t.Errorf("veth %s left behind", st.VethHost)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, _ := os.ReadFile(p)
		if strings.Contains(string(b), r.dir) {
			t.Errorf("process left behind: %s: %q", p, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	if _, err := lab.LoadState(r.dir); err == nil {
		t.Errorf("state file still there")
	}
}

// TestLabBootWatchdog: a machine whose discovery initrd is missing from
// the catalog fails to boot; corrald's boot watchdog power-cycles it
// through its BMC and then marks it FAILED with a reason naming the step.
func TestLabBootWatchdog(t *testing.T) {
	need(t)
	r := up(t, "--machines", "1", "--with-bmc", "--firmware", "bios", "--accept=false", "--power-on=false",
		"--corrald-arg=--boot-watchdog=40s", "--corrald-arg=--boot-watchdog-cycles=1", "--corrald-arg=--reconcile-interval=5s")
	if !corraldHas(t, r, "boot-watchdog") {
		require.Missing(t, "corrald has no --boot-watchdog")
	}
	// The catalog's initrd goes: iPXE's fetch 404s and the boot stops.
	initrd := filepath.Join(r.st.DataDir, "images", "initrd.img")
	if err := os.Remove(initrd); err != nil {
		t.Fatal(err)
	}
	t.Logf("corral machine power on lab-1:\n%s", r.mustCorral("machine", "power", "on", "lab-1"))
	var m machine
	r.waitFor("lab-1 FAILED", 5*time.Minute, func() bool {
		m = r.machines()["lab-1"]
		return m.State == "FAILED"
	})
	t.Logf("lab-1 FAILED: %s", m.StateReason)
	tl := string(r.mustCorral("machine", "timeline", "lab-1"))
	if !strings.Contains(tl, "watchdog") {
		t.Errorf("no watchdog power cycle in the timeline:\n%s", tl)
	}
	// e.g. "boot watchdog: no agent after 40s ×1; last: http http-refused
	// status=404 path=/images/initrd.img: catalog file unreadable"
	if !strings.Contains(m.StateReason, "watchdog") || !strings.Contains(m.StateReason, "http-refused") || !strings.Contains(m.StateReason, "initrd.img") {
		t.Errorf("FAILED reason %q names neither the watchdog nor the failing step (the initrd fetch refused)", m.StateReason)
	}
	t.Run("down", func(t *testing.T) { checkDown(t, r.in(t)) })
}
