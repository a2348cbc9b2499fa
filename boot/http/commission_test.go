package http

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/images"
)

// commissionInv is an inventory that also says which MACs have
// commissioning pending (Commissioning).
type commissionInv struct {
	*fakeInv
	pending map[string]bool
}

func (c commissionInv) CommissionPending(_ context.Context, mac string) bool { return c.pending[mac] }

// TestCommissionOverlayScript: a discovery boot with commissioning
// pending gets the overlay as a second initrd (and initrd= for it on the
// command line); any other boot does not; the agent's URL serves it.
func TestCommissionOverlayScript(t *testing.T) {
	src := t.TempDir()
	for _, n := range []string{images.UndionlyKPXE, "ipxe.lkrn"} {
		os.WriteFile(filepath.Join(src, n), []byte("bin "+n), 0o644)
	}
	overlay := filepath.Join(src, "overlay")
	os.WriteFile(overlay, bytes.Repeat([]byte("tools"), 1000), 0o644)
	cat, err := images.Open(images.Config{Dir: t.TempDir(), IPXEDirs: []string{src}, CommissionOverlay: overlay})
	if err != nil {
		t.Fatal(err)
	}
	inv := commissionInv{fakeInv: &fakeInv{machines: map[string]*inventoryv1.Machine{
		"52:54:00:00:00:01": {Name: "m1", BootIntent: inventoryv1.BootIntent_BOOT_INTENT_DISCOVER},
		"52:54:00:00:00:02": {Name: "m2", BootIntent: inventoryv1.BootIntent_BOOT_INTENT_DISCOVER},
	}}, pending: map[string]bool{"52:54:00:00:00:01": true}}
	s, err := New(Config{Listen: "127.0.0.1:0", Catalog: cat, Inventory: inv, Tokens: &fakeTokens{}, Timeline: &recorder{},
		APIEndpoint: ":20180", CAFingerprint: strings.Repeat("ab", 32)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.lis.Close()
	srv := httptest.NewServer(s)
	defer srv.Close()

	_, body := get(t, srv.URL+"/boot.ipxe?mac=52:54:00:00:00:01", nil)
	if !strings.Contains(string(body), "\ninitrd --name commission-overlay.img http://") ||
		!strings.Contains(string(body), "/images/commission-overlay.img?mac=52:54:00:00:00:01\nboot") || !strings.Contains(string(body), " initrd=initrd.img initrd=commission-overlay.img ") {
		t.Fatalf("commissioning boot:\n%s", body)
	}
	if _, body := get(t, srv.URL+"/boot.ipxe?mac=52:54:00:00:00:02", nil); strings.Contains(string(body), "commission") {
		t.Fatalf("plain discovery boot:\n%s", body)
	}
	url, a, err := s.CommissionOverlay("127.0.0.1", "52-54-00-00-00-01")
	if err != nil || a.Size != 5000 || len(a.SHA256) != 64 || !strings.HasSuffix(url, "/images/commission-overlay.img?mac=52:54:00:00:00:01") {
		t.Fatalf("overlay %q %+v %v", url, a, err)
	}
	resp, got := get(t, srv.URL+"/images/commission-overlay.img?mac=52:54:00:00:00:01", nil)
	if resp.StatusCode != http.StatusOK || len(got) != 5000 {
		t.Fatalf("GET overlay: %d, %d bytes", resp.StatusCode, len(got))
	}
}
