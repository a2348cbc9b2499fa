package ipmi

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/redfish"
)

// Virtual media is a manager's VirtualMedia slot that takes a CD or DVD:
// InsertMedia with the image's URL (the BMC fetches it from the
// appliance), EjectMedia; booting from it is the system's boot override
// to Cd, once.

// Media is what a virtual CD slot holds.
type Media struct {
	Slot     string // the slot's URI
	Image    string
	Inserted bool
}

// cdSlot finds the first manager's first virtual media slot that takes
// a CD or DVD.
func cdSlot(cl *gofish.APIClient) (*redfish.VirtualMedia, error) {
	managers, err := cl.Service.Managers()
	if err != nil {
		return nil, err
	}
	for _, m := range managers {
		vms, err := m.VirtualMedia()
		if err != nil {
			return nil, err
		}
		slices.SortFunc(vms, func(a, b *redfish.VirtualMedia) int { return strings.Compare(a.ODataID, b.ODataID) })
		for _, vm := range vms {
			if slices.Contains(vm.MediaTypes, redfish.CDMediaType) || slices.Contains(vm.MediaTypes, redfish.DVDMediaType) {
				return vm, nil
			}
		}
	}
	return nil, fmt.Errorf("%w: the BMC has no virtual CD or DVD slot", ErrFailed)
}

// InsertMedia puts image (an http(s) URL) in the BMC's virtual CD
// (ejecting what it held first) and, when boot, sets the next boot to
// it, once.
func (c *Controller) InsertMedia(ctx context.Context, t Target, image string, boot bool) (Media, Answer, error) {
	if !strings.HasPrefix(image, "http://") && !strings.HasPrefix(image, "https://") {
		return Media{}, Answer{}, fmt.Errorf("%w: image URL %q: want http:// or https://", ErrInvalid, image)
	}
	var out Media
	a, err := c.doRedfish(ctx, t, "media-insert", "virtual media", func(cl *gofish.APIClient) error {
		vm, err := cdSlot(cl)
		if err != nil {
			return err
		}
		if vm.Inserted {
			if err := vm.EjectMedia(); err != nil {
				return fmt.Errorf("%w: ejecting %s first: %w", ErrFailed, vm.Image, err)
			}
		}
		if err := vm.InsertMediaConfig(redfish.VirtualMediaConfig{Image: image, Inserted: true, WriteProtected: true}); err != nil {
			return fmt.Errorf("%w: the BMC refused the media: %w", ErrFailed, err)
		}
		out = Media{Slot: vm.ODataID, Image: image, Inserted: true}
		if !boot {
			return nil
		}
		sys, err := firstSystem(cl)
		if err != nil {
			return err
		}
		// Only the two properties: gofish's Boot would send every field.
		resp, err := cl.Patch(sys.ODataID, map[string]any{"Boot": map[string]string{
			"BootSourceOverrideTarget": string(redfish.CdBootSourceOverrideTarget), "BootSourceOverrideEnabled": string(redfish.OnceBootSourceOverrideEnabled)}})
		if err != nil {
			return fmt.Errorf("%w: the media is in, but the boot override to Cd failed: %w", ErrFailed, err)
		}
		resp.Body.Close()
		return nil
	})
	return out, a, err
}

// EjectMedia empties the BMC's virtual CD (nothing to do when empty).
func (c *Controller) EjectMedia(ctx context.Context, t Target) (Media, Answer, error) {
	var out Media
	a, err := c.doRedfish(ctx, t, "media-eject", "virtual media", func(cl *gofish.APIClient) error {
		vm, err := cdSlot(cl)
		if err != nil {
			return err
		}
		out = Media{Slot: vm.ODataID, Image: vm.Image}
		if !vm.Inserted {
			return nil
		}
		if err := vm.EjectMedia(); err != nil {
			return fmt.Errorf("%w: %w", ErrFailed, err)
		}
		return nil
	})
	return out, a, err
}
