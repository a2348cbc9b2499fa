package session

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	nodev1 "github.com/corralhq/corral/api/node/v1"
)

// fakeKexec records the plans it was given and answers err.
type fakeKexec struct {
	err error

	mu    sync.Mutex
	plans []string // install ids
}

func (f *fakeKexec) Kexec(_ context.Context, plan *nodev1.KexecPlan) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.plans = append(f.plans, plan.GetInstallId())
	return f.err
}

func (f *fakeKexec) called() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.plans...)
}

func kexecCmd(id string) *nodev1.ApplianceMessage {
	return &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Kexec{Kexec: &nodev1.KexecPlan{InstallId: id}}}
}

func TestKexecCapability(t *testing.T) {
	tests := map[string]struct {
		kexec  Kexec
		reboot time.Duration
		want   []string
	}{
		"with a Kexec":                            {kexec: &fakeKexec{}, want: []string{nodev1.CapabilityKexec}},
		"without (an old agent: the old reboot)":  {},
		"rebooting by itself after every install": {kexec: &fakeKexec{}, reboot: time.Minute},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := &fakeAppliance{}
			endpoint, ca := serve(t, f, true)
			cfg := config(endpoint, Fingerprint(ca), &syncBuffer{}, &fakePower{})
			cfg.Kexec, cfg.InstallReboot = tc.kexec, tc.reboot
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- Run(ctx, cfg) }()
			waitFor(t, "a registration", func() bool { f.mu.Lock(); defer f.mu.Unlock(); return len(f.registers) > 0 })
			cancel()
			<-done
			f.mu.Lock()
			defer f.mu.Unlock()
			if diff := cmp.Diff(tc.want, f.registers[0].GetCapabilities()); diff != "" {
				t.Errorf("capabilities (-want +got):\n%s", diff)
			}
		})
	}
}

// TestKexecAfterInstall: the appliance's kexec plan for install A (sent at
// once here, before A is done) waits for A to return and runs only then;
// one for B, an install that never ran here, is refused; a Kexec that
// fails is reported on the session so the appliance reboots the old way.
func TestKexecAfterInstall(t *testing.T) {
	tests := map[string]struct {
		err  error
		want []string // progress of A
	}{
		"kexec boots": {want: []string{"disk", "done (done)"}},
		"kexec fails": {err: errors.New("kexec: fetched file does not match the plan: kernel sha256 x"), want: []string{"disk", "done (done)", "kexec error: kexec: fetched file does not match the plan: kernel sha256 x (done)"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := &fakeAppliance{cmds: []*nodev1.ApplianceMessage{installCmd("A"), kexecCmd("A"), kexecCmd("B")}}
			endpoint, ca := serve(t, f, true)
			console := &syncBuffer{}
			inst := &fakeInstaller{release: make(chan struct{})}
			k := &fakeKexec{err: tc.err}
			cfg := config(endpoint, Fingerprint(ca), console, &fakePower{})
			cfg.Installer, cfg.Kexec = inst, k
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- Run(ctx, cfg) }()
			defer func() { cancel(); <-done }()

			waitFor(t, "B's kexec refused", func() bool { return len(f.progressOf("B")) == 1 })
			if got := k.called(); len(got) != 0 {
				t.Fatalf("Kexec ran before install A returned: %v", got)
			}
			close(inst.release)
			waitFor(t, "A's kexec", func() bool { return len(k.called()) == 1 })
			waitFor(t, "A's progress", func() bool { return len(f.progressOf("A")) == len(tc.want) })
			if diff := cmp.Diff(tc.want, f.progressOf("A")); diff != "" {
				t.Errorf("progress of A (-want +got):\n%s", diff)
			}
			if got := f.progressOf("B"); len(got) != 1 || !strings.HasPrefix(got[0], "kexec error: ") || !strings.HasSuffix(got[0], "(done)") {
				t.Errorf("progress of B = %q, want one kexec error", got)
			}
			if diff := cmp.Diff([]string{"A"}, k.called()); diff != "" {
				t.Errorf("Kexec calls (-want +got):\n%s", diff)
			}
			if !strings.Contains(console.String(), "booting the hypervisor image with kexec") {
				t.Errorf("console lacks the kexec line:\n%s", console)
			}
		})
	}
}
