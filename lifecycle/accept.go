package lifecycle

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/inventory"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Accept starts installing a machine: disk is "auto" (or empty: the
// largest non-removable disk in its facts) or one of its fact disks
// ("/dev/vdb" or "vdb"). Only INVENTORIED and FAILED machines with facts
// are accepted (ErrPrecondition otherwise; ErrNotFound for an unknown
// one; ErrInvalid for a disk it does not have). The machine becomes
// INSTALLING with a new install id and boot intent discover, and the plan
// is sent at once when its discovery agent is connected, otherwise when it
// connects (with a BMC, the machine is power-cycled into discovery).
func (l *Lifecycle) Accept(ctx context.Context, name, disk string, wipe bool) (*inventoryv1.Machine, error) {
	now := timestamppb.New(l.now())
	id := newID()
	var path string
	m, err := l.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		var err error
		path, err = startInstall(m, id, disk, wipe, now)
		return err
	})
	if err != nil {
		return nil, err
	}
	l.accepted(m, id, path, wipe)
	switch {
	case l.sess.connected(name):
		if m.GetWipe().GetDisk() == "" {
			if sm := l.sendPlan(ctx, m); sm != nil {
				m = sm
			}
		}
	case hasBMC(m) && l.cfg.BMC != nil:
		if err := l.pxeCycle(ctx, m, "install: boot into discovery"); err == nil {
			l.armWatchdog(ctx, name, "accept")
		}
	default:
		l.event(m, "lifecycle", "waiting", "install plan waits for the discovery agent: network-boot the machine", nil)
	}
	return l.inv.GetMachine(ctx, name)
}

// startInstall checks that m may be accepted onto disk and makes it
// INSTALLING with install id; it returns the disk's path.
func startInstall(m *inventoryv1.Machine, id, disk string, wipe bool, now *timestamppb.Timestamp) (string, error) {
	if err := acceptable(m); err != nil {
		return "", err
	}
	path, err := resolveDisk(m, disk)
	if err != nil {
		return "", err
	}
	if err := inventory.Transition(m, inventory.EventAccepted); err != nil {
		return "", err
	}
	m.StateReason = ""
	m.NodeName = ""
	m.BootIntent = inventoryv1.BootIntent_BOOT_INTENT_DISCOVER
	m.Install = &inventoryv1.Install{InstallId: id, Disk: path, Wipe: wipe, StartedAt: now, UpdatedAt: now}
	return path, nil
}

func (l *Lifecycle) accepted(m *inventoryv1.Machine, id, path string, wipe bool) {
	l.event(m, "lifecycle", "accepted", fmt.Sprintf("install %s: disk %s wipe=%t", id, path, wipe), map[string]string{"install_id": id})
	l.log.Info("machine accepted", "machine", m.GetName(), "install_id", id, "disk", path, "wipe", wipe)
}

// acceptable checks, changing nothing, that m may be accepted: its state
// allows it (inventory.Transition, tried on a copy) and it has disks.
func acceptable(m *inventoryv1.Machine) error {
	name := m.GetName()
	if err := inventory.Transition(&inventoryv1.Machine{Name: name, State: m.GetState()}, inventory.EventAccepted); err != nil {
		return err
	}
	if len(m.GetFacts().GetDisks()) == 0 {
		return apierr.Preconditionf("machine %q reported no disks: nothing to install on", name)
	}
	return inventory.CommissionHold(m)
}

func diskPath(name string) string {
	return "/dev/" + strings.TrimPrefix(name, "/dev/")
}

// resolveDisk turns "auto"/"" or a device name into a fact disk's path.
func resolveDisk(m *inventoryv1.Machine, disk string) (string, error) {
	disks := m.GetFacts().GetDisks()
	disk = strings.TrimSpace(disk)
	if disk == "" || disk == "auto" {
		var best *inventoryv1.Facts_Disk
		for _, d := range disks {
			if d.GetRemovable() {
				continue
			}
			if best == nil || d.GetSizeBytes() > best.GetSizeBytes() ||
				(d.GetSizeBytes() == best.GetSizeBytes() && d.GetName() < best.GetName()) {
				best = d
			}
		}
		if best == nil {
			return "", apierr.Preconditionf("machine %q has no non-removable disk: name one with --disk", m.GetName())
		}
		return diskPath(best.GetName()), nil
	}
	want := diskPath(disk)
	var have []string
	for _, d := range disks {
		p := diskPath(d.GetName())
		if p == want {
			return p, nil
		}
		have = append(have, p)
	}
	sort.Strings(have)
	return "", apierr.Invalidf("disk %q is not one of machine %q's disks: %s", disk, m.GetName(), strings.Join(have, ", "))
}

// endpoint is the API endpoint for machine's install plan.
func (l *Lifecycle) endpoint(machine string) string {
	if l.cfg.Endpoint != nil {
		if ep := l.cfg.Endpoint(machine); ep != "" {
			return ep
		}
	}
	return l.sess.endpoint(machine)
}

// maxPlanEndpoints bounds the endpoints an install plan names.
const maxPlanEndpoints = 8

// endpoints is own followed by the other appliances' endpoints (deduplicated,
// at most maxPlanEndpoints): the order a node tries them in.
func (l *Lifecycle) endpoints(ctx context.Context, own string) []string {
	out := []string{own}
	if l.cfg.PeerEndpoints == nil {
		return out
	}
	for _, ep := range l.cfg.PeerEndpoints(ctx) {
		if len(out) == maxPlanEndpoints {
			break
		}
		if ep != "" && !slices.Contains(out, ep) {
			out = append(out, ep)
		}
	}
	return out
}

// sendPlan builds the install plan (no key material: the agent makes the
// node key and sends a certificate request, csr.go) and queues it on the
// machine's session, recording when and on which stream it was sent. It
// returns the updated machine, or nil when nothing was sent.
func (l *Lifecycle) sendPlan(ctx context.Context, m *inventoryv1.Machine) *inventoryv1.Machine {
	name := m.GetName()
	in := m.GetInstall()
	plan := &nodev1.InstallPlan{
		Disk: in.GetDisk(), Wipe: in.GetWipe(), Hostname: name, CaCertPem: string(l.cfg.Identity.CACertPEM()),
		ApplianceEndpoint: l.endpoint(name), InstallId: in.GetInstallId(), MachineName: name,
	}
	plan.ApplianceEndpoints = l.endpoints(ctx, plan.GetApplianceEndpoint())
	if err := l.sess.send(name, &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Install{Install: plan}}); err != nil {
		l.log.Info("install plan not sent: agent not connected", "machine", name, "install_id", in.GetInstallId())
		return nil
	}
	// The install's certificate request is signed only on this stream.
	l.streams.planSentNow(name, in.GetInstallId())
	l.kexecAhead(ctx, m, in.GetInstallId())
	now := timestamppb.New(l.now())
	sm, err := l.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		if m.GetInstall().GetInstallId() != in.GetInstallId() {
			return errSkip
		}
		m.Install.SentAt = now
		return nil
	})
	if err != nil {
		return nil
	}
	l.event(sm, "lifecycle", "plan-sent", fmt.Sprintf("install plan %s sent: disk %s wipe=%t endpoint %s", in.GetInstallId(), in.GetDisk(), in.GetWipe(), plan.GetApplianceEndpoint()),
		map[string]string{"install_id": in.GetInstallId()})
	l.log.Info("install plan sent", "machine", name, "install_id", in.GetInstallId(), "disk", in.GetDisk())
	return sm
}

// sendWipe queues a reprovision's pending wipe on the machine's session.
func (l *Lifecycle) sendWipe(ctx context.Context, m *inventoryv1.Machine) {
	name := m.GetName()
	wp := m.GetWipe()
	if err := l.sess.send(name, &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Wipe{Wipe: &nodev1.WipePlan{Disk: wp.GetDisk(), InstallId: wp.GetWipeId()}}}); err != nil {
		return
	}
	now := timestamppb.New(l.now())
	sm, err := l.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		if m.GetWipe().GetWipeId() != wp.GetWipeId() {
			return errSkip
		}
		m.Wipe.SentAt = now
		return nil
	})
	if err != nil {
		return
	}
	l.event(sm, "lifecycle", "wipe-sent", fmt.Sprintf("wipe %s of %s sent", wp.GetWipeId(), wp.GetDisk()), map[string]string{"install_id": wp.GetWipeId()})
}
