package inventory

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/google/go-cmp/cmp"
)

func TestFactCapsCheck(t *testing.T) {
	caps := FactCaps{ReportBytes: 4 << 10, Disks: 3, DIMMs: 2, NICs: 2, PCIDevices: 2}
	tests := map[string]struct {
		edit   func(f *inventoryv1.Facts)
		reason string // "" = accepted
		says   []string
	}{
		"within every cap": {edit: func(*inventoryv1.Facts) {}},
		"report bytes": {
			edit: func(f *inventoryv1.Facts) {
				s := strings.Repeat("k", 500)
				f.Kernel, f.Cpu.Model = s, s
				f.System.Vendor, f.System.Product, f.System.Version, f.System.Sku, f.System.Family = s, s, s, s, s
				f.Bios = &inventoryv1.Facts_Bios{Vendor: s, Version: s}
			},
			reason: RefusedReportBytes, says: []string{"4096-byte cap", "--max-report-bytes"},
		},
		"disks": {edit: func(f *inventoryv1.Facts) { addDisks(f, 3) }, reason: RefusedDisks, says: []string{"disks", "cap of 3", "--max-report-disks"}},
		"dimms": {
			edit: func(f *inventoryv1.Facts) {
				f.Memory.Dimms = make([]*inventoryv1.Facts_Dimm, 3)
				for i := range f.Memory.Dimms {
					f.Memory.Dimms[i] = &inventoryv1.Facts_Dimm{Locator: "DIMM"}
				}
			},
			reason: RefusedDIMMs, says: []string{"--max-report-dimms"},
		},
		"nics": {
			edit: func(f *inventoryv1.Facts) {
				for i := range 3 {
					f.Nics = append(f.Nics, &inventoryv1.Facts_Nic{Name: fmt.Sprint("eth", i)})
				}
			},
			reason: RefusedNICs, says: []string{"--max-report-nics"},
		},
		"pci devices": {
			edit: func(f *inventoryv1.Facts) {
				f.PciDevices = make([]*inventoryv1.Facts_PciDevice, 3)
				for i := range f.PciDevices {
					f.PciDevices[i] = &inventoryv1.Facts_PciDevice{Address: "0000:00:00.0"}
				}
			},
			reason: RefusedPCIDevices, says: []string{"--max-report-pci-devices"},
		},
		"missing drivers": {
			edit: func(f *inventoryv1.Facts) {
				f.MissingDrivers = make([]*inventoryv1.Facts_PciDevice, 3)
				for i := range f.MissingDrivers {
					f.MissingDrivers[i] = &inventoryv1.Facts_PciDevice{Address: "0000:00:00.0"}
				}
			},
			reason: RefusedPCIDevices, says: []string{"without a driver"},
		},
		"window title in the vendor": {
			edit:   func(f *inventoryv1.Facts) { f.System.Vendor = "QEMU\x1b]0;owned\x07" },
			reason: RefusedControl, says: []string{"facts.system.vendor", `\x1b]0;owned\x07`},
		},
		"clear screen in a disk model": {
			edit:   func(f *inventoryv1.Facts) { f.Disks[0].Model = "\x1b[2J" },
			reason: RefusedControl, says: []string{"facts.disks[0].model"},
		},
		"OSC 52 in the kernel": {
			edit:   func(f *inventoryv1.Facts) { f.Kernel = "\x1b]52;c;ZXZpbA==\x07" },
			reason: RefusedControl, says: []string{"facts.kernel"},
		},
		"C1 CSI in the serial": {
			edit:   func(f *inventoryv1.Facts) { f.System.Serial = "SN\u009b2J" },
			reason: RefusedControl, says: []string{"facts.system.serial", `\u009b`},
		},
		"bidi override in a NIC name": {
			edit:   func(f *inventoryv1.Facts) { f.Nics[0].Name = "eth\u202e0" },
			reason: RefusedControl, says: []string{"facts.nics[0].name"},
		},
		"a long string": {edit: func(f *inventoryv1.Facts) {
			f.Bios = &inventoryv1.Facts_Bios{Version: strings.Repeat("v", MaxFactString+1)}
		}, reason: RefusedString},
		"bad UTF-8":      {edit: func(f *inventoryv1.Facts) { f.Cpu.Model = "\xff" }, reason: RefusedString},
		"bad MAC":        {edit: func(f *inventoryv1.Facts) { f.Nics[0].Mac = "nope" }, reason: RefusedInvalid},
		"printable kept": {edit: func(f *inventoryv1.Facts) { f.System.Vendor = "Größe ✓ \\x1b" }},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := facts("SN1", "", "52:54:00:00:09:01")
			tc.edit(f)
			err := caps.Check(f)
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var re *ReportError
			if !errors.As(err, &re) || !errors.Is(err, apierr.ErrInvalid) {
				t.Fatalf("want a *ReportError of class ErrInvalid, got %v", err)
			}
			if re.Reason != tc.reason {
				t.Errorf("reason %q, want %q (%v)", re.Reason, tc.reason, err)
			}
			for _, s := range tc.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("%q does not say %q", err, s)
				}
			}
			if strings.ContainsAny(err.Error(), "\x1b\x07\u009b\u202e") {
				t.Errorf("the refusal holds the control characters raw: %q", err)
			}
		})
	}
}

func addDisks(f *inventoryv1.Facts, n int) {
	for i := range n {
		f.Disks = append(f.Disks, &inventoryv1.Facts_Disk{Name: fmt.Sprint("sd", i)})
	}
}

func TestFactCapsDefaults(t *testing.T) {
	inv := newInv(t, Config{FactCaps: FactCaps{Disks: 3, HistoryBytes: -1}})
	want := DefaultFactCaps
	want.Disks, want.HistoryBytes = 3, -1
	if diff := cmp.Diff(want, inv.cfg.FactCaps); diff != "" {
		t.Errorf("caps (-want +got):\n%s", diff)
	}
	// Negative: no cap.
	f := facts("SN1", "")
	addDisks(f, 2000)
	if err := (FactCaps{Disks: -1}).Check(f); err != nil {
		t.Errorf("Disks -1 refused %d disks: %v", len(f.Disks), err)
	}
	if err := CheckFacts(f); err == nil {
		t.Errorf("CheckFacts took %d disks over the default cap %d", len(f.Disks), DefaultFactCaps.Disks)
	}
}

func TestCheckReportCountsAndLogs(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	counted := map[string]int{}
	inv := newInv(t, Config{
		Logger:   slog.New(slog.NewTextHandler(&logs, nil)),
		FactCaps: FactCaps{Disks: 2},
		ReportRefused: func(reason string) {
			mu.Lock()
			counted[reason]++
			mu.Unlock()
		},
	})
	f := facts("SN1", "")
	addDisks(f, 1)
	for range 50 {
		if err := inv.CheckReport("52:54:00:00:09:01", f); !errors.Is(err, apierr.ErrInvalid) {
			t.Fatalf("want ErrInvalid, got %v", err)
		}
	}
	ok := facts("SN1", "")
	if err := inv.CheckReport("52:54:00:00:09:01", ok); err != nil {
		t.Fatal(err)
	}
	bad := facts("SN1", "")
	bad.System.Product = "\x1b[2J"
	_ = inv.CheckReport("52:54:00:00:09:01", bad)
	mu.Lock()
	defer mu.Unlock()
	if diff := cmp.Diff(map[string]int{RefusedDisks: 50, RefusedControl: 1}, counted); diff != "" {
		t.Errorf("counted (-want +got):\n%s", diff)
	}
	if n := strings.Count(logs.String(), "report refused"); n == 0 || n > 12 {
		t.Errorf("%d log lines for 51 refusals, want a bounded few:\n%s", n, logs.String())
	}
	if strings.Contains(logs.String(), "\x1b") {
		t.Errorf("the log holds ESC raw")
	}
}

func TestTrimFactHistory(t *testing.T) {
	mk := func(n int) []*inventoryv1.FactChange {
		var h []*inventoryv1.FactChange
		for i := range n {
			h = append(h, &inventoryv1.FactChange{Path: fmt.Sprintf("p%03d", i), After: strings.Repeat("x", 90)})
		}
		return h
	}
	paths := func(h []*inventoryv1.FactChange) []string {
		var out []string
		for _, c := range h {
			out = append(out, c.GetPath())
		}
		return out
	}
	one := len(mk(1)[0].GetPath()) + 90 + 4 // two tagged strings
	tests := map[string]struct {
		n, entries, bytes int
		want              []string
	}{
		"under both":       {n: 3, entries: 10, bytes: 10 * one, want: []string{"p000", "p001", "p002"}},
		"entries bite":     {n: 5, entries: 2, bytes: 0, want: []string{"p003", "p004"}},
		"bytes bite":       {n: 5, entries: 0, bytes: 2*one + one/2, want: []string{"p003", "p004"}},
		"both, the lower":  {n: 5, entries: 3, bytes: 2 * one, want: []string{"p003", "p004"}},
		"newest too large": {n: 2, entries: 5, bytes: one - 1, want: nil},
		"no caps":          {n: 4, want: []string{"p000", "p001", "p002", "p003"}},
		"empty":            {n: 0, entries: 1, bytes: 1, want: nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := paths(TrimFactHistory(mk(tc.n), tc.entries, tc.bytes))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("kept (-want +got):\n%s", diff)
			}
		})
	}
}
