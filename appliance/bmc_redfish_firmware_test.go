package appliance

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	osimagev1 "github.com/corralhq/corral/api/osimage/v1"
	"github.com/corralhq/corral/images/osimage"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/inventory/bmc"
	"github.com/corralhq/corral/ipmi"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/testsupport/redfishtest"
)

// TestBMCRedfishFirmwareFromCatalog: the OS image catalog's image is
// handed to the Redfish test server under /os-images/<sha256> (served
// from the catalog as the boot HTTP server does); the BMC fetches those
// bytes and its task completes. Then the stored bytes change under the
// catalog: the update is refused before the BMC hears of it (no second
// SimpleUpdate), and so is virtual media from it. A bad image's task
// Exception is the error.
func TestBMCRedfishFirmwareFromCatalog(t *testing.T) {
	t.Parallel()
	r := newRedfishRig(t)
	ctx := context.Background()
	cat, err := osimage.New(osimage.Config{Store: mem.New(), Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	upload := func(name string, b []byte) string {
		sum := sha256.Sum256(b)
		h := &osimage.UploadHeader{Name: name, Sha256: hex.EncodeToString(sum[:]), Format: osimagev1.OSImageFormat_OS_IMAGE_FORMAT_RAW, SizeBytes: uint64(len(b))}
		if _, err := cat.Upload(ctx, h, bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
		return h.Sha256
	}
	fwSum := upload("bmc-2.0", redfishtest.FirmwarePackage("BMC", "2.0", 64<<10))
	upload("junk", []byte("not a firmware package"))
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		f, _, err := cat.Open(strings.TrimPrefix(req.URL.Path, "/os-images/"))
		if err != nil {
			http.NotFound(w, req)
			return
		}
		defer f.Close()
		_, _ = io.Copy(w, f)
	}))
	t.Cleanup(web.Close)
	ad := bmcAdapter{c: ipmi.New(ipmi.Config{Providers: []string{ipmi.RedfishProviderName}})}
	rf, err := bmc.NewRedfish(bmc.RedfishConfig{BMC: r.service(nil), Driver: ad, Images: catalogImages{s: &Server{osImages: cat}, base: web.URL}})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := rf.UpdateFirmware(ctx, &inventoryv1.UpdateFirmwareRequest{Name: "f1", Image: "bmc-2.0", Targets: []string{"BMC"}, WaitSeconds: 30})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetState() != "Completed" || resp.GetImageUri() != web.URL+"/os-images/"+fwSum || r.rf.Firmware()["BMC"] != "2.0" {
		t.Fatalf("update: %v; BMC at %s", resp, r.rf.Firmware()["BMC"])
	}
	if f := r.rf.Fetches(); len(f) != 1 || f[0].SHA256 != fwSum {
		t.Fatalf("the BMC fetched %+v, want sha256 %s", f, fwSum)
	}
	// A bad image: the task's Exception.
	if _, err := rf.UpdateFirmware(ctx, &inventoryv1.UpdateFirmwareRequest{Name: "f1", Image: "junk", WaitSeconds: 30}); err == nil ||
		!strings.Contains(err.Error(), "ended Exception") {
		t.Fatalf("a bad image: %v", err)
	}
	updates := len(r.rf.SimpleUpdates())
	// The stored bytes change under the catalog (a disk fault, a hand).
	f, _, err := cat.Open(fwSum)
	if err != nil {
		t.Fatal(err)
	}
	path := f.Name()
	f.Close()
	if err := os.WriteFile(path, redfishtest.FirmwarePackage("BMC", "6.66", 64<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = rf.UpdateFirmware(ctx, &inventoryv1.UpdateFirmwareRequest{Name: "f1", Image: "bmc-2.0", WaitSeconds: 30})
	if !errors.Is(err, apierr.ErrPrecondition) || !strings.Contains(err.Error(), "the catalog says "+fwSum) || !strings.Contains(err.Error(), "nothing was sent to the BMC") {
		t.Fatalf("changed bytes: want a refused precondition, got %v", err)
	}
	if _, err := rf.InsertMedia(ctx, &inventoryv1.InsertMediaRequest{Name: "f1", Image: "bmc-2.0"}); !errors.Is(err, apierr.ErrPrecondition) {
		t.Fatalf("media from changed bytes: %v", err)
	}
	if n := len(r.rf.SimpleUpdates()); n != updates {
		t.Fatalf("the BMC got %d SimpleUpdates after the refusal", n-updates)
	}
	if n := len(r.rf.Fetches()); n != 2 {
		t.Fatalf("the BMC fetched %d times, want 2 (the refused image never)", n)
	}
	if _, in := r.rf.Media(); in {
		t.Fatal("media inserted from refused bytes")
	}
}
