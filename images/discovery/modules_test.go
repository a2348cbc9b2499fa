package discovery

import (
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/testsupport/require"
)

const depFixture = `kernel/drivers/net/ethernet/intel/igb/igb.ko: kernel/drivers/dca/dca.ko kernel/drivers/i2c/algos/i2c-algo-bit.ko
kernel/drivers/dca/dca.ko:
kernel/drivers/i2c/algos/i2c-algo-bit.ko:
kernel/drivers/nvme/host/nvme.ko: kernel/drivers/nvme/host/nvme-core.ko
kernel/drivers/nvme/host/nvme-core.ko:
kernel/drivers/char/hw_random/virtio-rng.ko: kernel/drivers/virtio/virtio.ko
kernel/drivers/virtio/virtio.ko:
kernel/drivers/gpu/drm/drm.ko:
`

func TestClosure(t *testing.T) {
	md, err := ParseModulesDep(strings.NewReader(depFixture))
	if err != nil {
		t.Fatal(err)
	}
	got, err := md.Closure([]string{"igb", "nvme", "virtio_rng"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"kernel/drivers/char/hw_random/virtio-rng.ko", "kernel/drivers/dca/dca.ko", "kernel/drivers/i2c/algos/i2c-algo-bit.ko",
		"kernel/drivers/net/ethernet/intel/igb/igb.ko", "kernel/drivers/nvme/host/nvme-core.ko", "kernel/drivers/nvme/host/nvme.ko",
		"kernel/drivers/virtio/virtio.ko",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("closure =\n%q\nwant\n%q", got, want)
	}
	if _, err := md.Closure([]string{"igb", "no_such_driver"}); err == nil || !strings.Contains(err.Error(), "no_such_driver") {
		t.Errorf("missing module: err = %v", err)
	}
}

func TestInputsKey(t *testing.T) {
	a := Inputs{Format: FormatVersion, Package: KernelPackage{Name: "linux-image-6.1.0-56-amd64", Version: "6.1.192-2"}, Modules: []string{"e1000"}, URoot: "v0.16.0", AgentSource: "x"}
	b := a
	b.AgentSource = "y"
	c := a
	c.Package.Version = "6.1.192-3"
	if k := a.Key(); k == b.Key() || k == c.Key() || a.Key() != k {
		t.Error("the cache key must change with the agent source and the kernel version, and only then")
	}
	// An amd64 key is what it was before builds had an architecture
	// (cached amd64 images stay valid); an arm64 one differs.
	if js, _ := json.Marshal(a.Package); strings.Contains(string(js), "Arch") {
		t.Errorf("amd64 kernel package %s: the architecture must be left out", js)
	}
	d := a
	d.Package.Arch = ArchARM64
	if d.Key() == a.Key() {
		t.Error("the cache key must change with the architecture")
	}
	if got := ModulesFor(ArchARM64); len(got) != len(Modules)-1 || slices.Contains(got, "crc32c_intel") {
		t.Errorf("ModulesFor(arm64) = %v", got)
	}
	if got := a.Package.Release(); got != "6.1.0-56-amd64" {
		t.Errorf("Release = %q", got)
	}
}

func TestFindDeb(t *testing.T) {
	d := t.TempDir()
	for _, n := range []string{"linux-image-6.1.0-56-amd64_6.1.192-1_amd64.deb", "linux-image-6.1.0-56-amd64_6.1.192-2_amd64.deb", "linux-image-6.1.0-56-amd64_1%3a2.0_amd64.deb"} {
		os.WriteFile(filepath.Join(d, n), nil, 0o644)
	}
	p := filepath.Join(d, "linux-image-6.1.0-56-amd64_*.deb")
	if got := findDeb(p, "6.1.192-2"); filepath.Base(got) != "linux-image-6.1.0-56-amd64_6.1.192-2_amd64.deb" {
		t.Errorf("findDeb = %q", got)
	}
	if got := findDeb(p, "1:2.0"); got == "" {
		t.Error("epoch versions are escaped as %3a in file names")
	}
	if got := findDeb(p, "6.1.192-9"); got != "" {
		t.Errorf("findDeb(absent) = %q", got)
	}
}

// TestStageModules stages a fake module tree (depmod runs on it) and
// checks the staged set is the closure, uncompressed (the agent loads them
// with finit_module as they are) and indexed.
func TestStageModules(t *testing.T) {
	if err := depmodAvailable(); err != nil {
		require.Missing(t, "depmod not installed (apt-get install kmod)")
	}
	root, stage := t.TempDir(), t.TempDir()
	const kver = "6.1.0-test"
	src := filepath.Join(root, "lib/modules", kver)
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "modules.dep"), []byte(depFixture), 0o644); err != nil {
		t.Fatal(err)
	}
	md, _ := ParseModulesDep(strings.NewReader(depFixture))
	for _, d := range md {
		p := filepath.Join(src, d.Path)
		os.MkdirAll(filepath.Dir(p), 0o755)
		// Not ELF: depmod warns and skips, the staging itself is checked.
		os.WriteFile(p, []byte("not a module "+d.Path), 0o644)
	}
	staged, err := StageModules(root, stage, kver, []string{"igb"})
	if err != nil {
		t.Fatal(err)
	}
	if len(staged) != 3 {
		t.Fatalf("staged = %q, want igb, dca, i2c-algo-bit", staged)
	}
	for _, p := range staged {
		if !strings.HasSuffix(p, ".ko") {
			t.Errorf("%s is not an uncompressed module", p)
		}
		out, err := os.ReadFile(filepath.Join(stage, "lib/modules", kver, p))
		if err != nil || string(out) != "not a module "+p {
			t.Errorf("%s: %v %q", p, err, out)
		}
	}
	if _, err := os.Stat(filepath.Join(stage, "lib/modules", kver, "kernel/drivers/gpu/drm/drm.ko")); err == nil {
		t.Error("a module outside the closure was staged")
	}
	if _, err := os.Stat(filepath.Join(stage, "lib/modules", kver, "modules.dep")); err != nil {
		t.Errorf("depmod made no modules.dep: %v", err)
	}
}

func depmodAvailable() error {
	if _, err := exec.LookPath("depmod"); err == nil {
		return nil
	}
	for _, p := range []string{"/usr/sbin/depmod", "/sbin/depmod"} {
		if _, err := os.Stat(p); err == nil {
			return nil
		}
	}
	return os.ErrNotExist
}

func TestPrune(t *testing.T) {
	d := t.TempDir()
	k := KernelPackage{Name: "linux-image-6.1.0-56-amd64", Version: "6.1.192-2"}
	os.MkdirAll(filepath.Join(d, "debs"), 0o755)
	for _, n := range []string{"linux-image-6.1.0-56-amd64_6.1.192-2_amd64.deb", "linux-image-6.1.0-55-amd64_6.1.190-1_amd64.deb"} {
		os.WriteFile(filepath.Join(d, "debs", n), nil, 0o644)
	}
	keys := []string{}
	for i := 0; i < 5; i++ {
		key := strings.Repeat(string(rune('a'+i)), 64)
		keys = append(keys, key)
		os.MkdirAll(filepath.Join(d, key), 0o755)
		p := filepath.Join(d, key, "manifest.json")
		os.WriteFile(p, []byte("{}"), 0o644)
		when := time.Now().Add(time.Duration(i-10) * time.Minute)
		os.Chtimes(p, when, when)
	}
	pruneBuilds(d, keys[0], 3, slog.New(slog.DiscardHandler))
	prune(d, k, slog.New(slog.DiscardHandler))
	for i, key := range keys {
		_, err := os.Stat(filepath.Join(d, key))
		if kept := err == nil; kept != (i == 0 || i >= 3) {
			t.Errorf("build %d kept = %v", i, kept)
		}
	}
	if debs, _ := filepath.Glob(filepath.Join(d, "debs", "*.deb")); len(debs) != 1 || !strings.Contains(debs[0], "6.1.192-2") {
		t.Errorf("debs left = %v", debs)
	}
}
