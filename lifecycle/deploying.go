package lifecycle

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/lifecycle/nocloud"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// A deploy once started (deploy.go): its plan sent and re-sent, the
// agent's progress, the timeouts, the address pin's release, and the
// index the phone-home handler finds a deployment's machine by.

// sendDeploy renders m's DeployPlan with a fresh phone-home token, records
// the token's hash and when it was sent, and queues it on the machine's
// session. It returns the updated machine, or nil when nothing was sent.
func (l *Lifecycle) sendDeploy(ctx context.Context, m *inventoryv1.Machine) *inventoryv1.Machine {
	name := m.GetName()
	d := m.GetDeployment()
	id := d.GetDeploymentId()
	if !deploying(m, id) {
		return nil
	}
	plan, sum, err := l.deployPlan(ctx, m)
	if err != nil {
		if errors.Is(err, apierr.ErrNotFound) || errors.Is(err, apierr.ErrPrecondition) || errors.Is(err, errImageChanged) {
			l.deployFail(ctx, name, id, DeployFailed, "deploy plan: "+err.Error())
		} else {
			l.log.Warn("deploy plan not rendered: tried again on the next pass", "machine", name, "deployment_id", id, "err", err)
		}
		return nil
	}
	now := timestamppb.New(l.now())
	seen := d.GetSentAt()
	sm, err := l.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		if !deploying(m, id) {
			return errSkip
		}
		// Sent by another path (the reconciler and Deploy, or onConnect)
		// since m was read: that plan's token stands.
		if sent := m.GetDeployment().GetSentAt(); (sent == nil) != (seen == nil) || (sent != nil && !sent.AsTime().Equal(seen.AsTime())) {
			return errSkip
		}
		m.Deployment.PhoneHomeSha256 = sum
		m.Deployment.SentAt = now
		m.StateReason = "deploying " + m.GetDeployment().GetOsImage() + ": " + sentWordDeploy(true)
		return nil
	})
	if err != nil {
		if !errors.Is(err, errSkip) {
			l.log.Warn("deploy plan not recorded", "machine", name, "deployment_id", id, "err", err)
		}
		return nil
	}
	if err := l.sess.send(name, &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Deploy{Deploy: plan}}); err != nil {
		l.log.Info("deploy plan not sent: agent not connected", "machine", name, "deployment_id", id)
		return nil
	}
	l.event(sm, "lifecycle", "deploy-plan-sent", fmt.Sprintf("deploy plan %s sent: image %s from %s onto %s", id, d.GetOsImage(), plan.GetImageUrl(), d.GetDisk()),
		map[string]string{"install_id": id})
	l.log.Info("deploy plan sent", "machine", name, "deployment_id", id)
	return sm
}

// deploySeed is deployment d's cloud-init seed on machine m, phoning
// home to url.
func deploySeed(m *inventoryv1.Machine, d *inventoryv1.Deployment, url string) nocloud.Seed {
	seed := nocloud.Seed{
		InstanceID: d.GetDeploymentId(), Hostname: d.GetHostname(), SSHKeys: d.GetSshKeys(), UserData: d.GetUserData(),
		MAC: m.GetBootMac(), PhoneHomeURL: url,
	}
	if p, err := netip.ParsePrefix(d.GetAddress()); err == nil {
		seed.Address = p
	}
	if g, err := netip.ParseAddr(d.GetGateway()); err == nil {
		seed.Gateway = g
	}
	for _, s := range d.GetDns() {
		if a, err := netip.ParseAddr(s); err == nil {
			seed.DNS = append(seed.DNS, a)
		}
	}
	return seed
}

var errImageChanged = errors.New("the OS image changed since the deploy started")

// deployPlan renders m's DeployPlan and returns it with its phone-home
// token's hash.
func (l *Lifecycle) deployPlan(ctx context.Context, m *inventoryv1.Machine) (*nodev1.DeployPlan, string, error) {
	d := m.GetDeployment()
	svc := l.deployServices()
	if svc.Images == nil || svc.BootBase == nil {
		return nil, "", errors.New("this appliance serves no OS images to machines")
	}
	img, err := svc.Images.Raw(ctx, d.GetOsImage())
	if err != nil {
		return nil, "", fmt.Errorf("OS image %q: %w", d.GetOsImage(), err)
	}
	if img.SHA256 != d.GetImageSha256() {
		return nil, "", fmt.Errorf("OS image %q: %w (sha256 %s, was %s)", d.GetOsImage(), errImageChanged, shortSum(img.SHA256), shortSum(d.GetImageSha256()))
	}
	host, _, err := net.SplitHostPort(l.sess.endpoint(m.GetName()))
	if err != nil {
		host = ""
	}
	base := strings.TrimSuffix(svc.BootBase(host), "/")
	token, sum := newPhoneHomeToken()
	seed := deploySeed(m, d, base+PhoneHomePath+d.GetDeploymentId()+"/"+token)
	md, ud, vd, nc, err := seed.Files()
	if err != nil {
		return nil, "", fmt.Errorf("cloud-init seed: %w", err)
	}
	return &nodev1.DeployPlan{
		DeploymentId: d.GetDeploymentId(), ImageUrl: base + img.Path, ImageSize: img.Size, ImageSha256: img.SHA256,
		BlockMap: img.Map, BlockMapSha256: img.MapSHA256, Layout: d.GetLayout(),
		SeedMetaData: md, SeedUserData: ud, SeedVendorData: vd, SeedNetworkConfig: nc,
		// A machine with a BMC is power-cycled by the appliance once its
		// next boot is the disk, persistently (a warm reboot by the agent
		// would keep the firmware's network-first order); one without
		// reboots itself.
		Reboot: !(hasBMC(m) && l.cfg.BMC != nil),
	}, sum, nil
}

// deployFail makes machine name FAILED with reason when it is still
// DEPLOYING deployment id (a CAS); outcome is counted.
func (l *Lifecycle) deployFail(ctx context.Context, name, id, outcome, reason string) bool {
	fm, err := l.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		if m.GetState() != inventoryv1.Machine_DEPLOYING || m.GetDeployment().GetDeploymentId() != id {
			return errSkip
		}
		if err := inventory.Transition(m, inventory.EventDeployFailed); err != nil {
			return err
		}
		m.StateReason = reason
		m.Deployment.Error = reason
		m.Deployment.UpdatedAt = timestamppb.New(l.now())
		m.Watchdog = nil
		return nil
	})
	if err != nil {
		if !errors.Is(err, errSkip) {
			l.log.Warn("deploy failure not recorded", "machine", name, "deployment_id", id, "err", err)
		}
		return false
	}
	l.deployOutcome(outcome)
	l.event(fm, "lifecycle", "deploy-failed", reason, map[string]string{"install_id": id})
	l.log.Warn("deploy failed", "machine", name, "deployment_id", id, "reason", reason)
	return true
}

// deployOnConnect sends a DEPLOYING machine's plan to its agent that just
// connected; it reports whether m is DEPLOYING (nothing else to send it).
func (l *Lifecycle) deployOnConnect(ctx context.Context, m *inventoryv1.Machine) bool {
	if m.GetState() != inventoryv1.Machine_DEPLOYING {
		return false
	}
	l.sendDeploy(ctx, m)
	return true
}

// deployDeliver re-sends a DEPLOYING machine's plan to its agent connected
// here since when the plan has not gone on that session; it reports
// whether m is DEPLOYING.
func (l *Lifecycle) deployDeliver(ctx context.Context, m *inventoryv1.Machine, since time.Time) bool {
	if m.GetState() != inventoryv1.Machine_DEPLOYING {
		return false
	}
	d := m.GetDeployment()
	if d.GetWrittenAt() == nil && (d.GetSentAt() == nil || d.GetSentAt().AsTime().Before(since)) {
		l.sendDeploy(ctx, m)
	}
	return true
}

// deployProgress applies a progress message of machine's current
// deployment (p.InstallId is the deployment id) in one mutation: the step
// and detail; an error makes it FAILED; "written" (done) makes boot intent
// LOCAL, starts the boot timeout and, with a BMC, sets the next boot to
// the disk. It reports whether p was a deployment's (handled).
func (l *Lifecycle) deployProgress(ctx context.Context, machine string, p *nodev1.Progress) bool {
	id := p.GetInstallId()
	if !isDeploymentID(id) {
		return false // an install's or a wipe's: no read spent here
	}
	now := timestamppb.New(l.now())
	var mine, failed, written bool
	var reason string
	um, err := l.inv.UpdateMachine(ctx, machine, func(m *inventoryv1.Machine) error {
		mine, failed, written, reason = false, false, false, ""
		d := m.GetDeployment()
		if d.GetDeploymentId() != id {
			return errSkip
		}
		mine = true
		if !deploying(m, id) {
			return errSkip // late or repeated: the deploy has moved on
		}
		if p.GetStep() != "" {
			d.Step = p.GetStep()
		}
		d.Detail = p.GetDetail()
		d.UpdatedAt = now
		switch {
		case p.GetError() != "":
			failed = true
			reason = fmt.Sprintf("deploy %s: %s", cmp.Or(d.GetStep(), "?"), p.GetError())
			if err := inventory.Transition(m, inventory.EventDeployFailed); err != nil {
				return err
			}
			d.Error = p.GetError()
			m.StateReason = reason
		case p.GetDone():
			written = true
			d.WrittenAt = now
			m.BootIntent = inventoryv1.BootIntent_BOOT_INTENT_LOCAL
			m.Watchdog = nil
			m.StateReason = "deploying " + d.GetOsImage() + ": written, booting the OS from its disk; waiting for it to phone home"
		}
		return nil
	})
	if err != nil {
		if !errors.Is(err, errSkip) {
			l.log.Warn("deploy progress not recorded", "machine", machine, "deployment_id", id, "err", err)
		} else if mine {
			l.log.Info("stale deploy progress ignored", "machine", machine, "deployment_id", id)
		}
		return mine
	}
	attrs := map[string]string{"install_id": id}
	switch {
	case failed:
		l.deployOutcome(DeployFailed)
		l.event(um, "lifecycle", "deploy-failed", reason, attrs)
		l.log.Warn("deploy failed", "machine", machine, "deployment_id", id, "reason", reason)
	case written:
		l.event(um, "lifecycle", "deploy-written", fmt.Sprintf("deploy %s written: boot intent local; the OS has %s to phone home", id, l.cfg.DeployBootTimeout), attrs)
		l.log.Info("deploy written: booting the OS", "machine", machine, "deployment_id", id)
		if hasBMC(um) && l.cfg.BMC != nil {
			req := inventory.BootRequest{Device: inventoryv1.BootDevice_BOOT_DEVICE_DISK, Persistent: true, EFI: usesESP(um.GetDeployment().GetLayout())}
			if err := l.cfg.BMC.SetBootDevice(ctx, machine, req); err != nil {
				l.event(um, "lifecycle", "boot-device-failed", "next boot disk (persistent) through the BMC: "+err.Error(), attrs)
			} else {
				l.event(um, "lifecycle", "boot-device", "next boot disk (persistent) through the BMC", attrs)
			}
			// The plan left the reboot to the appliance: a power cycle
			// makes the firmware read the new boot order.
			if _, err := l.cfg.BMC.SetPower(ctx, machine, inventoryv1.PowerAction_POWER_ACTION_CYCLE); err != nil {
				l.event(um, "lifecycle", "power-cycle-failed", "deploy written: "+err.Error()+"; power-cycle the machine by hand", attrs)
			} else {
				l.event(um, "lifecycle", "power-cycle", "deploy written: power cycled through the BMC into its disk", attrs)
			}
		}
	}
	return true
}

// deployTimedOut fails a DEPLOYING machine whose agent reported nothing
// for DeployTimeout while writing, or whose OS did not phone home within
// DeployBootTimeout of written. It reports whether it failed it.
func (l *Lifecycle) deployTimedOut(ctx context.Context, m *inventoryv1.Machine) bool {
	if m.GetState() != inventoryv1.Machine_DEPLOYING {
		return false
	}
	d := m.GetDeployment()
	reason, ok := l.deployExpiry(d)
	if !ok {
		return false
	}
	id := d.GetDeploymentId()
	fm, err := l.inv.UpdateMachine(ctx, m.GetName(), func(m *inventoryv1.Machine) error {
		if m.GetState() != inventoryv1.Machine_DEPLOYING || m.GetDeployment().GetDeploymentId() != id {
			return errSkip
		}
		r, ok := l.deployExpiry(m.GetDeployment())
		if !ok {
			return errSkip
		}
		if err := inventory.Transition(m, inventory.EventDeployFailed); err != nil {
			return err
		}
		reason = r
		m.StateReason = r
		m.Deployment.Error = r
		m.Watchdog = nil
		return nil
	})
	if err != nil {
		if !errors.Is(err, errSkip) {
			l.log.Warn("deploy timeout not recorded", "machine", m.GetName(), "err", err)
		}
		return false
	}
	l.deployOutcome(DeployTimedOut)
	l.event(fm, "lifecycle", "deploy-failed", reason, map[string]string{"install_id": id})
	l.log.Warn("deploy timed out", "machine", m.GetName(), "deployment_id", id, "reason", reason)
	return true
}

// deployExpiry says whether deployment d is past its timeout, and why.
func (l *Lifecycle) deployExpiry(d *inventoryv1.Deployment) (string, bool) {
	now := l.now()
	if w := d.GetWrittenAt(); w != nil {
		if now.Sub(w.AsTime()) <= l.cfg.DeployBootTimeout {
			return "", false
		}
		return fmt.Sprintf("deploy boot timeout: written at %s, the OS did not phone home within %s",
			w.AsTime().UTC().Format(time.RFC3339), l.cfg.DeployBootTimeout), true
	}
	last := d.GetUpdatedAt()
	if last == nil {
		last = d.GetStartedAt()
	}
	if last == nil || now.Sub(last.AsTime()) <= l.cfg.DeployTimeout {
		return "", false
	}
	switch {
	case d.GetSentAt() == nil:
		return fmt.Sprintf("deploy timeout: no progress within %s (the plan was never delivered: no discovery agent connected)", l.cfg.DeployTimeout), true
	case d.GetStep() == "":
		return fmt.Sprintf("deploy timeout: no progress within %s of the plan", l.cfg.DeployTimeout), true
	default:
		return fmt.Sprintf("deploy timeout: no progress within %s after step %s", l.cfg.DeployTimeout, d.GetStep()), true
	}
}

// UnpinDeployment drops the address pin of m's deployment, if any: the
// release of an allocated machine calls it (the address may then go to
// another client). A machine without a deployment, or an appliance
// without DHCP in full mode, has nothing to drop.
func (l *Lifecycle) UnpinDeployment(ctx context.Context, m *inventoryv1.Machine) error {
	d := m.GetDeployment()
	a := l.deployServices().Addresses
	if a == nil || d.GetAddress() == "" || d.GetDeploymentId() == "" || m.GetBootMac() == "" {
		return nil
	}
	if err := a.Unpin(ctx, m.GetBootMac(), deployHolder(d.GetDeploymentId())); err != nil {
		return fmt.Errorf("machine %q: unpin the address of deployment %s: %w", m.GetName(), d.GetDeploymentId(), err)
	}
	return nil
}

// deployIndex maps deployment ids to machine names for the phone-home
// handler; a miss falls back to a scan of the DEPLOYING machines. Bounded:
// past maxIndexed ids it starts again empty.
type deployIndex struct {
	mu  sync.Mutex
	ids map[string]string
}

const maxIndexed = 4096

func (x *deployIndex) put(id, machine string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.ids == nil || len(x.ids) >= maxIndexed {
		x.ids = map[string]string{}
	}
	x.ids[id] = machine
}

func (x *deployIndex) get(id string) (string, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	m, ok := x.ids[id]
	return m, ok
}
