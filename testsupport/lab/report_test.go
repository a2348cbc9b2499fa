package lab

import (
	"strings"
	"testing"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func TestBoots(t *testing.T) {
	t0 := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	e := func(s float64, src, ev string, attrs ...string) *inventoryv1.TimelineEntry {
		m := map[string]string{}
		for i := 0; i+1 < len(attrs); i += 2 {
			m[attrs[i]] = attrs[i+1]
		}
		return &inventoryv1.TimelineEntry{At: timestamppb.New(at(s)), Source: src, Event: ev, Attributes: m}
	}
	tests := map[string]struct {
		entries   []*inventoryv1.TimelineEntry
		poweredAt time.Time
		want      []Boot
	}{
		"empty": {},
		"discover then install then hypervisor": {
			entries: []*inventoryv1.TimelineEntry{
				e(0, "bmc", "power-on"),
				e(1, "bmc", "power-changed"), // the poller's observation is no action
				e(3, "dhcp", "discover"), e(3.1, "dhcp", "offer"),
				e(9, "dhcp", "discover"), // iPXE's own DHCP: same boot
				e(10, "http", "script", "intent", "discover"),
				e(11, "http", "artifact", "kind", "kernel"), e(12, "http", "artifact", "kind", "initrd"),
				e(30, "inventory", "registered"), e(31, "lifecycle", "auto-accepted"),
				e(32, "lifecycle", "installed"), e(33, "lifecycle", "reboot"), e(38, "bmc", "power-changed"),
				e(40, "dhcp", "discover"),
				e(41, "http", "script", "intent", "hypervisor"),
				e(42, "http", "artifact", "kind", "kernel"), e(43, "http", "artifact", "kind", "initrd"),
				e(60, "node", "registered"), e(61, "lifecycle", "deployed"),
			},
			want: []Boot{
				{Intent: "discover", Power: at(0), DHCP: at(3), Script: at(10), Kernel: at(11), Initrd: at(12),
					Agent: at(30), AgentEvent: "inventory registered", Last: at(33), LastEvent: "lifecycle reboot"},
				{Intent: "hypervisor", Power: at(33), DHCP: at(40), Script: at(41), Kernel: at(42), Initrd: at(43),
					Agent: at(60), AgentEvent: "node registered", Last: at(61), LastEvent: "lifecycle deployed", Ready: at(61)},
			},
		},
		"discover then install then kexec": {
			entries: []*inventoryv1.TimelineEntry{
				e(3, "dhcp", "discover"), e(10, "http", "script", "intent", "discover"),
				e(30, "inventory", "registered"), e(32, "lifecycle", "installed"),
				e(32.1, "lifecycle", "kexec"),
				e(32.5, "http", "artifact", "kind", "kernel"), e(33, "http", "artifact", "kind", "initrd"),
				e(50, "node", "registered"), e(51, "lifecycle", "deployed"),
			},
			want: []Boot{
				{Intent: "discover", DHCP: at(3), Script: at(10), Agent: at(30), AgentEvent: "inventory registered", Last: at(32), LastEvent: "lifecycle installed"},
				{Intent: "hypervisor/kexec", Power: at(32.1), Script: at(32.1), Kernel: at(32.5), Initrd: at(33),
					Agent: at(50), AgentEvent: "node registered", Last: at(51), LastEvent: "lifecycle deployed", Ready: at(51)},
			},
		},
		"discover then install with the kexec files fetched ahead": {
			entries: []*inventoryv1.TimelineEntry{
				e(3, "dhcp", "discover"), e(10, "http", "script", "intent", "discover"),
				e(11, "http", "artifact", "kind", "kernel"), e(12, "http", "artifact", "kind", "initrd"),
				e(30, "inventory", "registered"),
				e(30.5, "http", "artifact", "kind", "kernel"), e(31, "http", "artifact", "kind", "initrd"),
				e(32, "lifecycle", "installed"), e(32.1, "lifecycle", "kexec"),
				e(50, "node", "registered"), e(51, "lifecycle", "deployed"),
			},
			want: []Boot{
				{Intent: "discover", DHCP: at(3), Script: at(10), Kernel: at(11), Initrd: at(12), Agent: at(30), AgentEvent: "inventory registered",
					Last: at(32), LastEvent: "lifecycle installed"},
				{Intent: "hypervisor/kexec", Power: at(32.1), Script: at(32.1), Kernel: at(32.1), Initrd: at(32.1),
					Agent: at(50), AgentEvent: "node registered", Last: at(51), LastEvent: "lifecycle deployed", Ready: at(51)},
			},
		},
		"lab power on without BMC": {
			entries:   []*inventoryv1.TimelineEntry{e(5, "dhcp", "discover"), e(6, "http", "script", "intent", "discover")},
			poweredAt: at(1),
			want:      []Boot{{Intent: "discover", Power: at(1), DHCP: at(5), Script: at(6), Last: at(6), LastEvent: "http script"}},
		},
		"firmware DHCP without a script yet": {
			entries: []*inventoryv1.TimelineEntry{e(5, "dhcp", "discover"), e(8, "dhcp", "discover")},
			want:    []Boot{{DHCP: at(5)}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := Boots(tc.entries, tc.poweredAt)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Boots (-want +got):\n%s", diff)
			}
		})
	}
}

func TestChassisScriptBootOrder(t *testing.T) {
	m := Machine{Name: "lab-1", Dir: "/x/lab-1", Firmware: "uefi", Serial: "S1", Board: "B1", UUID: "u", MAC: "52:54:00:00:00:01",
		Tap: "t1", Disks: []Disk{{Path: "/x/a", Serial: "DA"}, {Path: "/x/b", Serial: "DB"}}, MemoryMiB: 2560, CPUs: 2, VMPort: 9001}
	s := m.chassisScript(true)
	for _, want := range []string{
		"virtio-net-pci,netdev=n0,mac=52:54:00:00:00:01,romfile=,bootindex=$NIC",
		"virtio-blk-pci,drive=d0,serial=DA,bootindex=$((DISK+0))",
		"virtio-blk-pci,drive=d1,serial=DB,bootindex=$((DISK+1))",
		"'type=1,manufacturer=Corral Lab,product=Virtual Rack UEFI,serial=S1,uuid=u'",
		"if=pflash,format=raw,unit=0,readonly=on,file=" + ovmfCode,
		"isa-ipmi-bt,bmc=bmc0",
		"-daemonize -pidfile $D/qemu.pid",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("chassis script lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(Machine{Firmware: "bios", Disks: m.Disks}.chassisScript(false), "romfile=") {
		t.Error("BIOS machine without its iPXE option ROM")
	}
}

// TestChassisScriptTPM: a machine with a TPM starts its own swtpm before
// QEMU and attaches it as tpm-tis; one without has neither.
func TestChassisScriptTPM(t *testing.T) {
	m := Machine{Name: "lab-1", Dir: "/x/lab-1", Firmware: "bios", MAC: "52:54:00:00:00:01", Tap: "t1", MemoryMiB: 2560, CPUs: 2, TPM: true}
	s := m.chassisScript(false)
	start, qemu := strings.Index(s, "swtpm socket --tpm2 --tpmstate dir=/x/lab-1/tpm --ctrl type=unixio,path=/x/lab-1/tpm/ctrl.sock --terminate"), strings.Index(s, "qemu-system-x86_64")
	if start < 0 || qemu < 0 || start > qemu {
		t.Errorf("swtpm not started before QEMU:\n%s", s)
	}
	for _, want := range []string{"socket,id=chrtpm,path=/x/lab-1/tpm/ctrl.sock", "emulator,id=tpm0,chardev=chrtpm", "tpm-tis,tpmdev=tpm0"} {
		if !strings.Contains(s, want) {
			t.Errorf("chassis script lacks %q:\n%s", want, s)
		}
	}
	m.TPM = false
	if s := m.chassisScript(false); strings.Contains(s, "swtpm") || strings.Contains(s, "tpmdev") {
		t.Errorf("a machine without a TPM gets one:\n%s", s)
	}
}
