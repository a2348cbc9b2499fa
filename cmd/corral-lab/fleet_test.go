package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corralhq/corral/testsupport/lab"
	"github.com/corralhq/corral/testsupport/require"
)

// fleetLeaseTTL is the appliances' leader lease in TestLabFleet: the
// shortest that is still realistic on a loaded 2-core CI machine.
const fleetLeaseTTL = 5 * time.Second

// Lines the appliances log (store/etcd's elector, lifecycle's delivery).
const (
	leadingLine  = `msg="leading the fleet"`
	planSentLine = `msg="install plan sent"`
)

// TestLabFleet: corral-lab up --appliances 2 (both serving DHCP on the one
// segment, leases shared through etcd), one BIOS machine, auto-accept.
// The fleet answers the CLI through either appliance and has one leader.
// The machine is powered on while only the leader is on the boot segment
// (the other's bridge port is detached until the machine has its discovery
// script), so it boots from the leader, whose endpoint its agent dials
// first. As soon as an appliance has delivered the install plan (the
// machine is INSTALLING), that appliance — the one holding the agent's
// session, the leader by this arrangement — is killed with SIGKILL. If it
// led, the other must take over (its "leading the fleet" line; the time
// from the kill is printed). The install completes through the other
// appliance: the machine reaches DEPLOYED and its node READY. The
// takeover and total times are printed, not asserted. The machine has no
// TPM (--tpm none): a machine without one registers on its identifiers and
// boot MAC alone (docs/security.md, "What a TPM proves") and still reaches
// READY.
func TestLabFleet(t *testing.T) {
	need(t)
	require.Tool(t, "etcd")
	t0 := time.Now()
	r := up(t, "--appliances", "2", "--appliance-dhcp", "all", "--machines", "1", "--firmware", "bios", "--tpm", "none", "--power-on=false",
		"--corrald-arg=--leader-lease-ttl="+fleetLeaseTTL.String(), "--corrald-arg=--reconcile-interval=3s")
	st := r.st
	if !st.Fleet() || len(st.Appliances) != 2 || len(st.Etcd) != 3 {
		t.Fatalf("state: %d appliances, %d etcd members, want a fleet of 2 on 3", len(st.Appliances), len(st.Etcd))
	}
	if !st.AutoAccept {
		require.Missing(t, "corrald has no --auto-accept: the machine would stay INVENTORIED")
	}
	t.Cleanup(func() {
		if t.Failed() {
			fleetLogs(t, st)
		}
	})

	if !t.Run("fleet", func(t *testing.T) { checkFleet(t, r.in(t)) }) {
		t.Run("down", func(t *testing.T) { checkDown(t, r.in(t)) })
		return
	}

	t.Run("kill-holder-mid-install", func(t *testing.T) {
		r := r.in(t)
		lm := st.Machines[0]
		leader := currentLeader(st)
		for _, a := range st.Appliances {
			if a.Name != leader {
				ipn(t, st, "link", "set", a.Port, "nomaster")
				t.Logf("%s is off the boot segment until %s has its discovery script", a.Name, lm.Name)
			}
		}
		out, err := exec.Command("ip", "netns", "exec", st.Namespace, lm.Chassis(), "set", "power", "1").CombinedOutput()
		if err != nil {
			t.Fatalf("power on %s: %v: %s", lm.Name, err, out)
		}
		poweredAt := time.Now()
		t.Logf("%s powered on", lm.Name)
		r.waitFor(lm.Name+"'s discovery script rendered by "+leader, 5*time.Minute, func() bool {
			out, err := r.corral("machine", "timeline", lm.MAC, "-o", "json")
			if err != nil {
				return false
			}
			var es []struct{ Source, Event string }
			if json.Unmarshal(out, &es) != nil {
				return false
			}
			for _, e := range es {
				if e.Source == "http" && e.Event == "script" {
					return true
				}
			}
			return false
		})
		for _, a := range st.Appliances {
			if a.Name != leader {
				ipn(t, st, "link", "set", a.Port, "master", st.Bridge)
				t.Logf("%s is back on the boot segment", a.Name)
			}
		}

		// The appliance that delivers the plan holds the agent's session:
		// poll the logs often, the install itself takes seconds.
		var holder lab.Appliance
		deadline := time.Now().Add(6 * time.Minute)
		for holder.Name == "" {
			for _, a := range st.Appliances {
				if strings.Contains(readFile(a.Log), planSentLine) {
					holder = a
					break
				}
			}
			if holder.Name != "" {
				break
			}
			if b := readFile(lm.Console()); strings.Contains(b, "panic: ") {
				t.Fatalf("a program on %s's console panicked:\n%s", lm.Name, b[strings.Index(b, "panic: "):min(len(b), strings.Index(b, "panic: ")+1500)])
			}
			if time.Now().After(deadline) {
				t.Fatalf("no appliance sent the install plan within 6m of power-on\n%s", r.lab("status", "--events", "15"))
			}
			time.Sleep(100 * time.Millisecond)
		}
		if holder.Name != leader {
			t.Logf("the session is on %s, not on the leader %s whose script the machine booted", holder.Name, leader)
		}
		var survivor lab.Appliance
		for _, a := range st.Appliances {
			if a.Name != holder.Name {
				survivor = a
			}
		}
		leadsBefore := strings.Count(readFile(survivor.Log), leadingLine)
		if err := syscall.Kill(holder.Process.PID, syscall.SIGKILL); err != nil {
			t.Fatalf("kill -9 %s (pid %d): %v", holder.Name, holder.Process.PID, err)
		}
		killedAt := time.Now()
		t.Logf("%s delivered the install plan %s after power-on; killed it (pid %d) with SIGKILL; leader was %s",
			holder.Name, killedAt.Sub(poweredAt).Round(100*time.Millisecond), holder.Process.PID, orNone(leader))

		// The rest goes through the survivor.
		rs := r.via(survivor)
		ms := rs.machines()
		m, ok := ms[lm.Name]
		if !ok {
			t.Fatalf("%s: no machine record through %s", lm.Name, survivor.Name)
		}
		t.Logf("%s is %s (%s)", m.Name, m.State, m.StateReason)
		// The timeline names the endpoint the plan was sent from: the
		// holder's.
		if tl := string(rs.mustCorral("machine", "timeline", m.Name)); !strings.Contains(tl, "endpoint "+holder.Endpoint()) {
			t.Errorf("the timeline's plan-sent entry does not name %s's endpoint %s:\n%s", holder.Name, holder.Endpoint(), tl)
		}

		takeover := time.Duration(0)
		if leader == holder.Name {
			var at time.Time
			rs.waitFor(survivor.Name+" leads the fleet", 3*fleetLeaseTTL+30*time.Second, func() bool {
				lines := matching(readFile(survivor.Log), leadingLine)
				if len(lines) <= leadsBefore {
					return false
				}
				at = logTime(lines[len(lines)-1])
				return true
			})
			if at.IsZero() {
				t.Errorf("%s's \"leading the fleet\" line has no time", survivor.Name)
			} else {
				takeover = at.Sub(killedAt)
				t.Logf("leader takeover: %s after the kill (lease TTL %s)", takeover.Round(10*time.Millisecond), fleetLeaseTTL)
			}
		} else {
			t.Logf("%s held the session but %s led: no takeover to measure", holder.Name, orNone(leader))
		}

		var last string
		rs.waitFor(lm.Name+" DEPLOYED, node READY through "+survivor.Name, 8*time.Minute, func() bool {
			m := rs.machines()[lm.Name]
			n := rs.nodes()[lm.Name]
			if cur := m.State + " " + m.StateReason + " node " + n.State; cur != last {
				t.Logf("%s: %s (%s), node %q %s", lm.Name, m.State, m.StateReason, n.Name, n.State)
				last = cur
			}
			if m.State == "FAILED" {
				t.Fatalf("%s FAILED: %s\n%s", lm.Name, m.StateReason, rs.lab("status", "--events", "20"))
			}
			return m.State == "DEPLOYED" && n.State == "READY"
		})
		done := time.Now()
		if m := rs.machines()[lm.Name]; m.EKIdentity != "" {
			t.Errorf("%s has no TPM but a TPM key %q is bound", lm.Name, m.EKIdentity)
		}
		// The install finished through the survivor: its session took the
		// agent's done and rebooted the machine.
		if !strings.Contains(readFile(survivor.Log), `msg="install done: rebooting into the hypervisor"`) {
			t.Errorf("%s's log has no \"install done\" line: the install did not complete through it", survivor.Name)
		}
		t.Logf("corral-lab status:\n%s", rs.lab("status", "--events", "12"))
		if b, _ := rs.corral("get", "appliances"); len(b) > 0 {
			t.Logf("corral get appliances (through %s):\n%s", survivor.Name, b)
		}
		tk := "no takeover (the holder was not the leader)"
		if takeover > 0 {
			tk = "leader takeover " + takeover.Round(10*time.Millisecond).String()
		}
		fmt.Printf("fleet kill: %s killed mid-install; %s; READY %s after the kill, %s after power-on, %s in all (corral-lab up included)\n",
			holder.Name, tk, done.Sub(killedAt).Round(time.Second), done.Sub(poweredAt).Round(time.Second), done.Sub(t0).Round(time.Second))
	})

	t.Run("down", func(t *testing.T) { checkDown(t, r.in(t)) })
}

// checkFleet: the etcd members and both appliances run, exactly one
// appliance leads, each answers the CLI with the first appliance's
// admin credentials, and corral-lab status shows the fleet.
func checkFleet(t *testing.T, r *rack) {
	st := r.st
	for _, m := range st.Etcd {
		if !processAlive(m.Process) {
			t.Errorf("etcd %s (pid %d) is not running", m.Name, m.Process.PID)
		}
	}
	for _, a := range st.Appliances {
		if !processAlive(a.Process) {
			t.Errorf("%s (pid %d) is not running", a.Name, a.Process.PID)
			continue
		}
		var ms []machine
		out := r.via(a).mustCorral("get", "machines", "-o", "json")
		if err := json.Unmarshal(out, &ms); err != nil {
			t.Errorf("%s: corral get machines -o json: %v\n%s", a.Name, err, out)
		}
	}
	// The first appliance campaigns alone before the second starts.
	leaders := 0
	r.waitFor("one appliance leads", 3*fleetLeaseTTL, func() bool {
		leaders = 0
		for _, a := range st.Appliances {
			if strings.Contains(readFile(a.Log), leadingLine) {
				leaders++
			}
		}
		return leaders > 0
	})
	if leaders != 1 {
		t.Errorf("%d appliances logged %q, want exactly one", leaders, leadingLine)
	}
	status := r.lab("status")
	t.Logf("corral-lab status:\n%s", status)
	for _, a := range st.Appliances {
		if !strings.Contains(status, a.Name) || !strings.Contains(status, a.Endpoint()) {
			t.Errorf("corral-lab status does not show %s at %s", a.Name, a.Endpoint())
		}
	}
	// `corral get appliances` lists the fleet where the appliances serve
	// it (the fleet's runners, docs/fleet.md); until then the call's error is logged.
	out, err := r.corral("get", "appliances")
	if err != nil {
		t.Logf("corral get appliances: %v: %s", err, out)
		return
	}
	t.Logf("corral get appliances:\n%s", out)
	for _, a := range st.Appliances {
		if !strings.Contains(string(out), a.Name) {
			t.Errorf("corral get appliances does not list %s", a.Name)
		}
	}
}

// ipn runs ip in the lab's namespace.
func ipn(t *testing.T, st *lab.State, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", append([]string{"-n", st.Namespace}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("ip -n %s %s: %v: %s", st.Namespace, strings.Join(args, " "), err, out)
	}
}

// via returns r talking to appliance a (its client file).
func (r *rack) via(a lab.Appliance) *rack {
	st := *r.st
	st.ClientConfig = a.ClientConfig
	c := *r
	c.st = &st
	return &c
}

// currentLeader is the appliance whose log has the newest "leading the
// fleet" line ("" when none has).
func currentLeader(st *lab.State) string {
	name, newest := "", time.Time{}
	for _, a := range st.Appliances {
		lines := matching(readFile(a.Log), leadingLine)
		if len(lines) == 0 {
			continue
		}
		if at := logTime(lines[len(lines)-1]); name == "" || at.After(newest) {
			name, newest = a.Name, at
		}
	}
	return name
}

// matching returns the lines of s that contain sub.
func matching(s, sub string) []string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, sub) {
			out = append(out, line)
		}
	}
	return out
}

// logTime reads the time= field of a slog text line (zero if absent).
func logTime(line string) time.Time {
	f, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
	at, _ := time.Parse(time.RFC3339Nano, f)
	return at
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

// processAlive reports whether a lab process still runs as itself.
func processAlive(p lab.Process) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.PID))
	return err == nil && strings.Contains(string(b), p.Marker)
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// fleetLogs prints the tails of every appliance's and etcd member's log
// and of the consoles.
func fleetLogs(t *testing.T, st *lab.State) {
	tailf := func(p string, n int) string {
		s := readFile(p)
		return s[max(0, len(s)-n):]
	}
	for _, a := range st.Appliances {
		t.Logf("--- %s (%s)\n%s", a.Name, a.Log, tailf(a.Log, 6000))
	}
	for _, m := range st.Etcd {
		t.Logf("--- etcd %s\n%s", m.Name, tailf(m.Log, 1500))
	}
	for _, m := range st.Machines {
		t.Logf("--- %s console\n%s", m.Name, tailf(m.Console(), 4000))
	}
}
