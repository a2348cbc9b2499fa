// Redfish day-2 work: BIOS settings, firmware inventory and updates,
// virtual media. Only a Redfish BMC offers them; a machine whose BMC is
// IPMI is refused before anything is opened.

package bmc

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
)

// TaskProgress is one change of a BMC task (a firmware update's).
type TaskProgress struct {
	Task    string
	State   string
	Percent int
	Message string
}

// FirmwareUpdate is what the BMC is told to fetch and apply.
type FirmwareUpdate struct {
	ImageURI string
	Targets  []string
	// Wait bounds following the task; Progress hears its changes.
	Wait     time.Duration
	Progress func(TaskProgress)
}

// RedfishDriver is what Redfish day-2 work needs of the BMCs; cmd wires
// the ipmi package to it. Errors are classified as Driver's are; a BMC
// that turns out to be IPMI is apierr.ErrPrecondition.
type RedfishDriver interface {
	BIOS(ctx context.Context, t Target) (*inventoryv1.Bios, Result, error)
	SetBIOS(ctx context.Context, t Target, settings map[string]string) (*inventoryv1.Bios, Result, error)
	Firmware(ctx context.Context, t Target) ([]*inventoryv1.Firmware, Result, error)
	UpdateFirmware(ctx context.Context, t Target, u FirmwareUpdate) (TaskProgress, Result, error)
	InsertMedia(ctx context.Context, t Target, imageURI string, boot bool) (Result, error)
	EjectMedia(ctx context.Context, t Target) (Result, error)
}

// Images hands BMCs images from the appliance's catalog.
type Images interface {
	// BMCImage checks the stored bytes of catalog image name against
	// the SHA-256 the catalog records for it and returns the URL a BMC
	// fetches them from (for machine) and that sum. A mismatch, or an
	// image not ready, is an error and no URL.
	BMCImage(ctx context.Context, machine, name string) (uri, sha256 string, err error)
}

// RedfishConfig configures Redfish day-2 work. BMC, Driver and Images
// are required.
type RedfishConfig struct {
	BMC    *Service
	Driver RedfishDriver
	Images Images
	// UpdateWait bounds following a firmware update's task when the
	// request names no bound (default 30 minutes).
	UpdateWait time.Duration
}

// Redfish reads and applies BIOS settings, lists and updates firmware
// and drives virtual media through machines' Redfish BMCs, each step on
// the machine's timeline.
type Redfish struct {
	cfg RedfishConfig
	bmc *Service
}

// NewRedfish validates cfg.
func NewRedfish(cfg RedfishConfig) (*Redfish, error) {
	if cfg.BMC == nil || cfg.Driver == nil || cfg.Images == nil {
		return nil, errors.New("bmc: RedfishConfig.BMC, Driver and Images are required")
	}
	if cfg.UpdateWait <= 0 {
		cfg.UpdateWait = 30 * time.Minute
	}
	return &Redfish{cfg: cfg, bmc: cfg.BMC}, nil
}

// redfishTarget is the machine's BMC target, refused when it is IPMI.
func (r *Redfish) redfishTarget(ctx context.Context, name, what string) (*inventoryv1.Machine, Target, error) {
	m, t, err := r.bmc.target(ctx, name)
	if err != nil {
		return m, t, err
	}
	if t.Protocol == inventoryv1.BmcProtocol_BMC_PROTOCOL_IPMI ||
		(t.Protocol == inventoryv1.BmcProtocol_BMC_PROTOCOL_AUTO && m.GetBmc().GetProvider() != "" && m.GetBmc().GetProvider() != RedfishProviderName) {
		return m, t, apierr.Preconditionf("machine %s: BMC is IPMI; %s over Redfish needs a Redfish BMC", name, what)
	}
	return m, t, nil
}

// GetBIOS reads a machine's BIOS attributes, current and pending.
func (r *Redfish) GetBIOS(ctx context.Context, name string) (*inventoryv1.Bios, error) {
	m, t, err := r.redfishTarget(ctx, name, "BIOS")
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, t.Timeout)
	b, res, err := r.cfg.Driver.BIOS(cctx, t)
	cancel()
	r.bmc.noteCertificate(ctx, m, res)
	if err != nil {
		return nil, fmt.Errorf("machine %s: BIOS: %w", name, err)
	}
	return b, nil
}

// SetBIOS applies settings to a machine's BIOS, pending until its next
// boot. The driver checks them against the BMC's registry first; a
// refusal sends nothing.
func (r *Redfish) SetBIOS(ctx context.Context, name string, settings map[string]string) (*inventoryv1.Bios, error) {
	if len(settings) == 0 {
		return nil, apierr.Invalidf("no BIOS settings given: want KEY=VALUE")
	}
	for k := range settings {
		if k == "" {
			return nil, apierr.Invalidf("a BIOS setting with no name")
		}
	}
	m, t, err := r.redfishTarget(ctx, name, "BIOS")
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, t.Timeout)
	b, res, err := r.cfg.Driver.SetBIOS(cctx, t, settings)
	cancel()
	r.bmc.noteCertificate(ctx, m, res)
	kv := make([]string, 0, len(settings))
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		kv = append(kv, k+"="+settings[k])
	}
	if err != nil {
		r.bmc.event(m, "bios-failed", fmt.Sprintf("BIOS settings %s refused: %v", strings.Join(kv, " "), err), res)
		return nil, fmt.Errorf("machine %s: BIOS settings: %w", name, err)
	}
	r.bmc.event(m, "bios-set", fmt.Sprintf("BIOS settings pending until the next boot: %s", strings.Join(kv, " ")), res)
	r.bmc.log.Info("BIOS settings pending", "machine", name, "settings", strings.Join(kv, " "))
	return b, nil
}

// ListFirmware reads a machine's firmware inventory.
func (r *Redfish) ListFirmware(ctx context.Context, name string) ([]*inventoryv1.Firmware, error) {
	m, t, err := r.redfishTarget(ctx, name, "firmware")
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, t.Timeout)
	fw, res, err := r.cfg.Driver.Firmware(cctx, t)
	cancel()
	r.bmc.noteCertificate(ctx, m, res)
	if err != nil {
		return nil, fmt.Errorf("machine %s: firmware: %w", name, err)
	}
	return fw, nil
}

// UpdateFirmware updates a machine's firmware from catalog image req.Image:
// the image's bytes are checked against the catalog's SHA-256 (and
// req.Sha256 when given) before the BMC is told anything; then the BMC
// fetches it from the appliance (SimpleUpdate) and its task is followed
// to the end, each change on the timeline.
func (r *Redfish) UpdateFirmware(ctx context.Context, req *inventoryv1.UpdateFirmwareRequest) (*inventoryv1.UpdateFirmwareResponse, error) {
	name := req.GetName()
	if req.GetImage() == "" {
		return nil, apierr.Invalidf("no firmware image named: want an image of the OS image catalog")
	}
	m, t, err := r.redfishTarget(ctx, name, "firmware update")
	if err != nil {
		return nil, err
	}
	uri, sum, err := r.cfg.Images.BMCImage(ctx, name, req.GetImage())
	if err != nil {
		r.bmc.event(m, "firmware-refused", fmt.Sprintf("firmware image %s refused, nothing sent to the BMC: %v", req.GetImage(), err), Result{})
		return nil, fmt.Errorf("machine %s: firmware image %s: %w", name, req.GetImage(), err)
	}
	if want := strings.ToLower(req.GetSha256()); want != "" && want != sum {
		err := apierr.Preconditionf("the catalog's sha256 of image %s is %s, not %s: nothing was sent to the BMC", req.GetImage(), sum, want)
		r.bmc.event(m, "firmware-refused", err.Error(), Result{})
		return nil, fmt.Errorf("machine %s: %w", name, err)
	}
	wait := r.cfg.UpdateWait
	if s := req.GetWaitSeconds(); s > 0 {
		wait = time.Duration(s) * time.Second
	}
	r.bmc.event(m, "firmware-update", fmt.Sprintf("firmware update from image %s (sha256 %s) targets [%s]: the BMC fetches %s",
		req.GetImage(), sum, strings.Join(req.GetTargets(), " "), uri), Result{})
	u := FirmwareUpdate{ImageURI: uri, Targets: req.GetTargets(), Wait: wait, Progress: func(p TaskProgress) {
		r.bmc.event(m, "firmware-progress", fmt.Sprintf("task %s %s %d%%: %s", p.Task, p.State, p.Percent, p.Message), Result{})
	}}
	cctx, cancel := context.WithTimeout(ctx, t.Timeout+wait)
	p, res, err := r.cfg.Driver.UpdateFirmware(cctx, t, u)
	cancel()
	r.bmc.noteCertificate(ctx, m, res)
	if err != nil {
		r.bmc.event(m, "firmware-failed", fmt.Sprintf("firmware update from image %s failed: %v", req.GetImage(), err), res)
		return nil, fmt.Errorf("machine %s: firmware update: %w", name, err)
	}
	r.bmc.event(m, "firmware-updated", fmt.Sprintf("firmware update from image %s: task %s %s", req.GetImage(), p.Task, p.State), res)
	r.bmc.log.Info("firmware updated", "machine", name, "image", req.GetImage(), "sha256", sum, "task", p.Task)
	out := &inventoryv1.UpdateFirmwareResponse{Task: p.Task, State: p.State, Percent: uint32(max(p.Percent, 0)), Message: p.Message,
		ImageUri: uri, ImageSha256: sum}
	// The inventory afterwards; the update stands whatever this read says.
	cctx, cancel = context.WithTimeout(ctx, t.Timeout)
	out.Firmware, _, _ = r.cfg.Driver.Firmware(cctx, t)
	cancel()
	return out, nil
}

// InsertMedia puts catalog image name in the machine's virtual CD (its
// bytes checked against the catalog first) and, when boot, sets the
// next boot to it.
func (r *Redfish) InsertMedia(ctx context.Context, req *inventoryv1.InsertMediaRequest) (*inventoryv1.InsertMediaResponse, error) {
	name := req.GetName()
	if req.GetImage() == "" {
		return nil, apierr.Invalidf("no image named: want an ISO of the OS image catalog")
	}
	m, t, err := r.redfishTarget(ctx, name, "virtual media")
	if err != nil {
		return nil, err
	}
	uri, sum, err := r.cfg.Images.BMCImage(ctx, name, req.GetImage())
	if err != nil {
		return nil, fmt.Errorf("machine %s: image %s: %w", name, req.GetImage(), err)
	}
	cctx, cancel := context.WithTimeout(ctx, t.Timeout)
	res, err := r.cfg.Driver.InsertMedia(cctx, t, uri, req.GetBoot())
	cancel()
	r.bmc.noteCertificate(ctx, m, res)
	if err != nil {
		r.bmc.event(m, "media-failed", fmt.Sprintf("virtual media %s failed: %v", req.GetImage(), err), res)
		return nil, fmt.Errorf("machine %s: virtual media: %w", name, err)
	}
	detail := fmt.Sprintf("virtual CD holds image %s (sha256 %s) from %s", req.GetImage(), sum, uri)
	if req.GetBoot() {
		detail += "; next boot (once) from it"
	}
	r.bmc.event(m, "media-inserted", detail, res)
	return &inventoryv1.InsertMediaResponse{ImageUri: uri, Inserted: true, Boot: req.GetBoot()}, nil
}

// EjectMedia empties the machine's virtual CD.
func (r *Redfish) EjectMedia(ctx context.Context, name string) (*inventoryv1.EjectMediaResponse, error) {
	m, t, err := r.redfishTarget(ctx, name, "virtual media")
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, t.Timeout)
	res, err := r.cfg.Driver.EjectMedia(cctx, t)
	cancel()
	r.bmc.noteCertificate(ctx, m, res)
	if err != nil {
		r.bmc.event(m, "media-failed", fmt.Sprintf("virtual media eject failed: %v", err), res)
		return nil, fmt.Errorf("machine %s: virtual media: %w", name, err)
	}
	r.bmc.event(m, "media-ejected", "virtual CD emptied", res)
	return &inventoryv1.EjectMediaResponse{}, nil
}
