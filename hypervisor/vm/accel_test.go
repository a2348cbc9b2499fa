package vm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corralhq/corral/testsupport/require"
)

func TestAccelProbe(t *testing.T) {
	var calls atomic.Int32
	release := make(chan struct{})
	p := NewAccelProbe(func(ctx context.Context) (Accel, string) {
		calls.Add(1)
		<-release
		return TCG, "probe guest hung"
	})
	if _, _, ok := p.Result(); ok {
		t.Fatal("decided before it started")
	}
	// Waiters before the answer start the decision once and all wait.
	var wg sync.WaitGroup
	got := make([]Accel, 4)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, _, err := p.Wait(context.Background())
			if err != nil {
				t.Errorf("Wait = %v", err)
			}
			got[i] = a
		}()
	}
	p.Start(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, _, err := p.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait with an expiring ctx = %v, want DeadlineExceeded", err)
	}
	close(release)
	wg.Wait()
	for i, a := range got {
		if a != TCG {
			t.Errorf("waiter %d got %q, want tcg", i, a)
		}
	}
	if a, why, ok := p.Result(); !ok || a != TCG || why != "probe guest hung" {
		t.Errorf("Result = %q %q %v", a, why, ok)
	}
	p.Close()
	if n := calls.Load(); n != 1 {
		t.Errorf("decide ran %d times, want 1", n)
	}
}

func TestAccelProbeClosedBeforeStart(t *testing.T) {
	p := NewAccelProbe(func(context.Context) (Accel, string) {
		t.Error("decide ran after Close")
		return KVM, ""
	})
	p.Close()
	if _, _, err := p.Wait(context.Background()); !errors.Is(err, ErrProbeClosed) {
		t.Errorf("Wait after Close = %v, want ErrProbeClosed", err)
	}
}

// TestManagerWaitsForAccelProbe: with Config.AccelProbe, New neither
// probes nor waits; a VM start waits for the answer and starts QEMU with
// it. The QEMU here is a script that records its arguments and fails.
func TestManagerWaitsForAccelProbe(t *testing.T) {
	dir := t.TempDir()
	argsFile := filepath.Join(dir, "args")
	qemu := filepath.Join(dir, "qemu")
	if err := os.WriteFile(qemu, []byte("#!/bin/sh\necho \"$@\" >"+argsFile+"\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var started atomic.Bool
	answer := make(chan struct{})
	p := NewAccelProbe(func(context.Context) (Accel, string) {
		started.Store(true)
		<-answer
		return KVM, "probe guest ran under KVM"
	})
	defer p.Close()
	m, err := New(context.Background(), Config{Dir: filepath.Join(dir, "vms"), QEMU: qemu, AccelProbe: p})
	if err != nil {
		t.Fatal(err)
	}
	if started.Load() {
		t.Error("New started the probe")
	}
	if a := m.Accel(); a != "" {
		t.Errorf("Accel before the answer = %q, want empty", a)
	}
	spec := Spec{Name: "vm1", VCPUs: 1, MemoryBytes: 64 << 20}
	// Bounded: a start whose deadline passes first fails and leaves nothing.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := m.Boot(ctx, spec); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Boot before the answer = %v, want DeadlineExceeded", err)
	}
	if !started.Load() {
		t.Error("a waiting VM start did not start the probe")
	}
	if _, err := os.Stat(filepath.Join(dir, "vms", "vm1")); !os.IsNotExist(err) {
		t.Errorf("vm directory left by a start that waited: %v", err)
	}
	close(answer)
	_, err = m.Boot(context.Background(), spec)
	if err == nil || !strings.Contains(err.Error(), "qemu failed to start") {
		t.Fatalf("Boot = %v, want the fake QEMU's failure", err)
	}
	b, err := os.ReadFile(argsFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "-accel kvm ") {
		t.Errorf("QEMU ran without the probe's answer (kvm): %s", b)
	}
	if a := m.Accel(); a != KVM {
		t.Errorf("Accel = %q, want kvm", a)
	}
}

// TestProbeGuestsExit: each architecture's probe guest really runs and
// ends QEMU with the status DetectAccel waits for. This host may have no
// KVM, so the guests run under TCG here; DetectAccel boots the same
// images under KVM (arm64 with -cpu host and the host's GIC).
func TestProbeGuestsExit(t *testing.T) {
	for goarch, qemu := range map[string]string{"amd64": "qemu-system-x86_64", "arm64": "qemu-system-aarch64"} {
		t.Run(goarch, func(t *testing.T) {
			require.Tool(t, qemu)
			if err := runProbe(context.Background(), goarch, TCG, qemu, nil, t.TempDir()); err != nil {
				t.Fatal(err)
			}
		})
	}
	if _, args, _ := probeGuest("arm64", KVM, "p.img"); !strings.Contains(strings.Join(args, " "), "-machine virt,gic-version=host -cpu host") {
		t.Errorf("arm64 probe under KVM: %q, want the host's CPU and GIC", args)
	}
}
