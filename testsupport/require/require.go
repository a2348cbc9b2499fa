// Package require states what a test needs from the machine it runs on
// (root, a program, a file, a kernel feature) so that CI cannot go green by
// skipping: where a precondition is not met, the test skips with a
// one-line reason, except when the environment says CI (CI=true, or any
// value strconv.ParseBool reads as true), where the same reason fails the
// test. The one exception is a feature of the running kernel
// (KernelLacks), which no CI script can install: it skips everywhere and
// the run's summary names it. `.ci/run` exports CI=true. Skips for -short (testing.Short) and
// for opt-in developer switches are not preconditions and do not go
// through this package.
//
// It imports only the standard library; product code never imports it.
package require

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// CI reports whether the environment says this is a CI run (CI=true).
func CI() bool {
	ci, _ := strconv.ParseBool(os.Getenv("CI"))
	return ci
}

// Missing skips t with the reason format names, or fails it under CI. It
// is for preconditions the other helpers do not cover (a loop device, a
// flag of the binary under test). Like t.Skip and
// t.Fatal, it does not return.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	reason := fmt.Sprintf(format, args...)
	if CI() {
		t.Fatalf("%s (CI=true: a missing precondition fails instead of skipping)", reason)
	}
	t.Skip(reason)
}

// KernelLacks skips t, in CI too, because the running kernel lacks a
// feature the test exercises (a partition-table parser, a module that is
// not built): no package a CI script can install provides it, so failing
// would only make the suite red on that kernel. The skip and its reason
// are listed at the end of the run (make test), where CI shows them.
func KernelLacks(t testing.TB, format string, args ...any) {
	t.Helper()
	t.Skipf("kernel lacks: "+format+" (not installable: skipped under CI too, listed in the run's summary)", args...)
}

// Degraded is for a test that can go on with less coverage when something
// is missing: it logs the reason and returns, or under CI fails t.
func Degraded(t testing.TB, format string, args ...any) {
	t.Helper()
	reason := fmt.Sprintf(format, args...)
	if CI() {
		t.Fatalf("%s (CI=true: running with less coverage fails instead)", reason)
	}
	t.Log(reason)
}

// Root requires the test to run as root; why says what for (for example
// "network namespaces, taps").
func Root(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "needs root (%s)", why)
	}
}

// Tool requires each named program on PATH; a name with a slash is a file
// that must exist (firmware, a static binary). The reason names the
// Debian package to install where it is known.
func Tool(t testing.TB, names ...string) {
	t.Helper()
	for _, name := range names {
		var err error
		if strings.Contains(name, "/") {
			_, err = os.Stat(name)
		} else {
			_, err = exec.LookPath(name)
		}
		if err != nil {
			Missing(t, "%s not installed%s", name, installHint(name))
		}
	}
}

// File requires the file at path; what says what it is (for example "the
// test kernel (run images/testkernel/fetch.sh)").
func File(t testing.TB, path, what string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		Missing(t, "%s not found at %s", what, path)
	}
}

// debianPackages names the Debian package of the programs and files the
// tests ask for, where it is not the program's own name.
var debianPackages = map[string]string{
	"qemu-system-x86_64":            "qemu-system-x86",
	"qemu-img":                      "qemu-utils",
	"qemu-io":                       "qemu-utils",
	"ipmi_sim":                      "openipmi",
	"etcd":                          "etcd-server",
	"etcdctl":                       "etcd-client",
	"ip":                            "iproute2",
	"mke2fs":                        "e2fsprogs",
	"mkfs.ext4":                     "e2fsprogs",
	"losetup":                       "mount",
	"sfdisk":                        "fdisk",
	"xz":                            "xz-utils",
	"depmod":                        "kmod",
	"ssh":                           "openssh-client",
	"ssh-keygen":                    "openssh-client",
	"mkfs.vfat":                     "dosfstools",
	"mcopy":                         "mtools",
	"ping":                          "iputils-ping",
	"dpkg-deb":                      "dpkg",
	"dpkg-query":                    "dpkg",
	"apt-get":                       "apt",
	"apt-cache":                     "apt",
	"ldd":                           "libc-bin",
	"smartctl":                      "smartmontools",
	"promtool":                      "prometheus",
	"swtpm_setup":                   "swtpm-tools",
	"swtpm_localca":                 "swtpm-tools",
	"/bin/busybox":                  "busybox-static",
	"/usr/sbin/dropbear":            "dropbear-bin",
	"/usr/sbin/lldpd":               "lldpd",
	"/usr/lib/syslinux/mbr/mbr.bin": "syslinux-common",
}

func installHint(name string) string {
	switch {
	case name == "go":
		return ""
	case name == "grpcurl":
		return " (run `make tools`)"
	case strings.HasPrefix(name, "/usr/share/OVMF/"):
		return " (apt-get install ovmf)"
	case strings.HasPrefix(name, "/usr/lib/ipxe/"):
		return " (apt-get install ipxe)"
	}
	if p, ok := debianPackages[name]; ok {
		return " (apt-get install " + p + ")"
	}
	if strings.Contains(name, "/") {
		return ""
	}
	return " (apt-get install " + name + ")"
}
