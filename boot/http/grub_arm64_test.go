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
func TestGRUBARM64Golden(t *testing.T) {
	withARM64 := func(c *Config) {
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
	f := newFixture(t, withARM64)
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
			golden := filepath.Join("testdata", name+".grub")
			if *update {
				os.WriteFile(golden, body, 0o644)
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(body, want) {
				t.Errorf("GRUB config differs from %s (run with -update):\n%s", golden, body)
			}
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
