package install

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// kernel is the real system: ioctls, mount(2) and mke2fs.
type kernel struct {
	mke2fs string
}

// reread issues BLKRRPART on dev, retrying while the kernel says busy.
func (kernel) reread(dev string) error { return Reread(dev) }

// Reread asks the kernel to re-read dev's partition table (BLKRRPART),
// retrying while it says busy; agent/deploy uses it after it grows the
// image's table.
func Reread(dev string) error {
	f, err := os.Open(dev)
	if err != nil {
		return fmt.Errorf("re-read partition table: %w", err)
	}
	defer f.Close()
	for i := 0; ; i++ {
		err = unix.IoctlSetInt(int(f.Fd()), unix.BLKRRPART, 0)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || i == 10 {
			return fmt.Errorf("re-read partition table of %s (BLKRRPART): %w", dev, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// partition waits up to 10 s for partition n of disk in sysfs and its
// device node, creating the node from sysfs's major:minor when devtmpfs
// has not.
func (kernel) partition(ctx context.Context, root string, disk Disk, n int) (string, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		name, devno := findPartition(root, disk.Name, n)
		if name != "" {
			path := filepath.Join(root, "dev", name)
			if _, err := os.Stat(path); err == nil {
				return path, nil
			}
			if time.Now().After(deadline.Add(-5*time.Second)) && devno != "" {
				if err := mknod(path, devno); err == nil {
					return path, nil
				}
			}
		}
		if time.Now().After(deadline) {
			if name == "" {
				return "", fmt.Errorf("partition %d of /dev/%s did not appear in sysfs after re-reading the table (is the kernel built with CONFIG_EFI_PARTITION?)", n, disk.Name)
			}
			return "", fmt.Errorf("device node for %s did not appear", name)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// findPartition returns the kernel name and "major:minor" of partition n
// of disk from root/sys/block/<disk>/*/partition.
func findPartition(root, disk string, n int) (name, devno string) {
	base := filepath.Join(root, "sys/block", disk)
	entries, _ := os.ReadDir(base)
	for _, e := range entries {
		if readString(filepath.Join(base, e.Name(), "partition")) == strconv.Itoa(n) {
			return e.Name(), readString(filepath.Join(base, e.Name(), "dev"))
		}
	}
	return "", ""
}

func mknod(path, devno string) error {
	major, minor, ok := strings.Cut(devno, ":")
	if !ok {
		return fmt.Errorf("bad dev %q", devno)
	}
	a, err1 := strconv.ParseUint(major, 10, 32)
	b, err2 := strconv.ParseUint(minor, 10, 32)
	if err1 != nil || err2 != nil {
		return fmt.Errorf("bad dev %q", devno)
	}
	return unix.Mknod(path, unix.S_IFBLK|0o600, int(unix.Mkdev(uint32(a), uint32(b))))
}

// Mke2fs finds mke2fs: path when set, else on PATH, /usr/sbin, /sbin.
func Mke2fs(path string) (string, error) {
	if path != "" {
		return path, nil
	}
	if p, err := exec.LookPath("mke2fs"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/mke2fs", "/sbin/mke2fs"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("mke2fs not found (PATH, /usr/sbin, /sbin)")
}

func (k kernel) mkfs(ctx context.Context, dev, label string) error {
	bin, err := Mke2fs(k.mke2fs)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, bin, "-q", "-F", "-t", "ext4", "-L", label, dev)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", bin, dev, err, strings.TrimSpace(out.String()))
	}
	return nil
}

func (kernel) mount(dev, dir string) error {
	return unix.Mount(dev, dir, "ext4", unix.MS_NOATIME, "")
}

// unmount syncs the filesystem and unmounts it. A failed sync is an
// error: the install must not report done with the identity unwritten.
func (kernel) unmount(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	serr := unix.Syncfs(fd)
	unix.Close(fd)
	if err := unix.Unmount(dir, 0); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("sync %s: %w", dir, serr)
	}
	return nil
}
