package lifecycle

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
)

// fakeBoot renders a fixed hypervisor boot, or err.
type fakeBoot struct {
	err error

	mu    sync.Mutex
	calls []string // machine mac host
}

func (f *fakeBoot) KexecPlan(_ context.Context, machine, mac, host, _ string) (*nodev1.KexecPlan, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, machine+" "+mac+" "+host)
	if f.err != nil {
		return nil, f.err
	}
	return &nodev1.KexecPlan{KernelUrl: "http://10.0.0.1:8080/images/vmlinuz?mac=" + mac, KernelSha256: strings.Repeat("a", 64), KernelSize: 10,
		InitrdUrl: "http://10.0.0.1:8080/images/hypervisor-initrd.img?mac=" + mac, InitrdSha256: strings.Repeat("b", 64), InitrdSize: 20,
		Cmdline: "initrd=hypervisor-initrd.img corral.mode=hypervisor corral.mac=" + mac}, nil
}

// eventLines lists the machine's timeline as "source event" lines.
func (h *harness) eventLines(name string) []string {
	h.t.Helper()
	ctx := context.Background()
	if err := h.inv.FlushTimeline(ctx); err != nil {
		h.t.Fatal(err)
	}
	es, err := h.inv.Timeline(ctx, name, "", 0)
	if err != nil {
		h.t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.GetSource()+" "+e.GetEvent())
	}
	return out
}

func hasEvent(es []string, want string) bool {
	for _, e := range es {
		if e == want {
			return true
		}
	}
	return false
}

// bmcCycles counts the power cycles asked of the BMC.
func (h *harness) bmcCycles() int {
	_, acts := h.bmc.log()
	n := 0
	for _, a := range acts {
		if a == inventoryv1.PowerAction_POWER_ACTION_CYCLE {
			n++
		}
	}
	return n
}

// TestInstallRebootOrKexec: after an install's done, an agent that named
// the kexec capability gets a KexecPlan for that install (no BMC cycle,
// no Reboot), one that did not gets the old reboot, and a kexec that
// cannot be made falls back to the old reboot at once, with the reason on
// the timeline.
func TestInstallRebootOrKexec(t *testing.T) {
	tests := map[string]struct {
		caps    []string
		boot    *fakeBoot // nil: no Config.Kexec
		timeout time.Duration
		bmc     bool
		// want: "kexec", "cycle" (BMC) or "reboot" (session command)
		want     string
		armedBy  string
		wantLine string // a timeline entry
	}{
		"kexec":                          {caps: []string{nodev1.CapabilityKexec}, boot: &fakeBoot{}, bmc: true, want: "kexec", armedBy: ArmedByKexec, wantLine: "lifecycle kexec"},
		"kexec without a BMC":            {caps: []string{nodev1.CapabilityKexec}, boot: &fakeBoot{}, want: "kexec", armedBy: ArmedByKexec, wantLine: "lifecycle kexec"},
		"old agent: BMC cycle":           {boot: &fakeBoot{}, bmc: true, want: "cycle", armedBy: armedByInstall, wantLine: "lifecycle power-cycle"},
		"old agent: Reboot":              {boot: &fakeBoot{}, want: "reboot", armedBy: armedByInstall, wantLine: "lifecycle reboot"},
		"unknown capabilities only":      {caps: []string{"teleport"}, boot: &fakeBoot{}, bmc: true, want: "cycle", armedBy: armedByInstall},
		"appliance without kexec":        {caps: []string{nodev1.CapabilityKexec}, bmc: true, want: "cycle", armedBy: armedByInstall},
		"kexec turned off":               {caps: []string{nodev1.CapabilityKexec}, boot: &fakeBoot{}, timeout: -1, bmc: true, want: "cycle", armedBy: armedByInstall},
		"no hypervisor image: BMC cycle": {caps: []string{nodev1.CapabilityKexec}, boot: &fakeBoot{err: errors.New("the catalog has no hypervisor image")}, bmc: true, want: "cycle", armedBy: armedByInstall, wantLine: "lifecycle kexec-failed"},
		"no hypervisor image: Reboot":    {caps: []string{nodev1.CapabilityKexec}, boot: &fakeBoot{err: errors.New("the catalog has no hypervisor image")}, want: "reboot", armedBy: armedByInstall, wantLine: "lifecycle kexec-failed"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			o := harnessOpt{kexecTimeout: tc.timeout}
			if tc.boot != nil {
				o.kexec = tc.boot
			}
			h := newHarness(t, nil, o)
			a := h.connect(mac1, facts("S1", "", mac1), tc.caps...)
			if tc.bmc {
				enrollBMC(t, h, a.name)
			}
			if _, err := h.lc.Accept(context.Background(), a.name, "", false); err != nil {
				t.Fatal(err)
			}
			id := a.next().GetInstall().GetInstallId()
			a.progress(id, "done", true, "")
			m := h.eventually(a.name, "armed", func(m *inventoryv1.Machine) bool { return m.GetWatchdog().GetArmedBy() == tc.armedBy })
			if m.GetBootIntent() != inventoryv1.BootIntent_BOOT_INTENT_HYPERVISOR {
				t.Errorf("boot intent %v, want hypervisor (every later boot is the hypervisor's)", m.GetBootIntent())
			}
			switch tc.want {
			case "kexec":
				plan := a.next().GetKexec()
				want, _ := tc.boot.KexecPlan(context.Background(), a.name, mac1, "", "")
				want.InstallId = id
				if diff := cmp.Diff(want, plan, protocmp.Transform()); diff != "" {
					t.Errorf("kexec plan (-want +got):\n%s", diff)
				}
				a.none()
				if n := h.bmcCycles(); n != 0 {
					t.Errorf("%d BMC power cycles with a kexec", n)
				}
			case "cycle":
				h.eventually(a.name, "cycled", func(*inventoryv1.Machine) bool { return h.bmcCycles() == 1 })
				a.none()
			case "reboot":
				if a.next().GetReboot() == nil {
					t.Fatal("no Reboot command")
				}
			}
			if es := h.eventLines(a.name); tc.wantLine != "" && !hasEvent(es, tc.wantLine) {
				t.Errorf("timeline lacks %q: %q", tc.wantLine, es)
			}
		})
	}
}

// kexecing is a harness whose capable agent was sent its KexecPlan.
func kexecing(t *testing.T, bmc bool) (*harness, *agent, string) {
	t.Helper()
	h := newHarness(t, nil, harnessOpt{kexec: &fakeBoot{}})
	a := h.connect(mac1, facts("S1", "", mac1), nodev1.CapabilityKexec)
	if bmc {
		enrollBMC(t, h, a.name)
	}
	if _, err := h.lc.Accept(context.Background(), a.name, "", false); err != nil {
		t.Fatal(err)
	}
	id := a.next().GetInstall().GetInstallId()
	a.progress(id, "done", true, "")
	if a.next().GetKexec().GetInstallId() != id {
		t.Fatal("no kexec plan for the install")
	}
	return h, a, id
}

// TestKexecFallback: the agent's kexec error makes the machine reboot the
// old way at once; so does its node not READY within KexecTimeout (and
// not before); a kexec error of another install, or one after the
// fallback, changes nothing.
func TestKexecFallback(t *testing.T) {
	tests := map[string]struct {
		bmc    bool
		act    func(h *harness, a *agent, id string)
		want   string // "cycle", "reboot"
		event  string
		reason string // in the timeline entry's detail
	}{
		"agent reports a hash mismatch (BMC)": {bmc: true, want: "cycle", event: "kexec-failed", reason: "fetched file does not match the plan",
			act: func(h *harness, a *agent, id string) {
				a.progress(id, "kexec", true, "kexec: fetched file does not match the plan: initrd sha256 x")
			}},
		"agent reports a truncated download (no BMC)": {want: "reboot", event: "kexec-failed", reason: "got 100 bytes, the plan says 20",
			act: func(h *harness, a *agent, id string) {
				a.progress(id, "kexec", true, "kexec: fetched file does not match the plan: initrd: got 100 bytes, the plan says 20")
			}},
		"node not READY in time (BMC)": {bmc: true, want: "cycle", event: "kexec-timeout", reason: "not READY within 2m0s of the kexec",
			act: func(h *harness, a *agent, id string) {
				h.clk.Advance(DefaultKexecTimeout - time.Second)
				h.reconcile()
				if h.machine(a.name).GetWatchdog().GetArmedBy() != ArmedByKexec || h.bmcCycles() != 0 {
					h.t.Fatal("fell back before the kexec timeout")
				}
				h.clk.Advance(2 * time.Second)
				h.reconcile()
			}},
		"node not READY in time (no BMC, agent still there)": {want: "reboot", event: "kexec-timeout", reason: "not READY within",
			act: func(h *harness, a *agent, id string) {
				h.clk.Advance(DefaultKexecTimeout + time.Second)
				h.reconcile()
			}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			h, a, id := kexecing(t, tc.bmc)
			tc.act(h, a, id)
			m := h.eventually(a.name, "re-armed for the old reboot", func(m *inventoryv1.Machine) bool {
				return m.GetWatchdog().GetArmedBy() == armedByInstall
			})
			if m.GetState() != inventoryv1.Machine_INSTALLING || !m.GetInstall().GetDone() {
				t.Errorf("state %v done %v, want INSTALLING and done", m.GetState(), m.GetInstall().GetDone())
			}
			switch tc.want {
			case "cycle":
				h.eventually(a.name, "cycled", func(*inventoryv1.Machine) bool { return h.bmcCycles() == 1 })
			case "reboot":
				if a.next().GetReboot() == nil {
					t.Fatal("no Reboot command")
				}
			}
			ctx := context.Background()
			if err := h.inv.FlushTimeline(ctx); err != nil {
				t.Fatal(err)
			}
			es, _ := h.inv.Timeline(ctx, a.name, "", 0)
			found := false
			for _, e := range es {
				if e.GetSource() == "lifecycle" && e.GetEvent() == tc.event && strings.Contains(e.GetDetail(), tc.reason) && strings.Contains(e.GetDetail(), "rebooting the old way") {
					found = true
				}
			}
			if !found {
				t.Errorf("no %s entry naming %q in the timeline: %q", tc.event, tc.reason, h.eventLines(a.name))
			}
			// Later errors (a repeat, another install's) change nothing.
			a.progress(id, "kexec", true, "again")
			a.progress("other", "kexec", true, "other install")
			h.clk.Advance(DefaultKexecTimeout + time.Second)
			h.reconcile()
			time.Sleep(50 * time.Millisecond)
			if n := h.bmcCycles(); tc.bmc && n != 1 {
				t.Errorf("%d BMC cycles, want 1", n)
			}
			if tc.want == "reboot" {
				a.none()
			}
		})
	}
}

// TestKexecReady: the kexec'd node's READY disarms the watchdog and the
// machine is DEPLOYED; no reboot of any kind follows.
func TestKexecReady(t *testing.T) {
	h, a, _ := kexecing(t, true)
	h.clk.Advance(40 * time.Second)
	h.applyNode(a.name)
	h.reconcile()
	m := h.machine(a.name)
	if m.GetState() != inventoryv1.Machine_DEPLOYED || m.GetWatchdog() != nil {
		t.Fatalf("after the node's READY: %v watchdog %v", m.GetState(), m.GetWatchdog())
	}
	h.clk.Advance(DefaultKexecTimeout)
	h.reconcile()
	if n := h.bmcCycles(); n != 0 {
		t.Errorf("%d BMC cycles after a kexec that worked", n)
	}
	if es := h.eventLines(a.name); !hasEvent(es, "lifecycle kexec") || !hasEvent(es, "lifecycle deployed") || hasEvent(es, "lifecycle kexec-timeout") {
		t.Errorf("timeline %q", es)
	}
}

// TestKexecOnlyToItsAgent: a session that registered without the machine's
// identity gets no kexec plan even when it named the capability.
func TestKexecOnlyToItsAgent(t *testing.T) {
	h := newHarness(t, nil, harnessOpt{kexec: &fakeBoot{}})
	a := h.connect(mac1, facts("S1", "", mac1), nodev1.CapabilityKexec)
	a.close()
	h.eventually(a.name, "disconnected", func(*inventoryv1.Machine) bool { return !h.lc.sess.connected(a.name) })
	st := &stream{ch: make(chan *nodev1.ApplianceMessage, 1), identified: false, kexec: true}
	h.lc.sess.mu.Lock()
	h.lc.sess.streams[a.name] = st
	h.lc.sess.mu.Unlock()
	if h.lc.sess.canKexec(a.name) {
		t.Error("canKexec for an unidentified session")
	}
	err := h.lc.sess.send(a.name, &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Kexec{Kexec: &nodev1.KexecPlan{InstallId: "x"}}})
	if code(err).String() != "PermissionDenied" {
		t.Errorf("send kexec to an unidentified session: %v, want PermissionDenied", err)
	}
}

// TestKexecSurvivesReRegister: the installing agent registering again
// (its session broke while it fetched or loaded the image) leaves the
// kexec's watchdog armed, so a kexec that never comes back still falls
// back to the old reboot.
func TestKexecSurvivesReRegister(t *testing.T) {
	h, a, _ := kexecing(t, true)
	armed := h.machine(a.name).GetWatchdog()
	if _, err := h.client.Register(context.Background(), &nodev1.RegisterRequest{BootMac: mac1, Facts: facts("S1", "", mac1),
		Capabilities: []string{nodev1.CapabilityKexec}}); err != nil {
		t.Fatal(err)
	}
	if w := h.machine(a.name).GetWatchdog(); w.GetArmedBy() != ArmedByKexec || !w.GetArmedAt().AsTime().Equal(armed.GetArmedAt().AsTime()) {
		t.Fatalf("watchdog after a second Register: %v, want the kexec's %v", w, armed)
	}
	h.clk.Advance(DefaultKexecTimeout + time.Second)
	h.reconcile()
	h.eventually(a.name, "cycled", func(*inventoryv1.Machine) bool { return h.bmcCycles() == 1 })
}

// TestKexecAhead: an agent that named kexec-prefetch (and kexec) gets its
// KexecPlan right behind the install plan, and the same plan again after
// the done (its go-ahead, with the watchdog armed by the kexec); an agent
// without it, an appliance with kexec turned off, or no hypervisor image
// sends nothing ahead.
func TestKexecAhead(t *testing.T) {
	tests := map[string]struct {
		caps    []string
		boot    *fakeBoot
		timeout time.Duration
		off     bool // Config.KexecAhead not set
		ahead   bool
	}{
		"kexec-prefetch":            {caps: []string{nodev1.CapabilityKexec, nodev1.CapabilityKexecPrefetch}, boot: &fakeBoot{}, ahead: true},
		"kexec only":                {caps: []string{nodev1.CapabilityKexec}, boot: &fakeBoot{}},
		"kexec-prefetch, no kexec":  {caps: []string{nodev1.CapabilityKexecPrefetch}, boot: &fakeBoot{}},
		"kexec turned off":          {caps: []string{nodev1.CapabilityKexec, nodev1.CapabilityKexecPrefetch}, boot: &fakeBoot{}, timeout: -1},
		"no hypervisor image":       {caps: []string{nodev1.CapabilityKexec, nodev1.CapabilityKexecPrefetch}, boot: &fakeBoot{err: errors.New("the catalog has no hypervisor image")}},
		"appliance without kexec":   {caps: []string{nodev1.CapabilityKexec, nodev1.CapabilityKexecPrefetch}},
		"kexec ahead off (default)": {caps: []string{nodev1.CapabilityKexec, nodev1.CapabilityKexecPrefetch}, boot: &fakeBoot{}, off: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			o := harnessOpt{kexecTimeout: tc.timeout, kexecAhead: !tc.off}
			if tc.boot != nil {
				o.kexec = tc.boot
			}
			h := newHarness(t, nil, o)
			a := h.connect(mac1, facts("S1", "", mac1), tc.caps...)
			enrollBMC(t, h, a.name)
			if _, err := h.lc.Accept(context.Background(), a.name, "", false); err != nil {
				t.Fatal(err)
			}
			id := a.next().GetInstall().GetInstallId()
			if !tc.ahead {
				a.none()
				return
			}
			want, _ := tc.boot.KexecPlan(context.Background(), a.name, mac1, "", "")
			want.InstallId = id
			if diff := cmp.Diff(want, a.next().GetKexec(), protocmp.Transform()); diff != "" {
				t.Fatalf("kexec plan ahead of the install (-want +got):\n%s", diff)
			}
			a.none()
			a.progress(id, "done", true, "")
			h.eventually(a.name, "armed", func(m *inventoryv1.Machine) bool { return m.GetWatchdog().GetArmedBy() == ArmedByKexec })
			if diff := cmp.Diff(want, a.next().GetKexec(), protocmp.Transform()); diff != "" {
				t.Errorf("kexec plan after the done (-want +got):\n%s", diff)
			}
			a.none()
			if n := h.bmcCycles(); n != 0 {
				t.Errorf("%d BMC power cycles with a kexec", n)
			}
		})
	}
}
