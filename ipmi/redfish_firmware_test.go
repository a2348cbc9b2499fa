package ipmi_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/ipmi"
	"github.com/corralhq/corral/testsupport/redfishtest"
)

// files serves name -> bytes over plain HTTP on loopback, as the
// appliance serves images to BMCs.
func files(t *testing.T, m map[string][]byte) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, ok := m[strings.TrimPrefix(r.URL.Path, "/")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(b)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestRedfishFirmware: the inventory is listed; a SimpleUpdate's image
// is really fetched by the BMC, its task followed to Completed with
// progress seen, and the version changes; a bad image ends the task in
// Exception, surfaced as ErrFailed with the BMC's message; an unknown or
// non-updateable target is refused before anything is sent.
func TestRedfishFirmware(t *testing.T) {
	t.Parallel()
	rf := redfishtest.Start(t, "root", "calvin", &redfishtest.MemMachine{})
	c := ipmi.New(ipmi.Config{})
	ctx := context.Background()
	tg := redfishTarget(rf)
	inv, _, err := c.FirmwareInventory(ctx, tg)
	if err != nil || len(inv) != 3 || inv[1].ID != "BMC" || inv[1].Version != "1.00" || !inv[1].Updateable || inv[2].Updateable {
		t.Fatalf("inventory: %+v, %v", inv, err)
	}
	good := redfishtest.FirmwarePackage("BMC", "1.10", 4096)
	srv := files(t, map[string][]byte{"good.bin": good, "junk.bin": []byte("not firmware at all")})
	var mu sync.Mutex
	var seen []ipmi.TaskProgress
	p, _, err := c.UpdateFirmware(ctx, tg, ipmi.FirmwareUpdate{ImageURI: srv.URL + "/good.bin", Targets: []string{"BMC"}, Poll: 10 * time.Millisecond,
		Progress: func(p ipmi.TaskProgress) { mu.Lock(); seen = append(seen, p); mu.Unlock() }})
	if err != nil || p.State != "Completed" || p.Percent != 100 {
		t.Fatalf("update: %+v, %v", p, err)
	}
	if len(seen) < 3 {
		t.Fatalf("progress seen: %+v", seen)
	}
	if v := rf.Firmware()["BMC"]; v != "1.10" {
		t.Fatalf("BMC version after the update: %q", v)
	}
	sum := sha256.Sum256(good)
	if f := rf.Fetches(); len(f) != 1 || f[0].SHA256 != hex.EncodeToString(sum[:]) || f[0].Err != "" {
		t.Fatalf("what the BMC fetched: %+v", f)
	}
	if u := rf.SimpleUpdates(); len(u) != 1 || u[0]["ImageURI"] != srv.URL+"/good.bin" {
		t.Fatalf("SimpleUpdate: %+v", u)
	}
	// A bad image: the task ends in Exception.
	_, _, err = c.UpdateFirmware(ctx, tg, ipmi.FirmwareUpdate{ImageURI: srv.URL + "/junk.bin", Poll: 10 * time.Millisecond})
	if !errors.Is(err, ipmi.ErrFailed) || !strings.Contains(err.Error(), "Exception") || !strings.Contains(err.Error(), "not a firmware package") {
		t.Fatalf("a bad image: want ErrFailed with the task's Exception, got %v", err)
	}
	// Targets checked before anything is sent.
	for _, bad := range []string{"NIC9", "CPLD"} {
		_, _, err := c.UpdateFirmware(ctx, tg, ipmi.FirmwareUpdate{ImageURI: srv.URL + "/good.bin", Targets: []string{bad}})
		if !errors.Is(err, ipmi.ErrInvalid) {
			t.Fatalf("target %s: want ErrInvalid, got %v", bad, err)
		}
	}
	if n := len(rf.SimpleUpdates()); n != 2 {
		t.Fatalf("%d SimpleUpdates reached the BMC, want 2", n)
	}
}

// TestRedfishMedia: InsertMedia makes the BMC fetch the ISO and, with
// boot, sets a one-time boot from Cd; inserting again replaces it;
// EjectMedia empties the slot; a URL the BMC cannot fetch is refused.
func TestRedfishMedia(t *testing.T) {
	t.Parallel()
	rf := redfishtest.Start(t, "root", "calvin", &redfishtest.MemMachine{})
	c := ipmi.New(ipmi.Config{})
	ctx := context.Background()
	tg := redfishTarget(rf)
	srv := files(t, map[string][]byte{"a.iso": []byte("ISO A"), "b.iso": []byte("ISO B")})
	if _, _, err := c.InsertMedia(ctx, tg, srv.URL+"/a.iso", true); err != nil {
		t.Fatal(err)
	}
	if img, in := rf.Media(); img != srv.URL+"/a.iso" || !in {
		t.Fatalf("after insert: %q %v", img, in)
	}
	if b := rf.Boot(); b["BootSourceOverrideTarget"] != "Cd" || b["BootSourceOverrideEnabled"] != "Once" {
		t.Fatalf("boot override: %v", b)
	}
	if _, _, err := c.InsertMedia(ctx, tg, srv.URL+"/b.iso", false); err != nil {
		t.Fatalf("insert again: %v", err)
	}
	if img, _ := rf.Media(); img != srv.URL+"/b.iso" {
		t.Fatalf("after the second insert: %q", img)
	}
	if f := rf.Fetches(); len(f) != 2 || f[1].Bytes != 5 {
		t.Fatalf("fetches: %+v", f)
	}
	if _, _, err := c.EjectMedia(ctx, tg); err != nil {
		t.Fatal(err)
	}
	if _, in := rf.Media(); in {
		t.Fatal("still inserted after eject")
	}
	if _, _, err := c.InsertMedia(ctx, tg, srv.URL+"/missing.iso", false); !errors.Is(err, ipmi.ErrFailed) || !strings.Contains(err.Error(), "could not be fetched") {
		t.Fatalf("an ISO the BMC cannot fetch: %v", err)
	}
}
