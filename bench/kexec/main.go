// Command kexec is the guest side of bench/kexec.sh: where the seconds of
// the discovery image's kexec into the hypervisor image go under QEMU TCG
// (bench/results/2026-11-lab.md). As PID 1 of a small initramfs that also carries the
// hypervisor kernel and initrd, it loads them with the method the kernel
// command line names (kb.method=file: kexec_file_load as the agent did
// before; kb.method=segments: kexec_load with the non-hashing purgatory, as
// agent/kexec does now), prints a line per step to the console (the host
// side timestamps every console line) and reboots into them. On the host,
// "kexec cpio OUT FILE..." writes the initramfs (newc, uncompressed).
package main

import (
	"crypto/sha256"
	"crypto/sha512"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corralhq/corral/agent/kexec"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "cpio" {
		if err := writeCpio(os.Args[2], os.Args[3:]); err != nil {
			fmt.Fprintln(os.Stderr, "kexec cpio:", err)
			os.Exit(1)
		}
		return
	}
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "usage: kexec cpio OUT FILE... (the guest init runs as PID 1)")
		os.Exit(2)
	}
	err := guest()
	say("kb: FAILED: %v", err)
	for {
		time.Sleep(time.Hour)
	}
}

var out io.Writer = os.Stderr

func say(format string, a ...any) {
	fmt.Fprintf(out, format+"\n", a...)
}

func guest() error {
	for _, m := range []struct{ src, dst, fs string }{{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"devtmpfs", "/dev", "devtmpfs"}} {
		if err := unix.Mount(m.src, m.dst, m.fs, 0, ""); err != nil {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	if f, err := os.OpenFile("/dev/ttyS0", os.O_WRONLY, 0); err == nil {
		out = f
	}
	cl, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return err
	}
	method, next := "file", ""
	for _, w := range strings.Fields(string(cl)) {
		if v, ok := strings.CutPrefix(w, "kb.method="); ok {
			method = v
		}
	}
	if b, err := os.ReadFile("/next-cmdline"); err == nil {
		next = strings.TrimSpace(string(b))
	}
	say("kb: init up, method %s", method)
	kernel, err := memCopy("/vmlinuz")
	if err != nil {
		return err
	}
	initrd, err := memCopy("/hyp.img")
	if err != nil {
		return err
	}
	say("kb: files in memfds")
	for _, f := range []*os.File{kernel, initrd} {
		t := time.Now()
		h := sha256.New()
		n, err := io.Copy(h, f)
		if err != nil {
			return err
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return err
		}
		say("kb: sha256 of %d bytes in %s (GODEBUG=%q)", n, time.Since(t).Round(time.Millisecond), os.Getenv("GODEBUG"))
	}
	if st, err := initrd.Stat(); err == nil && hasWord(string(cl), "kb.split") {
		// What a copy of the initrd costs (u-root's kexec.Load copies every
		// segment once, AlignAndMerge), and SHA-512 of it for comparison.
		b, err := unix.Mmap(int(initrd.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_PRIVATE)
		if err != nil {
			return err
		}
		t := time.Now()
		c := append(make([]byte, 0), b...)
		say("kb: copy of %d bytes in %s", len(c), time.Since(t).Round(time.Millisecond))
		t = time.Now()
		h := sha512.Sum512(b)
		say("kb: sha512 of %d bytes in %s (%x)", len(b), time.Since(t).Round(time.Millisecond), h[:4])
		if err := unix.Munmap(b); err != nil {
			return err
		}
	}
	say("kb: hashed")
	t := time.Now()
	var load func(k, i *os.File, c string) error
	switch method {
	case "file":
		load = kexec.FileLoad
	case "segments":
		load = kexec.SegmentsLoad
	default:
		return errors.New("unknown kb.method " + method)
	}
	if err := load(kernel, initrd, next); err != nil {
		return fmt.Errorf("load: %w", err)
	}
	say("kb: loaded in %s; rebooting", time.Since(t).Round(time.Millisecond))
	return unix.Reboot(unix.LINUX_REBOOT_CMD_KEXEC)
}

func hasWord(s, w string) bool {
	for _, f := range strings.Fields(s) {
		if f == w {
			return true
		}
	}
	return false
}

func memCopy(path string) (*os.File, error) {
	src, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	fd, err := unix.MemfdCreate(filepath.Base(path), unix.MFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), path)
	if _, err := io.Copy(f, src); err != nil {
		return nil, err
	}
	_, err = f.Seek(0, io.SeekStart)
	return f, err
}

// writeCpio writes a newc archive of dirs dev, proc, sys and the files
// (NAME=PATH: PATH stored as NAME, mode kept).
func writeCpio(out string, files []string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	ino := 1
	hdr := func(name string, mode uint32, size int) error {
		_, err := fmt.Fprintf(f, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%s\x00",
			ino, mode, 0, 0, 1, 0, size, 0, 0, 0, 0, len(name)+1, 0, name)
		ino++
		if err == nil {
			err = pad(f)
		}
		return err
	}
	for _, d := range []string{"dev", "proc", "sys"} {
		if err := hdr(d, unix.S_IFDIR|0o755, 0); err != nil {
			return err
		}
	}
	for _, nf := range files {
		name, path, ok := strings.Cut(nf, "=")
		if !ok {
			return fmt.Errorf("%s: want NAME=PATH", nf)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		st, err := os.Stat(path)
		if err != nil {
			return err
		}
		if err := hdr(name, unix.S_IFREG|uint32(st.Mode().Perm()), len(b)); err != nil {
			return err
		}
		if _, err := f.Write(b); err != nil {
			return err
		}
		if err := pad(f); err != nil {
			return err
		}
	}
	if err := hdr("TRAILER!!!", 0, 0); err != nil {
		return err
	}
	return f.Close()
}

func pad(f *os.File) error {
	off, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return err
	}
	if n := (4 - off%4) % 4; n > 0 {
		_, err = f.Write(make([]byte, n))
	}
	return err
}
