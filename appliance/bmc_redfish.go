package appliance

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	osimagev1 "github.com/corralhq/corral/api/osimage/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/inventory/bmc"
	"github.com/corralhq/corral/ipmi"
)

// Redfish day-2 work (BIOS, firmware, virtual media; inventory/bmc's
// Redfish): the ipmi Controller adapted, and the OS image catalog
// handing BMCs images through the boot HTTP server's /os-images/<sha256>.

// initBMCRedfish registers BmcRedfishService over bc; called by initBMC.
func (s *Server) initBMCRedfish(bc *bmc.Service, ad bmcAdapter) error {
	rf, err := bmc.NewRedfish(bmc.RedfishConfig{BMC: bc, Driver: ad, Images: catalogImages{s: s}})
	if err != nil {
		return err
	}
	bmc.RegisterRedfish(s.grpc, &bmc.RedfishServer{Redfish: rf})
	return nil
}

// catalogImages serves BMCs the OS image catalog's images.
type catalogImages struct {
	s *Server
	// base, in tests, replaces the URL images are served under.
	base string
}

// mediaBase is the URL a BMC reaches the boot HTTP server at:
// BMCConfig.MediaURL, or the boot HTTP server's own address when it
// listens on a specific one.
func (c catalogImages) mediaBase() (string, error) {
	if c.base != "" {
		return c.base, nil
	}
	if u := c.s.cfg.BMC.MediaURL; u != "" {
		return strings.TrimSuffix(u, "/"), nil
	}
	if a, ok := c.s.BootHTTPAddr().(*net.TCPAddr); ok && a != nil && !a.IP.IsUnspecified() {
		return "http://" + a.String(), nil
	}
	return "", apierr.Preconditionf("the appliance has no address a BMC fetches images from: set corrald serve --bmc-media-url (the boot HTTP server as BMCs reach it)")
}

func (c catalogImages) image(ctx context.Context, name string) (*osimagev1.OSImage, io.ReadCloser, error) {
	if c.s.osImages == nil {
		return nil, nil, apierr.Preconditionf("the OS image catalog is not running")
	}
	im, err := c.s.osImages.Get(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	if im.GetState() != osimagev1.OSImageState_OS_IMAGE_STATE_READY {
		return nil, nil, apierr.Preconditionf("OS image %s is %s, not READY", name, im.GetState())
	}
	f, _, err := c.s.osImages.Open(im.GetSha256())
	if err != nil {
		return nil, nil, err
	}
	return im, f, nil
}

// BMCImage hashes the stored bytes of image name and compares them with
// the catalog's SHA-256 before any URL is handed out: what the BMC
// fetches is what the catalog says.
func (c catalogImages) BMCImage(ctx context.Context, machine, name string) (string, string, error) {
	base, err := c.mediaBase()
	if err != nil {
		return "", "", err
	}
	im, f, err := c.image(ctx, name)
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", "", fmt.Errorf("reading OS image %s: %w", name, err)
	}
	got, want := hex.EncodeToString(h.Sum(nil)), im.GetSha256()
	if got != want {
		return "", "", apierr.Preconditionf("OS image %s: its stored bytes hash to sha256 %s, the catalog says %s: refused, nothing was sent to the BMC of %s",
			name, got, want, machine)
	}
	return base + "/os-images/" + want, want, nil
}

// toRedfishErr is toInventoryErr, and a BMC that answered only over
// IPMI is a failed precondition.
func toRedfishErr(err error) error {
	if errors.Is(err, ipmi.ErrNotRedfish) {
		return fmt.Errorf("%w: %w", apierr.ErrPrecondition, err)
	}
	return toInventoryErr(err)
}

func toBios(b ipmi.BIOS) *inventoryv1.Bios {
	out := &inventoryv1.Bios{Registry: b.Registry}
	for _, a := range b.Attributes {
		out.Attributes = append(out.Attributes, &inventoryv1.BiosAttribute{Name: a.Name, Type: a.Type, Current: a.Current, Pending: a.Pending,
			HasPending: a.HasPending, Allowed: a.Allowed, ReadOnly: a.ReadOnly, Lower: a.Lower, Upper: a.Upper, MaxLength: uint32(max(a.MaxLength, 0))})
	}
	return out
}

func (b bmcAdapter) BIOS(ctx context.Context, t bmc.Target) (*inventoryv1.Bios, bmc.Result, error) {
	bios, a, err := b.c.BIOS(ctx, toTarget(t))
	if err != nil {
		return nil, toResult(a), toRedfishErr(err)
	}
	return toBios(bios), toResult(a), nil
}

func (b bmcAdapter) SetBIOS(ctx context.Context, t bmc.Target, settings map[string]string) (*inventoryv1.Bios, bmc.Result, error) {
	bios, a, err := b.c.SetBIOS(ctx, toTarget(t), settings)
	if err != nil {
		return nil, toResult(a), toRedfishErr(err)
	}
	return toBios(bios), toResult(a), nil
}

func (b bmcAdapter) Firmware(ctx context.Context, t bmc.Target) ([]*inventoryv1.Firmware, bmc.Result, error) {
	fw, a, err := b.c.FirmwareInventory(ctx, toTarget(t))
	if err != nil {
		return nil, toResult(a), toRedfishErr(err)
	}
	out := make([]*inventoryv1.Firmware, 0, len(fw))
	for _, f := range fw {
		out = append(out, &inventoryv1.Firmware{Id: f.ID, Name: f.Name, Version: f.Version, Updateable: f.Updateable})
	}
	return out, toResult(a), nil
}

func (b bmcAdapter) UpdateFirmware(ctx context.Context, t bmc.Target, u bmc.FirmwareUpdate) (bmc.TaskProgress, bmc.Result, error) {
	up := ipmi.FirmwareUpdate{ImageURI: u.ImageURI, Targets: u.Targets, Wait: u.Wait}
	if u.Progress != nil {
		up.Progress = func(p ipmi.TaskProgress) {
			u.Progress(bmc.TaskProgress{Task: p.Task, State: p.State, Percent: p.Percent, Message: p.Message})
		}
	}
	p, a, err := b.c.UpdateFirmware(ctx, toTarget(t), up)
	return bmc.TaskProgress{Task: p.Task, State: p.State, Percent: p.Percent, Message: p.Message}, toResult(a), toRedfishErr(err)
}

func (b bmcAdapter) InsertMedia(ctx context.Context, t bmc.Target, imageURI string, boot bool) (bmc.Result, error) {
	_, a, err := b.c.InsertMedia(ctx, toTarget(t), imageURI, boot)
	return toResult(a), toRedfishErr(err)
}

func (b bmcAdapter) EjectMedia(ctx context.Context, t bmc.Target) (bmc.Result, error) {
	_, a, err := b.c.EjectMedia(ctx, toTarget(t))
	return toResult(a), toRedfishErr(err)
}
