package bmc

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

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/ipmi"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/testsupport/redfishtest"
)

// rfDriver is the ipmi package over Redfish, as cmd wires it (the
// appliance's adapter, reduced to what these tests use); an IPMI target
// answers power reads without a BMC.
type rfDriver struct{ c *ipmi.Controller }

func (d rfDriver) target(t Target) ipmi.Target {
	return ipmi.Target{Host: t.Host, Port: int(t.Port), Protocol: ipmi.ProtocolRedfish, Username: t.Username, Password: t.Password,
		Timeout: t.Timeout, TLSSHA256: t.TLSSHA256}
}

func rfResult(a ipmi.Answer) Result { return Result{Provider: a.Provider, TLSSHA256: a.TLSSHA256} }

func rfErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ipmi.ErrInvalid):
		return errors.Join(apierr.ErrInvalid, err)
	case errors.Is(err, ipmi.ErrNotRedfish):
		return errors.Join(apierr.ErrPrecondition, err)
	}
	return errors.Join(ErrFailed, err)
}

func (d rfDriver) PowerState(ctx context.Context, t Target) (inventoryv1.PowerState, Result, error) {
	if t.Protocol == inventoryv1.BmcProtocol_BMC_PROTOCOL_IPMI {
		return inventoryv1.PowerState_POWER_STATE_ON, Result{Provider: "native-ipmi"}, nil
	}
	_, a, err := d.c.PowerState(ctx, d.target(t))
	return inventoryv1.PowerState_POWER_STATE_OFF, rfResult(a), rfErr(err)
}

func (d rfDriver) SetPower(context.Context, Target, inventoryv1.PowerAction) (Result, error) {
	return Result{}, errors.New("not in these tests")
}

func (d rfDriver) SetBootDevice(context.Context, Target, inventory.BootRequest) (Result, error) {
	return Result{}, errors.New("not in these tests")
}

func (d rfDriver) BIOS(ctx context.Context, t Target) (*inventoryv1.Bios, Result, error) {
	b, a, err := d.c.BIOS(ctx, d.target(t))
	out := &inventoryv1.Bios{Registry: b.Registry}
	for _, x := range b.Attributes {
		out.Attributes = append(out.Attributes, &inventoryv1.BiosAttribute{Name: x.Name, Current: x.Current, Pending: x.Pending, HasPending: x.HasPending})
	}
	return out, rfResult(a), rfErr(err)
}

func (d rfDriver) SetBIOS(ctx context.Context, t Target, s map[string]string) (*inventoryv1.Bios, Result, error) {
	if _, a, err := d.c.SetBIOS(ctx, d.target(t), s); err != nil {
		return nil, rfResult(a), rfErr(err)
	}
	return d.BIOS(ctx, t)
}

func (d rfDriver) Firmware(ctx context.Context, t Target) ([]*inventoryv1.Firmware, Result, error) {
	fw, a, err := d.c.FirmwareInventory(ctx, d.target(t))
	var out []*inventoryv1.Firmware
	for _, f := range fw {
		out = append(out, &inventoryv1.Firmware{Id: f.ID, Version: f.Version, Updateable: f.Updateable})
	}
	return out, rfResult(a), rfErr(err)
}

func (d rfDriver) UpdateFirmware(ctx context.Context, t Target, u FirmwareUpdate) (TaskProgress, Result, error) {
	p, a, err := d.c.UpdateFirmware(ctx, d.target(t), ipmi.FirmwareUpdate{ImageURI: u.ImageURI, Targets: u.Targets, Wait: u.Wait,
		Poll: 10 * time.Millisecond, Progress: func(p ipmi.TaskProgress) { u.Progress(TaskProgress(p)) }})
	return TaskProgress(p), rfResult(a), rfErr(err)
}

func (d rfDriver) InsertMedia(ctx context.Context, t Target, uri string, boot bool) (Result, error) {
	_, a, err := d.c.InsertMedia(ctx, d.target(t), uri, boot)
	return rfResult(a), rfErr(err)
}

func (d rfDriver) EjectMedia(ctx context.Context, t Target) (Result, error) {
	_, a, err := d.c.EjectMedia(ctx, d.target(t))
	return rfResult(a), rfErr(err)
}

// testImages is a catalog: each image's bytes (served over HTTP) and the
// sum the catalog records for it.
type testImages struct {
	mu    sync.Mutex
	bytes map[string][]byte
	sums  map[string]string
	srv   *httptest.Server
}

func newTestImages(t *testing.T) *testImages {
	im := &testImages{bytes: map[string][]byte{}, sums: map[string]string{}}
	im.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		im.mu.Lock()
		defer im.mu.Unlock()
		for name, sum := range im.sums {
			if r.URL.Path == "/os-images/"+sum {
				_, _ = w.Write(im.bytes[name])
				return
			}
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(im.srv.Close)
	return im
}

func (im *testImages) add(name string, b []byte) {
	sum := sha256.Sum256(b)
	im.mu.Lock()
	im.bytes[name], im.sums[name] = b, hex.EncodeToString(sum[:])
	im.mu.Unlock()
}

func (im *testImages) BMCImage(_ context.Context, _, name string) (string, string, error) {
	im.mu.Lock()
	defer im.mu.Unlock()
	b, ok := im.bytes[name]
	if !ok {
		return "", "", apierr.NotFoundf("OS image %q", name)
	}
	sum := sha256.Sum256(b)
	if got := hex.EncodeToString(sum[:]); got != im.sums[name] {
		return "", "", apierr.Preconditionf("OS image %s hashes to %s, the catalog says %s", name, got, im.sums[name])
	}
	return im.srv.URL + "/os-images/" + im.sums[name], im.sums[name], nil
}

type redfishRig struct {
	inv *inventory.Inventory
	rf  *redfishtest.Server
	im  *testImages
	r   *Redfish
}

func newRedfishRig(t *testing.T) *redfishRig {
	t.Helper()
	st := mem.New()
	inv, err := inventory.New(inventory.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- inv.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	rf := redfishtest.Start(t, "root", "calvin", &redfishtest.MemMachine{})
	d := rfDriver{c: ipmi.New(ipmi.Config{Providers: []string{ipmi.RedfishProviderName}})}
	c, err := New(Config{Machines: inv, Events: inv, Store: st, Driver: d, Sealer: xorSealer{}, CallTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enroll(ctx, &inventoryv1.EnrollMachineRequest{Name: "r1", BmcAddress: rf.Addr(), BootMac: "52:54:00:00:00:a1",
		BmcProtocol: inventoryv1.BmcProtocol_BMC_PROTOCOL_REDFISH, BmcUsername: rf.User, BmcPassword: rf.Pass, BmcTlsSha256: rf.Fingerprint()}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enroll(ctx, &inventoryv1.EnrollMachineRequest{Name: "i1", BmcAddress: "10.0.0.7", BootMac: "52:54:00:00:00:a2",
		BmcProtocol: inventoryv1.BmcProtocol_BMC_PROTOCOL_IPMI, BmcUsername: "admin", BmcPassword: "pw"}); err != nil {
		t.Fatal(err)
	}
	im := newTestImages(t)
	r, err := NewRedfish(RedfishConfig{BMC: c, Driver: d, Images: im, UpdateWait: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return &redfishRig{inv: inv, rf: rf, im: im, r: r}
}

// timeline is the machine's timeline events, as "event: detail".
func (g *redfishRig) timeline(t *testing.T, name string) string {
	t.Helper()
	if err := g.inv.FlushTimeline(context.Background()); err != nil {
		t.Fatal(err)
	}
	evs, err := g.inv.Timeline(context.Background(), name, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, e := range evs {
		b.WriteString(e.GetEvent() + ": " + e.GetDetail() + "\n")
	}
	return b.String()
}

// TestRedfishBIOSService: BIOS settings through the service are pending
// and on the timeline; an unknown key is INVALID_ARGUMENT; an IPMI
// machine is a failed precondition saying so.
func TestRedfishBIOSService(t *testing.T) {
	t.Parallel()
	g := newRedfishRig(t)
	ctx := context.Background()
	b, err := g.r.SetBIOS(ctx, "r1", map[string]string{"BootMode": "LegacyBios"})
	if err != nil {
		t.Fatal(err)
	}
	var pending bool
	for _, a := range b.GetAttributes() {
		pending = pending || (a.GetName() == "BootMode" && a.GetHasPending() && a.GetPending() == "LegacyBios" && a.GetCurrent() == "Uefi")
	}
	if !pending {
		t.Fatalf("BootMode not pending: %v", b)
	}
	if tl := g.timeline(t, "r1"); !strings.Contains(tl, "bios-set: BIOS settings pending until the next boot: BootMode=LegacyBios") {
		t.Fatalf("timeline:\n%s", tl)
	}
	if _, err := g.r.SetBIOS(ctx, "r1", map[string]string{"Turbo": "on"}); !errors.Is(err, apierr.ErrInvalid) || !strings.Contains(err.Error(), `unknown BIOS attribute "Turbo"`) {
		t.Fatalf("unknown key: %v", err)
	}
	for _, f := range []func() error{
		func() error { _, err := g.r.GetBIOS(ctx, "i1"); return err },
		func() error { _, err := g.r.SetBIOS(ctx, "i1", map[string]string{"BootMode": "Uefi"}); return err },
		func() error { _, err := g.r.ListFirmware(ctx, "i1"); return err },
		func() error { _, err := g.r.EjectMedia(ctx, "i1"); return err },
	} {
		if err := f(); !errors.Is(err, apierr.ErrPrecondition) || !strings.Contains(err.Error(), "BMC is IPMI;") {
			t.Fatalf("an IPMI machine: want a failed precondition, got %v", err)
		}
	}
	if err := func() error { _, err := g.r.GetBIOS(ctx, "i1"); return err }(); !strings.Contains(err.Error(), "BMC is IPMI; BIOS over Redfish needs a Redfish BMC") {
		t.Fatalf("message: %v", err)
	}
}

// TestRedfishFirmwareService: an update from the catalog is fetched by
// the BMC, followed to Completed with progress on the timeline; an image
// whose bytes no longer match the catalog's sum, or a sum the request
// names that differs, is refused and the BMC receives no SimpleUpdate; a
// bad image's task Exception is a clear error.
func TestRedfishFirmwareService(t *testing.T) {
	t.Parallel()
	g := newRedfishRig(t)
	ctx := context.Background()
	g.im.add("bmc-1.20", redfishtest.FirmwarePackage("BMC", "1.20", 1024))
	resp, err := g.r.UpdateFirmware(ctx, &inventoryv1.UpdateFirmwareRequest{Name: "r1", Image: "bmc-1.20", Targets: []string{"BMC"}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetState() != "Completed" || g.rf.Firmware()["BMC"] != "1.20" || !strings.HasSuffix(resp.GetImageUri(), "/os-images/"+resp.GetImageSha256()) {
		t.Fatalf("update: %v, BMC now %s", resp, g.rf.Firmware()["BMC"])
	}
	if f := g.rf.Fetches(); len(f) != 1 || f[0].SHA256 != resp.GetImageSha256() {
		t.Fatalf("the BMC fetched %+v", f)
	}
	tl := g.timeline(t, "r1")
	for _, want := range []string{"firmware-update: ", "firmware-progress: task /redfish/v1/TaskService/Tasks/1 Running", "firmware-updated: "} {
		if !strings.Contains(tl, want) {
			t.Fatalf("timeline lacks %q:\n%s", want, tl)
		}
	}
	// Hash mismatches: nothing reaches the BMC.
	if _, err := g.r.UpdateFirmware(ctx, &inventoryv1.UpdateFirmwareRequest{Name: "r1", Image: "bmc-1.20", Sha256: strings.Repeat("0", 64)}); !errors.Is(err, apierr.ErrPrecondition) {
		t.Fatalf("a sum that is not the catalog's: %v", err)
	}
	g.im.mu.Lock()
	g.im.bytes["bmc-1.20"] = redfishtest.FirmwarePackage("BMC", "6.66", 1024) // the stored bytes changed under the catalog
	g.im.mu.Unlock()
	if _, err := g.r.UpdateFirmware(ctx, &inventoryv1.UpdateFirmwareRequest{Name: "r1", Image: "bmc-1.20"}); !errors.Is(err, apierr.ErrPrecondition) || !strings.Contains(err.Error(), "hashes to") {
		t.Fatalf("a changed image: %v", err)
	}
	if n := len(g.rf.SimpleUpdates()); n != 1 {
		t.Fatalf("%d SimpleUpdates reached the BMC, want only the first", n)
	}
	if tl := g.timeline(t, "r1"); strings.Count(tl, "firmware-refused: ") != 2 {
		t.Fatalf("refusals not on the timeline:\n%s", tl)
	}
	// A bad image: the task's Exception.
	g.im.add("junk", []byte("this is not firmware"))
	if _, err := g.r.UpdateFirmware(ctx, &inventoryv1.UpdateFirmwareRequest{Name: "r1", Image: "junk"}); err == nil ||
		!strings.Contains(err.Error(), "ended Exception") || !strings.Contains(err.Error(), "not a firmware package") {
		t.Fatalf("a bad image: %v", err)
	}
	if tl := g.timeline(t, "r1"); !strings.Contains(tl, "firmware-failed: ") {
		t.Fatalf("timeline:\n%s", tl)
	}
}

// TestRedfishMediaService: an ISO from the catalog is inserted (the BMC
// fetches it) with a one-time boot from Cd, then ejected.
func TestRedfishMediaService(t *testing.T) {
	t.Parallel()
	g := newRedfishRig(t)
	ctx := context.Background()
	g.im.add("rescue.iso", []byte("ISO 9660 rescue"))
	resp, err := g.r.InsertMedia(ctx, &inventoryv1.InsertMediaRequest{Name: "r1", Image: "rescue.iso", Boot: true})
	if err != nil {
		t.Fatal(err)
	}
	if img, in := g.rf.Media(); img != resp.GetImageUri() || !in || g.rf.Boot()["BootSourceOverrideTarget"] != "Cd" {
		t.Fatalf("after insert: %q %v %v", img, in, g.rf.Boot())
	}
	if _, err := g.r.EjectMedia(ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	if _, in := g.rf.Media(); in {
		t.Fatal("still inserted")
	}
	tl := g.timeline(t, "r1")
	if !strings.Contains(tl, "media-inserted: ") || !strings.Contains(tl, "next boot (once) from it") || !strings.Contains(tl, "media-ejected: ") {
		t.Fatalf("timeline:\n%s", tl)
	}
}
