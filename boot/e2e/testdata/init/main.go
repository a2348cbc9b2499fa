// Command init is the /init of the end-to-end tests' initramfs: it prints
// the kernel command line to the console with a marker the tests wait
// for, then powers the VM off.
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
	time.Sleep(200 * time.Millisecond)
	syscall.Sync()
	syscall.Reboot(syscall.LINUX_REBOOT_CMD_POWER_OFF)
	select {}
}
