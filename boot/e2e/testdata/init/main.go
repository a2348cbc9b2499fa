// Command init is the /init of the end-to-end tests' initramfs: it prints
// the kernel command line (and the lockdown state, when securityfs has
// it) to the console with a marker the tests wait for, then powers the VM
// off.
package main

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"
)

func main() {
	os.MkdirAll("/proc", 0o755)
	if err := syscall.Mount("proc", "/proc", "proc", 0, ""); err != nil {
		fmt.Println("CORRAL-TEST-INIT mount /proc:", err)
	}
	b, err := os.ReadFile("/proc/cmdline")
	fmt.Printf("CORRAL-TEST-INIT cmdline: %s (err %v)\n", strings.TrimSpace(string(b)), err)
	// The kernel's lockdown state: "[integrity]" under Secure Boot.
	os.MkdirAll("/sys", 0o755)
	if err := syscall.Mount("sysfs", "/sys", "sysfs", 0, ""); err == nil {
		if err := syscall.Mount("securityfs", "/sys/kernel/security", "securityfs", 0, ""); err == nil {
			l, err := os.ReadFile("/sys/kernel/security/lockdown")
			fmt.Printf("CORRAL-TEST-INIT lockdown: %s (err %v)\n", strings.TrimSpace(string(l)), err)
		}
	}
	time.Sleep(200 * time.Millisecond)
	syscall.Sync()
	syscall.Reboot(syscall.LINUX_REBOOT_CMD_POWER_OFF)
	select {}
}
