package session

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	nodev1 "github.com/corralhq/corral/api/node/v1"
)

// fakeInstaller reports "disk", then blocks until release is closed, then
// reports "done".
type fakeInstaller struct {
	release chan struct{}

	mu       sync.Mutex
	installs []string // install_ids, in call order
	wipes    []string
}

func (f *fakeInstaller) Install(ctx context.Context, plan *nodev1.InstallPlan, progress func(*nodev1.Progress)) error {
	f.mu.Lock()
	f.installs = append(f.installs, plan.GetInstallId())
	f.mu.Unlock()
	progress(&nodev1.Progress{Step: "disk", Detail: "/dev/vdb (1 GiB)", InstallId: plan.GetInstallId()})
	select {
	case <-f.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	progress(&nodev1.Progress{Step: "done", Done: true, InstallId: plan.GetInstallId()})
	return nil
}

func (f *fakeInstaller) Wipe(_ context.Context, plan *nodev1.WipePlan, progress func(*nodev1.Progress)) error {
	f.mu.Lock()
	f.wipes = append(f.wipes, plan.GetDisk())
	f.mu.Unlock()
	progress(&nodev1.Progress{Step: "wipe", Detail: "wiped " + plan.GetDisk(), Done: true, InstallId: plan.GetInstallId()})
	return nil
}

func installCmd(id string) *nodev1.ApplianceMessage {
	return &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Install{Install: &nodev1.InstallPlan{Disk: "auto", Hostname: "node-1", InstallId: id}}}
}

// progressOf returns the steps (error-marked) the appliance received for id.
func (f *fakeAppliance) progressOf(id string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, p := range f.progress {
		if p.GetInstallId() != id {
			continue
		}
		s := p.GetStep()
		if p.GetError() != "" {
			s += " error: " + p.GetError()
		}
		if p.GetDone() {
			s += " (done)"
		}
		out = append(out, s)
	}
	return out
}

func TestInstallRunsWhileHeartbeating(t *testing.T) {
	wipe := &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Wipe{Wipe: &nodev1.WipePlan{Disk: "/dev/vdb", InstallId: "w-1"}}}
	// A, then B while A runs (refused), then A again (the appliance
	// restarted and resent it: ignored), then a wipe while A runs.
	f := &fakeAppliance{cmds: []*nodev1.ApplianceMessage{installCmd("A"), installCmd("B"), installCmd("A"), wipe}}
	endpoint, ca := serve(t, f, true)
	console := &syncBuffer{}
	inst := &fakeInstaller{release: make(chan struct{})}
	power := &fakePower{}
	cfg := config(endpoint, Fingerprint(ca), console, power)
	cfg.Installer = inst
	cfg.InstallReboot = 50 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()

	waitFor(t, "A's disk step and B's and the wipe's refusal", func() bool {
		return len(f.progressOf("A")) == 1 && len(f.progressOf("B")) == 1 && len(f.progressOf("w-1")) == 1
	})
	f.mu.Lock()
	beats := f.heartbeats
	f.mu.Unlock()
	waitFor(t, "heartbeats while the install runs", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.heartbeats >= beats+3
	})
	close(inst.release)
	waitFor(t, "A done", func() bool { return len(f.progressOf("A")) == 2 })
	waitFor(t, "the reboot after the install", func() bool {
		power.mu.Lock()
		defer power.mu.Unlock()
		return power.rebooted == 1
	})

	for id, want := range map[string][]string{
		"A":   {"disk", "done (done)"},
		"B":   {"install error: busy: install plan A is still running (done)"},
		"w-1": {"wipe error: busy: install plan A is still running (done)"},
	} {
		if got := f.progressOf(id); strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("progress of %s = %q, want %q", id, got, want)
		}
	}
	inst.mu.Lock()
	if strings.Join(inst.installs, ",") != "A" || len(inst.wipes) != 0 {
		t.Errorf("installer calls: installs %v, wipes %v; want one install of A", inst.installs, inst.wipes)
	}
	inst.mu.Unlock()
	for _, want := range []string{
		"install plan A: node node-1, disk auto",
		"install A: disk: /dev/vdb (1 GiB)",
		"refused install plan B: busy",
		"install plan A is already running",
		"install A done; rebooting into the hypervisor in 50ms",
	} {
		if !strings.Contains(console.String(), want) {
			t.Errorf("console lacks %q:\n%s", want, console)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v", err)
	}
}

func TestWipePlan(t *testing.T) {
	wipe := &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Wipe{Wipe: &nodev1.WipePlan{Disk: "/dev/vdb", InstallId: "w-1"}}}
	f := &fakeAppliance{cmds: []*nodev1.ApplianceMessage{wipe}}
	endpoint, ca := serve(t, f, true)
	inst := &fakeInstaller{release: make(chan struct{})}
	power := &fakePower{}
	cfg := config(endpoint, Fingerprint(ca), &syncBuffer{}, power)
	cfg.Installer = inst
	cfg.InstallReboot = time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go Run(ctx, cfg)
	waitFor(t, "the wipe", func() bool { return len(f.progressOf("w-1")) == 1 })
	if got := f.progressOf("w-1"); got[0] != "wipe (done)" {
		t.Errorf("wipe progress = %q", got)
	}
	inst.mu.Lock()
	defer inst.mu.Unlock()
	if len(inst.wipes) != 1 || inst.wipes[0] != "/dev/vdb" {
		t.Errorf("wipes = %v", inst.wipes)
	}
	power.mu.Lock()
	defer power.mu.Unlock()
	if power.rebooted != 0 {
		t.Error("a wipe rebooted the machine")
	}
}

// TestProgressKeptAcrossSessions: progress produced while no session is
// open is delivered on the next one.
func TestProgressKeptAcrossSessions(t *testing.T) {
	j := &jobs{cfg: &Config{Console: &syncBuffer{}}}
	j.progress(&nodev1.Progress{Step: "disk", InstallId: "A"})
	done := make(chan struct{})
	out := make(chan *nodev1.AgentMessage, 4)
	j.attach(out, done)
	j.progress(&nodev1.Progress{Step: "done", Done: true, InstallId: "A"})
	close(done)
	j.detach()
	j.progress(&nodev1.Progress{Step: "late", InstallId: "A"})
	var got []string
	for len(out) > 0 {
		got = append(got, (<-out).GetProgress().GetStep())
	}
	if strings.Join(got, ",") != "disk,done" || len(j.pending) != 1 || j.pending[0].GetStep() != "late" {
		t.Errorf("sent %v, pending %v", got, j.pending)
	}
}
