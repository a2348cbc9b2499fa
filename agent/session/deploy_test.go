package session

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	nodev1 "github.com/corralhq/corral/api/node/v1"
)

// fakeDeployer reports layout, image and written, or fails at image
// with err.
type fakeDeployer struct {
	err error

	mu    sync.Mutex
	plans []string
}

func (f *fakeDeployer) Deploy(_ context.Context, plan *nodev1.DeployPlan, progress func(*nodev1.Progress)) error {
	f.mu.Lock()
	f.plans = append(f.plans, plan.GetDeploymentId())
	f.mu.Unlock()
	id := plan.GetDeploymentId()
	progress(&nodev1.Progress{Step: "layout", Detail: "image onto /dev/vda", InstallId: id})
	if f.err != nil {
		progress(&nodev1.Progress{Step: "image", Done: true, Error: f.err.Error(), InstallId: id})
		return f.err
	}
	progress(&nodev1.Progress{Step: "image", Detail: "24 MiB of 24 MiB written", InstallId: id})
	progress(&nodev1.Progress{Step: "written", Done: true, InstallId: id})
	return nil
}

type fakeEraser struct{}

func (fakeEraser) Erase(_ context.Context, plan *nodev1.ErasePlan, progress func(*nodev1.Progress)) error {
	progress(&nodev1.Progress{Step: "erase", Detail: "/dev/vda: zeroed", InstallId: plan.GetEraseId()})
	progress(&nodev1.Progress{Step: "erased", Done: true, InstallId: plan.GetEraseId()})
	return nil
}

func deployCmd(id string, reboot bool) *nodev1.ApplianceMessage {
	return &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Deploy{Deploy: &nodev1.DeployPlan{DeploymentId: id, ImageSha256: "ab12", ImageSize: 24 << 20, Reboot: reboot}}}
}

func eraseCmd(id string) *nodev1.ApplianceMessage {
	return &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Erase{Erase: &nodev1.ErasePlan{EraseId: id, Disks: []string{"/dev/vda"}}}}
}

// rebootWatcher is a Power that records, at the reboot, what the
// appliance had received of a deployment.
type rebootWatcher struct {
	f  *fakeAppliance
	id string

	mu       sync.Mutex
	rebooted int
	seen     []string // the appliance's progress of id at the reboot
}

func (p *rebootWatcher) PowerOff() error { return errors.New("not expected") }
func (p *rebootWatcher) Reboot() error {
	seen := p.f.progressOf(p.id)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rebooted++
	p.seen = seen
	return nil
}

func (p *rebootWatcher) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rebooted
}

// TestDeployPlan: a deploy plan runs as a job; its progress reaches the
// appliance with the deployment id; the machine reboots only after
// "written" went out, and only when the plan says reboot.
func TestDeployPlan(t *testing.T) {
	tests := map[string]struct {
		reboot bool
		err    error
		want   []string
		boots  int
	}{
		"reboot":    {reboot: true, want: []string{"layout", "image", "written (done)"}, boots: 1},
		"no reboot": {want: []string{"layout", "image", "written (done)"}},
		"failed": {reboot: true, err: errors.New("extent hash mismatch"),
			want: []string{"layout", "image error: extent hash mismatch (done)"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := &fakeAppliance{cmds: []*nodev1.ApplianceMessage{deployCmd("dep-1", tc.reboot)}}
			endpoint, ca := serve(t, f, true)
			console := &syncBuffer{}
			power := &rebootWatcher{f: f, id: "dep-1"}
			cfg := config(endpoint, Fingerprint(ca), console, power)
			dep := &fakeDeployer{err: tc.err}
			cfg.Deployer = dep
			cfg.DeployRebootDelay = 200 * time.Millisecond
			cfg.DeployRebootGrace = 10 * time.Second
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- Run(ctx, cfg) }()
			waitFor(t, "the deploy's last progress", func() bool { return len(f.progressOf("dep-1")) == len(tc.want) })
			if tc.boots > 0 {
				waitFor(t, "the reboot", func() bool { return power.count() == tc.boots })
			} else {
				time.Sleep(400 * time.Millisecond) // past DeployRebootDelay
			}
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run = %v", err)
			}
			if got := f.progressOf("dep-1"); strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Errorf("progress %q, want %q", got, tc.want)
			}
			power.mu.Lock()
			defer power.mu.Unlock()
			if power.rebooted != tc.boots {
				t.Errorf("rebooted %d times, want %d", power.rebooted, tc.boots)
			}
			if tc.boots > 0 && strings.Join(power.seen, "|") != strings.Join(tc.want, "|") {
				t.Errorf("at the reboot the appliance had %q, want %q", power.seen, tc.want)
			}
			if !strings.Contains(console.String(), "appliance sent deploy plan dep-1: image ab12") {
				t.Errorf("console:\n%s", console)
			}
			if tc.boots > 0 && !strings.Contains(console.String(), "deploy dep-1 written; rebooting into the disk") {
				t.Errorf("console:\n%s", console)
			}
		})
	}
}

// TestDeployAndEraseUnsupported: without a Deployer or an Eraser the
// plans are answered as unsupported; with an Eraser, an erase plan runs.
func TestDeployAndEraseUnsupported(t *testing.T) {
	f := &fakeAppliance{cmds: []*nodev1.ApplianceMessage{deployCmd("dep-1", true), eraseCmd("er-1")}}
	endpoint, ca := serve(t, f, true)
	power := &fakePower{}
	cfg := config(endpoint, Fingerprint(ca), &syncBuffer{}, power)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go Run(ctx, cfg)
	waitFor(t, "both refusals", func() bool { return len(f.progressOf("dep-1")) == 1 && len(f.progressOf("er-1")) == 1 })
	if got := f.progressOf("dep-1")[0]; got != "deploy error: not supported by this agent yet (done)" {
		t.Errorf("deploy: %q", got)
	}
	if got := f.progressOf("er-1")[0]; got != "erase error: not supported by this agent yet (done)" {
		t.Errorf("erase: %q", got)
	}

	g := &fakeAppliance{cmds: []*nodev1.ApplianceMessage{eraseCmd("er-2")}}
	endpoint, ca = serve(t, g, true)
	cfg = config(endpoint, Fingerprint(ca), &syncBuffer{}, power)
	cfg.Eraser = fakeEraser{}
	go Run(ctx, cfg)
	waitFor(t, "the erase", func() bool { return len(g.progressOf("er-2")) == 2 })
	if got := g.progressOf("er-2"); strings.Join(got, "|") != "erase|erased (done)" {
		t.Errorf("erase progress %q", got)
	}
}

// TestDeployRebootWithoutSession: when no session carries "written", the
// machine reboots after the grace all the same; "written" stays queued
// for the next session.
func TestDeployRebootWithoutSession(t *testing.T) {
	console := &syncBuffer{}
	power := &fakePower{}
	j := &jobs{cfg: &Config{Console: console, Logger: slog.New(slog.DiscardHandler), Power: power,
		DeployRebootGrace: 50 * time.Millisecond, DeployRebootDelay: time.Hour}}
	written := &nodev1.Progress{Step: "written", Done: true, InstallId: "dep-1"}
	j.await(written)
	j.progress(written)
	start := time.Now()
	j.rebootAfterDeploy(context.Background(), "dep-1", written)
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Errorf("rebooted after %v, before the grace", d)
	}
	if power.rebooted != 1 || len(j.pending) != 1 || j.pending[0] != written {
		t.Errorf("rebooted %d, pending %v", power.rebooted, j.pending)
	}
	if !strings.Contains(console.String(), "no session carried it within 50ms: rebooting into the disk anyway") {
		t.Errorf("console:\n%s", console)
	}

	// Sent on a session: the reboot follows the delay, not the grace.
	j.cfg.DeployRebootGrace, j.cfg.DeployRebootDelay = time.Hour, time.Millisecond
	out := make(chan *nodev1.AgentMessage, 4)
	j.await(written)
	j.attach(out, make(chan struct{}))
	go func() { j.sent(<-out) }()
	j.rebootAfterDeploy(context.Background(), "dep-1", written)
	if power.rebooted != 2 {
		t.Errorf("rebooted %d times", power.rebooted)
	}
}
