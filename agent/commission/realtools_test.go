package commission

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/testsupport/require"
)

// TestRunnerRealTools runs a small plan with the host's real tools: a
// disk "vdz" under a fake sysfs whose /dev path is a 16 MiB file (fio
// reads it read-only; smartctl finds no SMART there: a skip), memtester
// over 4 MiB, stress-ng for a second, and the link of a NIC "eth9" the
// fake sysfs says is up at 1000 Mb/s full duplex.
func TestRunnerRealTools(t *testing.T) {
	require.Tool(t, "smartctl", "memtester", "stress-ng", "fio", "ethtool")
	root := t.TempDir()
	disk := filepath.Join(t.TempDir(), "vdz.img")
	if err := os.WriteFile(disk, make([]byte, 16<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	write := func(p, s string) {
		p = filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("sys/block/vdz/size", "32768\n")
	write("sys/block/vdz/removable", "0\n")
	write("sys/block/loop0/size", "100\n")
	write("sys/class/net/eth9/device/vendor", "0x1af4\n")
	write("sys/class/net/eth9/carrier", "1\n")
	write("sys/class/net/eth9/speed", "1000\n")
	write("sys/class/net/eth9/duplex", "full\n")
	write("sys/class/net/lo/carrier", "1\n")
	exec := func(ctx context.Context, name string, args ...string) ([]byte, int, error) {
		for i, a := range args {
			args[i] = strings.ReplaceAll(a, "/dev/vdz", disk)
		}
		return runProgram(ctx, name, args...)
	}
	r := New(Config{Root: root, Exec: exec})
	plan := &nodev1.CommissionPlan{CommissionId: "commission-test", Profile: "test", Steps: []*inventoryv1.CommissionStep{
		{Kind: "smart"}, {Kind: "memtester", MemoryMib: 4, Loops: 1}, {Kind: "stress-ng", Seconds: 1},
		{Kind: "fio", Seconds: 1}, {Kind: "link", MinLinkMbps: 1000, FullDuplex: true},
	}}
	var got []*nodev1.Progress
	if err := r.Commission(context.Background(), plan, func(p *nodev1.Progress) { got = append(got, p) }); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"smart /dev/vdz": Skip, "memtester ": Pass, "stress-ng ": Pass, "fio /dev/vdz": Pass, "link eth9": Pass}
	for _, p := range got[:len(got)-1] {
		ct := p.GetCommissionTest()
		key := ct.GetName() + " " + ct.GetTarget()
		if want[key] != ct.GetResult() {
			t.Errorf("%s: %s (%s), want %s\n%s", key, ct.GetResult(), ct.GetSummary(), want[key], ct.GetOutput())
		}
		if len(ct.GetOutput()) > MaxOutput || p.GetInstallId() != "commission-test" {
			t.Errorf("%s: output %d bytes, id %q", key, len(ct.GetOutput()), p.GetInstallId())
		}
		delete(want, key)
	}
	if len(want) > 0 {
		t.Errorf("tests not run: %v", want)
	}
	last := got[len(got)-1]
	if !last.GetDone() || last.GetError() != "" || last.GetStep() != "commissioned" {
		t.Errorf("last progress %v", last)
	}

	// A threshold no machine meets fails its test and the whole run.
	got = nil
	plan.Steps = []*inventoryv1.CommissionStep{{Kind: "fio", Seconds: 1, MinMbps: 1 << 40}}
	if err := r.Commission(context.Background(), plan, func(p *nodev1.Progress) { got = append(got, p) }); err != nil {
		t.Fatal(err)
	}
	if last := got[len(got)-1]; last.GetError() != "1 of 1 tests failed: fio /dev/vdz" {
		t.Errorf("impossible threshold: %v", last)
	}
}
