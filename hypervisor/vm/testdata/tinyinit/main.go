// Command tinyinit is the /init of the tiny test guest: it loads the
// kernel modules shipped in /modules, finds the NoCloud seed CD-ROM
// (label cidata), sets and prints the hostname from meta-data, prints the
// NICs, and powers off when the ACPI power button is pressed. Everything
// goes to the console for the test to read.
package main

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/corralhq/corral/hypervisor/cloudinit"
	"golang.org/x/sys/unix"
)

func say(format string, a ...any) { fmt.Printf("CORRAL-TINY "+format+"\n", a...) }

func main() {
	os.MkdirAll("/dev", 0o755)
	os.MkdirAll("/proc", 0o755)
	os.MkdirAll("/sys", 0o755)
	unix.Mount("devtmpfs", "/dev", "devtmpfs", 0, "")
	unix.Mount("proc", "/proc", "proc", 0, "")
	unix.Mount("sysfs", "/sys", "sysfs", 0, "")
	say("init started")
	loadModules("/modules")
	go powerButton()
	files, dev := findSeed(60 * time.Second)
	if files == nil {
		say("no cidata seed found")
	} else {
		host := field(string(files[cloudinit.MetaData]), "local-hostname")
		unix.Sethostname([]byte(host))
		say("seed=%s hostname=%s", dev, host)
	}
	time.Sleep(2 * time.Second) // virtio-net probing
	nics, _ := filepath.Glob("/sys/class/net/*/address")
	for _, n := range nics {
		mac, _ := os.ReadFile(n)
		say("nic %s mac=%s", filepath.Base(filepath.Dir(n)), strings.TrimSpace(string(mac)))
	}
	say("ready")
	select {}
}

func loadModules(dir string) {
	mods, _ := filepath.Glob(filepath.Join(dir, "*.ko"))
	loaded := map[string]bool{}
	// Retry until no progress: dependencies load in some order.
	for progress := true; progress; {
		progress = false
		for _, m := range mods {
			if loaded[m] {
				continue
			}
			f, err := os.Open(m)
			if err != nil {
				continue
			}
			err = unix.FinitModule(int(f.Fd()), "", 0)
			f.Close()
			if err == nil || err == unix.EEXIST {
				loaded[m] = true
				progress = true
			}
		}
	}
	say("modules loaded=%d of %d", len(loaded), len(mods))
}

func findSeed(wait time.Duration) (map[string][]byte, string) {
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		devs, _ := filepath.Glob("/dev/sr*")
		for _, d := range devs {
			f, err := os.Open(d)
			if err != nil {
				continue
			}
			label, files, err := cloudinit.ReadISO(f)
			f.Close()
			if err == nil && label == cloudinit.Label {
				return files, d
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return nil, ""
}

func field(yaml, key string) string {
	for _, l := range strings.Split(yaml, "\n") {
		if v, ok := strings.CutPrefix(l, key+":"); ok {
			return strings.Trim(strings.TrimSpace(v), `"'`)
		}
	}
	return ""
}

// powerButton powers off on KEY_POWER from any input device.
func powerButton() {
	seen := map[string]bool{}
	for {
		evs, _ := filepath.Glob("/dev/input/event*")
		for _, e := range evs {
			if seen[e] {
				continue
			}
			seen[e] = true
			go func(path string) {
				f, err := os.Open(path)
				if err != nil {
					return
				}
				buf := make([]byte, 24)
				for {
					if _, err := f.Read(buf); err != nil {
						return
					}
					typ, code := binary.LittleEndian.Uint16(buf[16:]), binary.LittleEndian.Uint16(buf[18:])
					if typ == 1 && code == 116 { // EV_KEY, KEY_POWER
						say("poweroff")
						unix.Sync()
						unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
					}
				}
			}(e)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
