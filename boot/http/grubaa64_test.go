package http

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corralhq/corral/images"
)

// TestGRUBARM64Golden: /boot.grub renders arm64 machines' GRUB configs:
// discovery boots the arm64 kernel and initramfs from the address the
// request arrived on, with no initrd= and ttyAMA0 as the console; the
// hypervisor intent (amd64 only) and a catalog without the arm64 image
// go back to the firmware with the reason on the console and the
// timeline.
// withARM64 gives a fixture a catalog holding the arm64 image.
func withARM64(t *testing.T) func(c *Config) {
	return func(c *Config) {
		src := t.TempDir()
		cfg := images.Config{Dir: c.Catalog.(*images.Catalog).Dir(), IPXEDirs: []string{src}}
		for _, n := range []string{images.IPXEEFI, "ipxe.lkrn", "k", "i", "g"} {
			os.WriteFile(filepath.Join(src, n), []byte("bin "+n), 0o644)
		}
		cfg.ARM64Kernel, cfg.ARM64Initrd, cfg.ARM64Loader = filepath.Join(src, "k"), filepath.Join(src, "i"), filepath.Join(src, "g")
		cat, err := images.Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		c.Catalog = cat
	}
}

func TestGRUBARM64Golden(t *testing.T) {
	f := newFixture(t, withARM64(t))
	bare := newFixture(t, nil)
	for name, tc := range map[string]struct {
		f   *fixture
		mac string
	}{
		"discover":       {f, "52:54:00:00:00:01"},
		"hypervisor":     {f, "52:54:00:00:00:03"},
		"local":          {f, "52:54:00:00:00:02"},
		"discover-noimg": {bare, "52:54:00:00:00:01"},
	} {
		t.Run(name, func(t *testing.T) {
			resp, body := get(t, tc.f.srv.URL+GRUBPath+"?mac="+tc.mac, nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			// The kernel's host is where the request arrived (a random
			// port here).
			body = bytes.ReplaceAll(body, []byte(strings.TrimPrefix(tc.f.srv.URL, "http://")), []byte("HOST"))
			checkGolden(t, filepath.Join("testdata", name+".grub"), body)
		})
	}
	if got := f.rec.detail("52:54:00:00:00:01", "script"); got != "rendered discover GRUB config (arm64)" {
		t.Errorf("timeline: %q", got)
	}
	// A hostile machine name cannot leave GRUB's quotes.
	if got := grubQuote(`x'; reboot; echo '`); got != `'x'\''; reboot; echo '\'''` {
		t.Errorf("grubQuote = %s", got)
	}
}

// TestGRUBARM64KernelArgs: an arm64 command line ends in ttyAMA0 alone
// when the operator set no kernel arguments (amd64's ttyS0 default would
// stall the agent's output there), and keeps the operator's otherwise.
func TestGRUBARM64KernelArgs(t *testing.T) {
	for args, want := range map[string]string{
		"":      `'corral.mac=52:54:00:00:00:01' 'console=ttyAMA0,115200'; then` + "\n",
		"quiet": `'corral.mac=52:54:00:00:00:01' 'quiet' 'console=ttyAMA0,115200'; then` + "\n",
	} {
		arm := withARM64(t)
		f := newFixture(t, func(c *Config) { arm(c); c.KernelArgs = args })
		_, body := get(t, f.srv.URL+GRUBPath+"?mac=52:54:00:00:00:01", nil)
		if !strings.Contains(string(body), want) || strings.Contains(string(body), "ttyS0") {
			t.Errorf("--boot-kernel-args %q: want the line to end %s:\n%s", args, want, body)
		}
		_, body = get(t, f.srv.URL+"/boot.ipxe?mac=52:54:00:00:00:01", nil)
		if args == "" && !strings.Contains(string(body), DefaultKernelArgs) {
			t.Errorf("amd64 script lost the default console arguments:\n%s", body)
		}
	}
}
