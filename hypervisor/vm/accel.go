package vm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/corralhq/corral/internal/apierr"
)

// probeBootSector is a BIOS boot sector that writes 0x31 to the
// isa-debug-exit port: QEMU then exits with status (0x31<<1)|1 = 99.
func probeBootSector() []byte {
	b := make([]byte, 512)
	copy(b, []byte{0xb0, 0x31, 0xe6, 0xf4, 0xf4, 0xeb, 0xfd}) // mov al,0x31; out 0xf4,al; hlt; jmp $
	b[510], b[511] = 0x55, 0xaa
	return b
}

// probeARM64 is an arm64 guest that asks PSCI to switch the machine off
// (SYSTEM_OFF over HVC, virt's conduit without EL2/EL3): QEMU then exits
// with status 0. It is loaded 1 MiB into RAM (QEMU puts the device tree
// at RAM's start).
func probeARM64() []byte {
	var b []byte
	for _, w := range []uint32{
		0xd2800100, // movz x0, #0x0008
		0xf2b08000, // movk x0, #0x8400, lsl #16: PSCI SYSTEM_OFF, 0x84000008
		0xd4000002, // hvc #0
		0x14000000, // b .
	} {
		b = binary.LittleEndian.AppendUint32(b, w)
	}
	return b
}

// probeGuest is the probe guest of a node of architecture goarch under
// accel: its image, the QEMU arguments that boot it from img, and the
// exit status QEMU ends with once the guest has run.
func probeGuest(goarch string, accel Accel, img string) (image []byte, args []string, exit int) {
	if goarch == "arm64" {
		machine, cpu := "virt", "max"
		if accel == KVM {
			machine, cpu = "virt,gic-version=host", "host"
		}
		return probeARM64(), []string{"-machine", machine, "-cpu", cpu, "-m", "16",
			"-device", "loader,file=" + optEscape(img) + ",addr=0x40100000,cpu-num=0"}, 0
	}
	return probeBootSector(), []string{"-machine", "pc", "-m", "16",
		"-device", "isa-debug-exit,iobase=0xf4,iosize=0x04",
		"-drive", "file=" + optEscape(img) + ",format=raw,if=floppy", "-boot", "a"}, 99
}

// DetectAccel decides between KVM and TCG for a node of this
// architecture (runtime.GOARCH). /dev/kvm existing is not enough (nested
// or broken KVM hangs guests), so it boots a tiny guest under KVM (on
// amd64 a boot sector, on arm64 a few instructions on virt) and accepts
// KVM only if that guest ends QEMU within a few seconds. It returns the
// accelerator and the reason for it. tmpDir holds the probe image, which
// is removed afterwards.
func DetectAccel(ctx context.Context, qemu string, wrapper []string, tmpDir string) (Accel, string) {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return TCG, fmt.Sprintf("/dev/kvm not usable: %v", err)
	}
	f.Close()
	if err := runProbe(ctx, runtime.GOARCH, KVM, qemu, wrapper, tmpDir); err != nil {
		return TCG, err.Error()
	}
	return KVM, "probe guest ran under KVM"
}

// runProbe boots goarch's probe guest under accel and says why it did
// not end QEMU as designed within 3 s.
func runProbe(ctx context.Context, goarch string, accel Accel, qemu string, wrapper []string, tmpDir string) error {
	img := filepath.Join(tmpDir, ".accel-probe.img")
	image, guest, want := probeGuest(goarch, accel, img)
	if err := os.WriteFile(img, image, 0o600); err != nil {
		return fmt.Errorf("cannot write probe image: %v", err)
	}
	defer os.Remove(img)
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	args := append(append(append([]string{}, wrapper...), qemu,
		"-accel", string(accel), "-nodefaults", "-no-user-config", "-display", "none"), guest...)
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	out, err := cmd.CombinedOutput()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	}
	switch {
	case ctx.Err() != nil && accel == KVM:
		return errors.New("probe guest hung under KVM (nested or broken KVM)")
	case ctx.Err() != nil:
		return fmt.Errorf("probe guest hung under %s", accel)
	case (err == nil || ee != nil) && code == want:
		return nil
	default:
		return fmt.Errorf("probe guest failed under %s: %v %s", accel, err, firstLine(out))
	}
}

func firstLine(b []byte) string {
	for i, c := range b {
		if c == '\n' {
			return string(b[:i])
		}
	}
	return string(b)
}

// CheckAccel refuses an accelerator setting other than auto, kvm or tcg
// ("" is auto).
func CheckAccel(s string) error {
	switch s {
	case "", "auto", string(KVM), string(TCG):
		return nil
	}
	return apierr.Invalidf("vm: accel %q: want auto, kvm or tcg", s)
}

// AccelProbe decides the accelerator once, in the background, so a node
// can serve and register before the answer: the hypervisor boot loads the
// kvm modules and runs DetectAccel only after the node has registered
// (under emulation the two take seconds). A VM start waits for the answer
// (Manager with Config.AccelProbe), starting the decision if nothing has.
// Use NewAccelProbe; methods are safe for concurrent use.
type AccelProbe struct {
	decide func(ctx context.Context) (Accel, string)
	once   sync.Once
	done   chan struct{}
	accel  Accel
	why    string
}

// NewAccelProbe returns a probe that decides with decide (e.g. load the
// kvm modules, then DetectAccel) when first started; decide must return
// in bounded time.
func NewAccelProbe(decide func(ctx context.Context) (Accel, string)) *AccelProbe {
	return &AccelProbe{decide: decide, done: make(chan struct{})}
}

// Start begins the decision in the background unless it has begun; it
// does not block. The decision runs with ctx's values but is not
// cancelled with it.
func (p *AccelProbe) Start(ctx context.Context) {
	p.once.Do(func() {
		go func() {
			defer close(p.done)
			p.accel, p.why = p.decide(context.WithoutCancel(ctx))
		}()
	})
}

// ErrProbeClosed means the AccelProbe was closed before it decided.
var ErrProbeClosed = errors.New("accelerator probe closed before deciding")

// Wait starts the decision if need be and blocks until it is made (the
// accelerator and why), or returns ctx's error (ErrProbeClosed after
// Close).
func (p *AccelProbe) Wait(ctx context.Context) (Accel, string, error) {
	p.Start(ctx)
	select {
	case <-p.done:
		if p.accel == "" {
			return "", "", ErrProbeClosed
		}
		return p.accel, p.why, nil
	case <-ctx.Done():
		return "", "", ctx.Err()
	}
}

// Result returns the decision without waiting; ok is false while it is
// not made.
func (p *AccelProbe) Result() (a Accel, why string, ok bool) {
	select {
	case <-p.done:
		return p.accel, p.why, true
	default:
		return "", "", false
	}
}

// Done is closed once the decision is made.
func (p *AccelProbe) Done() <-chan struct{} { return p.done }

// Close waits for a decision under way; one not begun never begins (Wait
// then returns ErrProbeClosed). The owner calls it when it stops.
func (p *AccelProbe) Close() {
	p.once.Do(func() { close(p.done) })
	<-p.done
}
