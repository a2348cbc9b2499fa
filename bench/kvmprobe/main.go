// Command kvmprobe answers what KVM does inside a lab machine (QEMU TCG
// with -cpu max: the hypervisor image's kvm_amd on emulated SVM), for
// the hypervisor boot's KVM probe (bench/results/2026-11-lab.md): as the uinit of a direct boot of the hypervisor
// image (bench/userland.sh's overlay), it loads kvm_amd (or kvm_intel),
// then (1) runs three real-mode instructions (mov al,0x31; out 0xf4,al;
// hlt) through the KVM API directly and reports the exit and its time,
// and (2) boots QEMU's one-sector probe guest under -accel kvm as
// hypervisor/vm.DetectAccel does, but waits up to 60 s instead of 3 s, to
// tell a hang from a slow success. Every line goes to the console.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/corralhq/corral/agent/coldplug"
)

// KVM ioctls (linux/kvm.h).
const (
	kvmCreateVM            = 0xAE01
	kvmGetVCPUMmapSize     = 0xAE04
	kvmCreateVCPU          = 0xAE41
	kvmSetUserMemoryRegion = 0x4020AE46
	kvmSetRegs             = 0x4090AE82
	kvmGetSregs            = 0x8138AE83
	kvmSetSregs            = 0x4138AE84
	kvmRun                 = 0xAE80

	exitIO  = 2
	exitHLT = 5
)

func say(format string, a ...any) {
	fmt.Printf("kvmprobe: "+format+"\n", a...)
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "direct" { // on any host: the API probe alone
		t := time.Now()
		res := make(chan string, 1)
		go func() { res <- direct() }()
		select {
		case r := <-res:
			say("direct KVM_RUN: %s after %s", r, time.Since(t).Round(time.Microsecond))
		case <-time.After(5 * time.Second):
			say("direct KVM_RUN: no exit within 5 s (hung)")
		}
		return
	}
	start := time.Now()
	for _, m := range []string{"kvm_amd", "kvm_intel"} {
		t := time.Now()
		err := (coldplug.KernelLoader{}).Load(m)
		say("load %s: %v (%s)", m, err, time.Since(t).Round(time.Millisecond))
		if err == nil {
			break
		}
	}
	for i := 0; i < 50; i++ {
		if _, err := os.Stat("/dev/kvm"); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t0 := time.Now()
	res := make(chan string, 1)
	go func() { res <- direct() }()
	select {
	case r := <-res:
		say("direct KVM_RUN: %s after %s", r, time.Since(t0).Round(time.Microsecond))
	case <-time.After(5 * time.Second):
		say("direct KVM_RUN: no exit within 5 s (hung)")
	}
	img := "/tmp/probe.img"
	b := make([]byte, 512)
	copy(b, []byte{0xb0, 0x31, 0xe6, 0xf4, 0xf4, 0xeb, 0xfd})
	b[510], b[511] = 0x55, 0xaa
	if err := os.WriteFile(img, b, 0o600); err != nil {
		say("write %s: %v", img, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	t := time.Now()
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", "-accel", "kvm", "-nodefaults", "-no-user-config", "-display", "none",
		"-machine", "pc", "-m", "16", "-device", "isa-debug-exit,iobase=0xf4,iosize=0x04",
		"-drive", "file="+img+",format=raw,if=floppy", "-boot", "a")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee) && ee.ExitCode() == 99:
		say("QEMU probe guest under KVM: exited 99 (ran) after %s", time.Since(t).Round(time.Millisecond))
	case ctx.Err() != nil:
		say("QEMU probe guest under KVM: no exit within 60 s (hung)")
	default:
		say("QEMU probe guest under KVM: %v after %s: %s", err, time.Since(t).Round(time.Millisecond), out)
	}
	t = time.Now()
	out, err = exec.Command("qemu-system-x86_64", "-version").CombinedOutput()
	say("qemu-system-x86_64 -version (QEMU's own start): %v after %s: %.40s", err, time.Since(t).Round(time.Millisecond), out)
	say("done %s after start", time.Since(start).Round(time.Millisecond))
	for {
		time.Sleep(time.Hour)
	}
}

func ioctl(fd int, req, arg uintptr) (uintptr, error) {
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, arg)
	if errno != 0 {
		return r, errno
	}
	return r, nil
}

// direct runs the three instructions under KVM_RUN and describes the
// first exit.
func direct() string {
	runtime.LockOSThread()
	kvm, err := unix.Open("/dev/kvm", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "open /dev/kvm: " + err.Error()
	}
	vmfd, err := ioctl(kvm, kvmCreateVM, 0)
	if err != nil {
		return "KVM_CREATE_VM: " + err.Error()
	}
	mem, err := unix.Mmap(-1, 0, 0x1000, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		return "mmap: " + err.Error()
	}
	copy(mem, []byte{0xb0, 0x31, 0xe6, 0xf4, 0xf4})
	region := struct {
		slot, flags             uint32
		guestPhys, size, userVA uint64
	}{0, 0, 0x1000, 0x1000, uint64(uintptr(unsafe.Pointer(&mem[0])))}
	if _, err := ioctl(int(vmfd), kvmSetUserMemoryRegion, uintptr(unsafe.Pointer(&region))); err != nil {
		return "KVM_SET_USER_MEMORY_REGION: " + err.Error()
	}
	vcpu, err := ioctl(int(vmfd), kvmCreateVCPU, 0)
	if err != nil {
		return "KVM_CREATE_VCPU: " + err.Error()
	}
	size, err := ioctl(kvm, kvmGetVCPUMmapSize, 0)
	if err != nil {
		return "KVM_GET_VCPU_MMAP_SIZE: " + err.Error()
	}
	run, err := unix.Mmap(int(vcpu), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return "mmap vcpu: " + err.Error()
	}
	var sregs [312]byte
	if _, err := ioctl(int(vcpu), kvmGetSregs, uintptr(unsafe.Pointer(&sregs[0]))); err != nil {
		return "KVM_GET_SREGS: " + err.Error()
	}
	for i := 0; i < 8; i++ { // cs: base 0, selector 0
		sregs[i] = 0
	}
	sregs[12], sregs[13] = 0, 0
	if _, err := ioctl(int(vcpu), kvmSetSregs, uintptr(unsafe.Pointer(&sregs[0]))); err != nil {
		return "KVM_SET_SREGS: " + err.Error()
	}
	var regs [18]uint64
	regs[16], regs[17] = 0x1000, 0x2 // rip, rflags
	if _, err := ioctl(int(vcpu), kvmSetRegs, uintptr(unsafe.Pointer(&regs[0]))); err != nil {
		return "KVM_SET_REGS: " + err.Error()
	}
	var exits []string
	for i := 0; i < 2; i++ {
		if _, err := ioctl(int(vcpu), kvmRun, 0); err != nil {
			return fmt.Sprintf("KVM_RUN: %v (exits so far %v)", err, exits)
		}
		reason := *(*uint32)(unsafe.Pointer(&run[8]))
		switch reason {
		case exitIO:
			port := *(*uint16)(unsafe.Pointer(&run[34]))
			off := *(*uint64)(unsafe.Pointer(&run[40]))
			exits = append(exits, fmt.Sprintf("IO port %#x value %#x", port, run[off]))
		case exitHLT:
			exits = append(exits, "HLT")
			return fmt.Sprintf("exits %v", exits)
		default:
			return fmt.Sprintf("exit reason %d (exits so far %v)", reason, exits)
		}
	}
	return fmt.Sprintf("exits %v", exits)
}
