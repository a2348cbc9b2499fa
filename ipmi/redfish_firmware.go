package ipmi

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/redfish"
)

// A Redfish BMC's firmware is its UpdateService's FirmwareInventory
// (one SoftwareInventory a component: Version, Updateable). An update is
// the SimpleUpdate action with an ImageURI the BMC downloads itself;
// the BMC answers with a Task (202 Accepted, Location naming it, or the
// Task in the body), which is followed until its TaskState is final
// (Completed; Exception, Killed or Cancelled are failures), bounded by
// FirmwareUpdate.Wait.

// Firmware is one component's firmware.
type Firmware struct {
	ID         string
	Name       string
	Version    string
	Updateable bool
	// URI is the inventory member (a SimpleUpdate target).
	URI string
}

// TaskProgress is one change seen in an update's task.
type TaskProgress struct {
	Task    string // its URI
	State   string // New, Starting, Running, Completed, Exception ...
	Percent int
	// Message is the task's newest message.
	Message string
}

// FirmwareUpdate says what to update.
type FirmwareUpdate struct {
	// ImageURI is where the BMC downloads the image (the appliance's
	// HTTP server).
	ImageURI string
	// Targets are inventory members (an Id such as BMC, or a URI) to
	// apply it to; empty: the BMC decides from the image.
	Targets []string
	// Wait bounds following the task (default 30 minutes); Poll is the
	// time between reads of it (default 2s).
	Wait, Poll time.Duration
	// Progress hears every change of the task (from the calling
	// goroutine).
	Progress func(TaskProgress)
}

// FirmwareInventory lists the BMC's firmware components.
func (c *Controller) FirmwareInventory(ctx context.Context, t Target) ([]Firmware, Answer, error) {
	var out []Firmware
	a, err := c.doRedfish(ctx, t, "firmware-list", "firmware", func(cl *gofish.APIClient) error {
		var err error
		out, err = redfishFirmware(cl)
		return err
	})
	return out, a, err
}

func redfishFirmware(cl *gofish.APIClient) ([]Firmware, error) {
	us, err := cl.Service.UpdateService()
	if err != nil {
		return nil, err
	}
	inv, err := us.FirmwareInventories()
	if err != nil {
		return nil, err
	}
	out := make([]Firmware, 0, len(inv))
	for _, f := range inv {
		out = append(out, Firmware{ID: f.ID, Name: f.Name, Version: f.Version, Updateable: f.Updateable, URI: f.ODataID})
	}
	slices.SortFunc(out, func(a, b Firmware) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// UpdateFirmware starts a SimpleUpdate of u.ImageURI and follows its
// task to the end. Targets are checked against the inventory first (an
// unknown or non-updateable one is ErrInvalid, nothing sent). A task
// that ends other than Completed is ErrFailed with its messages; one
// still running after u.Wait is ErrFailed too (the BMC carries on).
// The call's deadline is t's (or the default) plus u.Wait.
func (c *Controller) UpdateFirmware(ctx context.Context, t Target, u FirmwareUpdate) (TaskProgress, Answer, error) {
	if !strings.HasPrefix(u.ImageURI, "http://") && !strings.HasPrefix(u.ImageURI, "https://") {
		return TaskProgress{}, Answer{}, fmt.Errorf("%w: image URI %q: want http:// or https://", ErrInvalid, u.ImageURI)
	}
	u.Wait = cmp.Or(u.Wait, 30*time.Minute)
	u.Poll = cmp.Or(u.Poll, 2*time.Second)
	t.Timeout = cmp.Or(t.Timeout, c.cfg.CallTimeout) + u.Wait
	var last TaskProgress
	a, err := c.doRedfish(ctx, t, "firmware-update", "firmware update", func(cl *gofish.APIClient) error {
		targets, err := firmwareTargets(cl, u.Targets)
		if err != nil {
			return err
		}
		uri, err := simpleUpdate(cl, u.ImageURI, targets)
		if err != nil {
			return err
		}
		last, err = followTask(ctx, cl, uri, u)
		return err
	})
	return last, a, err
}

// firmwareTargets turns Ids into inventory URIs, refusing unknown and
// non-updateable components.
func firmwareTargets(cl *gofish.APIClient, want []string) ([]string, error) {
	if len(want) == 0 {
		return nil, nil
	}
	inv, err := redfishFirmware(cl)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, w := range want {
		i := slices.IndexFunc(inv, func(f Firmware) bool { return f.ID == w || f.URI == w })
		if i < 0 {
			ids := make([]string, 0, len(inv))
			for _, f := range inv {
				ids = append(ids, f.ID)
			}
			return nil, fmt.Errorf("%w: no firmware component %q (the BMC has %s); nothing was sent", ErrInvalid, w, strings.Join(ids, ", "))
		}
		if !inv[i].Updateable {
			return nil, fmt.Errorf("%w: firmware component %q is not updateable; nothing was sent", ErrInvalid, w)
		}
		out = append(out, inv[i].URI)
	}
	return out, nil
}

// simpleUpdate posts the action and returns the task's URI ("" when the
// BMC did the update at once and named no task).
func simpleUpdate(cl *gofish.APIClient, image string, targets []string) (string, error) {
	us, err := cl.Service.UpdateService()
	if err != nil {
		return "", err
	}
	var raw struct {
		Actions struct {
			SimpleUpdate struct {
				Target string `json:"target"`
			} `json:"#UpdateService.SimpleUpdate"`
		}
	}
	if err := getJSON(cl, us.ODataID, &raw); err != nil {
		return "", err
	}
	if raw.Actions.SimpleUpdate.Target == "" {
		return "", fmt.Errorf("%w: the BMC's UpdateService has no SimpleUpdate action", ErrFailed)
	}
	params := &redfish.SimpleUpdateParameters{ImageURI: image, Targets: targets}
	if strings.HasPrefix(image, "http://") {
		params.TransferProtocol = redfish.HTTPTransferProtocolType
	} else {
		params.TransferProtocol = redfish.HTTPSTransferProtocolType
	}
	resp, err := cl.Post(raw.Actions.SimpleUpdate.Target, params)
	if err != nil {
		return "", fmt.Errorf("%w: the BMC refused the update: %w", ErrFailed, err)
	}
	defer resp.Body.Close()
	if loc := resp.Header.Get("Location"); loc != "" {
		return loc, nil
	}
	var body struct {
		ID string `json:"@odata.id"`
	}
	_ = json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&body)
	return body.ID, nil
}

// followTask reads the task every u.Poll until it is final, telling
// u.Progress of each change.
func followTask(ctx context.Context, cl *gofish.APIClient, uri string, u FirmwareUpdate) (TaskProgress, error) {
	if uri == "" {
		p := TaskProgress{State: string(redfish.CompletedTaskState), Percent: 100, Message: "the BMC named no task"}
		if u.Progress != nil {
			u.Progress(p)
		}
		return p, nil
	}
	wctx, cancel := context.WithTimeout(ctx, u.Wait)
	defer cancel()
	var last TaskProgress
	for {
		task, err := redfish.GetTask(cl, uri)
		if err != nil {
			return last, err
		}
		p := TaskProgress{Task: uri, State: string(task.TaskState), Percent: int(task.PercentComplete)}
		if n := len(task.Messages); n > 0 {
			p.Message = task.Messages[n-1].Message
		}
		if p != last && u.Progress != nil {
			u.Progress(p)
		}
		last = p
		switch task.TaskState {
		case redfish.CompletedTaskState:
			return p, nil
		case redfish.ExceptionTaskState, redfish.KilledTaskState, redfish.CancelledTaskState:
			var msgs []string
			for _, m := range task.Messages {
				msgs = append(msgs, m.Message)
			}
			return p, fmt.Errorf("%w: firmware update task %s ended %s (status %s): %s", ErrFailed, uri, task.TaskState, task.TaskStatus,
				cmp.Or(strings.Join(msgs, " "), "no message"))
		default:
			// New, Starting, Running, Pending, Suspended ...: not final.
		}
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return p, ctx.Err()
			}
			return p, fmt.Errorf("%w: firmware update task %s still %s (%d%%) after %s; the BMC carries on with it", ErrFailed, uri, p.State, p.Percent, u.Wait)
		case <-time.After(u.Poll):
		}
	}
}
