package session

import (
	"context"
	"errors"
	"slices"
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

// fakePrefetcher is a KexecPrefetcher: it records what it was asked;
// its Kexec blocks until ctx ends (a kexec that works does not return).
type fakePrefetcher struct {
	mu                        sync.Mutex
	prefetches, kexecs, drops []string // install ids
}

func (f *fakePrefetcher) Kexec(ctx context.Context, plan *nodev1.KexecPlan) error {
	f.mu.Lock()
	f.kexecs = append(f.kexecs, plan.GetInstallId())
	f.mu.Unlock()
	<-ctx.Done()
	return ctx.Err()
}

func (f *fakePrefetcher) Prefetch(_ context.Context, plan *nodev1.KexecPlan) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.prefetches = append(f.prefetches, plan.GetInstallId())
	return nil
}

func (f *fakePrefetcher) Discard(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.drops = append(f.drops, id)
}

func (f *fakePrefetcher) calls() (prefetches, kexecs, drops []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.prefetches), slices.Clone(f.kexecs), slices.Clone(f.drops)
}

// TestKexecPrefetch: an agent with a KexecPrefetcher names both
// capabilities; the KexecPlan sent right behind the install plan is
// prefetched while the install runs and reboots nothing; the plan sent
// after the install's done (twice here: a resend) reboots once, with no
// error reported; an install that fails discards the prefetch and never
// kexecs.
func TestKexecPrefetch(t *testing.T) {
	tests := map[string]struct {
		installErr error
		kexecs     []string
		drops      []string
		progress   []string
	}{
		"install done: the plan after it reboots": {kexecs: []string{"A"}, progress: []string{"disk", "done (done)"}},
		"install failed: discarded": {installErr: errors.New("no disk"), drops: []string{"A"},
			progress: []string{"disk", "identity error: no disk (done)"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := &fakeAppliance{cmds: []*nodev1.ApplianceMessage{installCmd("A"), kexecCmd("A")}}
			f.onProgress = func(p *nodev1.Progress) []*nodev1.ApplianceMessage {
				if p.GetDone() && p.GetError() == "" {
					return []*nodev1.ApplianceMessage{kexecCmd(p.GetInstallId()), kexecCmd(p.GetInstallId())}
				}
				return nil
			}
			endpoint, ca := serve(t, f, true)
			console := &syncBuffer{}
			inst := &fakeInstaller{release: make(chan struct{}), err: tc.installErr}
			k := &fakePrefetcher{}
			cfg := config(endpoint, Fingerprint(ca), console, &fakePower{})
			cfg.Installer, cfg.Kexec = inst, k
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- Run(ctx, cfg) }()
			defer func() { cancel(); <-done }()

			waitFor(t, "the prefetch", func() bool { p, _, _ := k.calls(); return len(p) == 1 })
			if _, kx, _ := k.calls(); len(kx) != 0 {
				t.Fatalf("Kexec ran while the install ran: %v", kx)
			}
			close(inst.release)
			waitFor(t, "A's progress", func() bool { return len(f.progressOf("A")) >= len(tc.progress) })
			if tc.kexecs != nil {
				waitFor(t, "the kexec", func() bool { _, kx, _ := k.calls(); return len(kx) > 0 })
			} else {
				waitFor(t, "the discard", func() bool { _, _, d := k.calls(); return len(d) > 0 })
			}
			time.Sleep(100 * time.Millisecond) // a second Kexec, or an error progress, would come now
			p, kx, d := k.calls()
			if diff := cmp.Diff([]string{"A"}, p); diff != "" {
				t.Errorf("prefetches (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.kexecs, kx); diff != "" {
				t.Errorf("kexecs (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.drops, d); diff != "" {
				t.Errorf("discards (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.progress, f.progressOf("A")); diff != "" {
				t.Errorf("progress of A (-want +got):\n%s\nconsole:\n%s", diff, console)
			}
			f.mu.Lock()
			caps := f.registers[0].GetCapabilities()
			f.mu.Unlock()
			if diff := cmp.Diff([]string{nodev1.CapabilityKexec, nodev1.CapabilityKexecPrefetch}, caps); diff != "" {
				t.Errorf("capabilities (-want +got):\n%s", diff)
			}
		})
	}
}
