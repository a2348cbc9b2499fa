package e2e

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestBootPathTiming is a benchmark (bench/README.md, "Boot paths"): it
// prints, and asserts nothing about, power-on → the first GET of the
// iPXE script on the wire for OVMF's PXEv4 (DHCP → TFTP snponly.efi) and
// HTTPv4 (DHCP → HTTP ipxe.efi) boot of the same QEMU machine against one
// corrald, interleaved, CORRAL_BENCH_BOOTPATH rounds.
func TestBootPathTiming(t *testing.T) {
	rounds, _ := strconv.Atoi(os.Getenv("CORRAL_BENCH_BOOTPATH"))
	if rounds <= 0 {
		t.Skip("benchmark: set CORRAL_BENCH_BOOTPATH=ROUNDS to run it")
	}
	need(t, "qemu-system-x86_64", ovmfCode, ovmfVars)
	l := newLab(t)
	l.corrald("--dhcp-mode", "full", "--dhcp-range", l.subnet+".100-"+l.subnet+".150")
	got := map[string][]time.Duration{}
	var loads []string
	for r := 0; r < rounds; r++ {
		for i, path := range []string{"PXEv4", "HTTPv4"} {
			t.Run(fmt.Sprintf("%s-%d", path, r), func(t *testing.T) {
				mac := fmt.Sprintf("52:54:00:%s:%02x:%02x", l.id[:2], r, i)
				tap := l.tap(fmt.Sprintf("b%s%d%d", l.id[:4], r, i))
				sn := l.sniff(t)
				start := time.Now()
				var v *vm
				if path == "HTTPv4" {
					v = l.httpBootVM(t, mac, tap, false)
				} else {
					v = l.vm(vmOpts{uefi: true, nic: "virtio-net-pci", noROM: true, mac: mac, tap: tap, slot: httpBootSlot})
				}
				d := sn.waitScript(t, vmTimeout).Sub(start)
				got[path] = append(got[path], d)
				v.stop(t)
				b, _ := os.ReadFile("/proc/loadavg")
				loads = append(loads, strings.Fields(string(b))[0])
				t.Logf("%s round %d: power-on → first script GET %s (load %s)", path, r, d.Round(100*time.Millisecond), loads[len(loads)-1])
			})
		}
	}
	for _, path := range []string{"PXEv4", "HTTPv4"} {
		ds := slices.Clone(got[path])
		slices.Sort(ds)
		if len(ds) == 0 {
			continue
		}
		var all []string
		for _, d := range got[path] {
			all = append(all, d.Round(100*time.Millisecond).String())
		}
		t.Logf("%-6s power-on → first script GET: median %s (%s)", path, ds[len(ds)/2].Round(100*time.Millisecond), strings.Join(all, " "))
	}
	t.Logf("load average after each boot: %s", strings.Join(loads, " "))
}
