package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Kexec into the hypervisor image (docs/architecture.md, "The walk", Install).
//
// When an install is done and the agent that ran it named the kexec
// capability at Register, the machine is not rebooted: the agent gets a
// KexecPlan on its session — the hypervisor boot rendered by the code
// that renders the hypervisor iPXE script (Config.Kexec) — fetches the
// kernel and initrd, checks them against the sizes and SHA-256 the plan
// carries and boots them with kexec: no firmware POST, no PXE, no second
// discovery of the machine. The boot watchdog is armed by "kexec" with
// Config.KexecTimeout: a node not READY by then, a plan that cannot be
// rendered or sent, or a kexec error the agent reports make the machine
// reboot the old way at once (BMC next boot PXE + power cycle, else the
// Reboot command), with the reason on its timeline, and the ordinary boot
// watchdog takes over from there. An agent that named no capability (one
// from before kexec) gets the old reboot. With Config.KexecAhead (off by
// default), an agent that also named kexec-prefetch gets the same plan
// right behind the install plan (kexecAhead): it fetches, verifies and
// loads the image while it installs, and the plan after the done only
// makes it reboot.

// DefaultKexecTimeout is how long a kexec'd machine has to bring its node
// READY before it is rebooted the old way.
const DefaultKexecTimeout = 120 * time.Second

// ArmedByKexec is the boot watchdog's ArmedBy while a kexec into the
// hypervisor image is under way (its bound is Config.KexecTimeout).
const ArmedByKexec = "kexec"

// armedByInstall is the boot watchdog's ArmedBy for the reboot after an
// install (and the fallback from a kexec).
const armedByInstall = "install reboot"

// kexecStep is the progress step of a kexec the agent reports.
const kexecStep = "kexec"

// HypervisorBoot renders a machine's hypervisor boot for a kexec;
// appliance wires boot/http's rendering (the one of the hypervisor
// iPXE script) to it.
type HypervisorBoot interface {
	// KexecPlan returns the hypervisor kernel and initrd (http URLs on
	// host, where the machine's agent reached this appliance — "" when
	// that is unknown: the boot interface's address —, their sizes and
	// SHA-256 from the catalog) and the kernel command line the
	// hypervisor iPXE script would give machine (boot MAC mac). It fails
	// when the catalog has no hypervisor image. arch is the machine's
	// architecture as its facts report it ("arm64" picks the arm64
	// hypervisor image; anything else amd64's).
	KexecPlan(ctx context.Context, machine, mac, host, arch string) (*nodev1.KexecPlan, error)
}

// SetKexec sets Config.Kexec after New: appliance makes the boot
// servers, which render the hypervisor boot, after the lifecycle. Safe
// for concurrent use.
func (l *Lifecycle) SetKexec(hb HypervisorBoot) {
	l.kexecMu.Lock()
	defer l.kexecMu.Unlock()
	l.cfg.Kexec = hb
}

// hypervisorBoot is Config.Kexec (nil: no kexec).
func (l *Lifecycle) hypervisorBoot() HypervisorBoot {
	l.kexecMu.Lock()
	defer l.kexecMu.Unlock()
	return l.cfg.Kexec
}

// kexecTimeout is Config.KexecTimeout's bound; 0 when kexec is off.
func (l *Lifecycle) kexecTimeout() time.Duration {
	if l.hypervisorBoot() == nil || l.cfg.KexecTimeout < 0 {
		return 0
	}
	return l.cfg.KexecTimeout
}

// kexecPossible reports whether machine's install reboot may be a kexec:
// kexec is on and the machine's open session is an identified agent that
// named the capability.
func (l *Lifecycle) kexecPossible(machine string) bool {
	return l.kexecTimeout() > 0 && l.sess.canKexec(machine)
}

// installReboot follows the "done" of install id on m (whose watchdog the
// same mutation armed): a kexec when it was armed for one, else the
// reboot. A kexec that cannot be rendered or sent falls back at once.
func (l *Lifecycle) installReboot(ctx context.Context, m *inventoryv1.Machine, id string) {
	if m.GetWatchdog().GetArmedBy() != ArmedByKexec {
		l.reboot(ctx, m, armedByInstall)
		return
	}
	name := m.GetName()
	plan, err := l.kexecPlan(ctx, m)
	if err != nil {
		l.kexecFallback(ctx, name, id, m.GetWatchdog().GetArmedAt(), "kexec-failed", "kexec not possible: "+err.Error())
		return
	}
	plan.InstallId = id
	// The entry is queued before the plan goes out, so it precedes
	// whatever the agent does with the plan on the timeline; a send that
	// fails is followed by its kexec-failed entry.
	timeout := l.kexecTimeout()
	l.event(m, "lifecycle", "kexec", fmt.Sprintf("install %s done: sending the agent its kexec plan to boot the hypervisor image (no firmware reboot); "+
		"rebooted the old way if node %s is not READY within %s", id, name, timeout), map[string]string{
		"install_id": id, "kernel": plan.GetKernelUrl(), "initrd": plan.GetInitrdUrl(),
		"kernel_sha256": plan.GetKernelSha256(), "initrd_sha256": plan.GetInitrdSha256(),
		"cmdline_bytes": fmt.Sprint(len(plan.GetCmdline())), "timeout": timeout.String(),
	})
	if err := l.sess.send(name, &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Kexec{Kexec: plan}}); err != nil {
		l.kexecFallback(ctx, name, id, m.GetWatchdog().GetArmedAt(), "kexec-failed", "kexec not possible: "+err.Error())
		return
	}
	l.log.Info("install done: kexec into the hypervisor image", "machine", name, "install_id", id, "timeout", timeout)
}

// kexecAhead sends m's KexecPlan for install id right behind the install
// plan, to an agent that named the kexec-prefetch capability: it fetches,
// verifies and loads the hypervisor image while the install runs, and
// reboots into it only on the plan installReboot sends after the done.
// Best effort: a plan not rendered or not sent here changes nothing (the
// one after the done decides, and falls back).
func (l *Lifecycle) kexecAhead(ctx context.Context, m *inventoryv1.Machine, id string) {
	name := m.GetName()
	if !l.cfg.KexecAhead || l.kexecTimeout() <= 0 || !l.sess.canPrefetch(name) {
		return
	}
	plan, err := l.kexecPlan(ctx, m)
	if err == nil {
		plan.InstallId = id
		err = l.sess.send(name, &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Kexec{Kexec: plan}})
	}
	if err != nil {
		l.log.Info("kexec plan not sent ahead of the install", "machine", name, "install_id", id, "err", err)
		return
	}
	l.log.Info("kexec plan sent ahead: the agent loads the hypervisor image while it installs", "machine", name, "install_id", id)
}

// kexecPlan renders m's hypervisor boot for its agent, on the address the
// agent reached this appliance at ("" when unknown).
func (l *Lifecycle) kexecPlan(ctx context.Context, m *inventoryv1.Machine) (*nodev1.KexecPlan, error) {
	host, _, err := net.SplitHostPort(l.sess.endpoint(m.GetName()))
	if err != nil {
		host = ""
	}
	mac := m.GetBootMac()
	if mac == "" {
		return nil, errors.New("the machine has no boot MAC")
	}
	hb := l.hypervisorBoot()
	if hb == nil {
		return nil, errors.New("kexec is turned off on this appliance")
	}
	return hb.KexecPlan(ctx, m.GetName(), mac, host, m.GetFacts().GetArchitecture())
}

// onKexecProgress handles the agent's "kexec" progress of install id: an
// error (download, hash, syscall, refusal) makes the machine reboot the
// old way at once, when its watchdog is still armed for that kexec.
func (l *Lifecycle) onKexecProgress(ctx context.Context, machine string, p *nodev1.Progress) {
	if p.GetError() == "" {
		return
	}
	m, err := l.inv.GetMachine(ctx, machine)
	if err != nil {
		return
	}
	w := m.GetWatchdog()
	if m.GetState() != inventoryv1.Machine_INSTALLING || m.GetInstall().GetInstallId() != p.GetInstallId() || !m.GetInstall().GetDone() || w.GetArmedBy() != ArmedByKexec {
		l.log.Info("stale kexec error ignored", "machine", machine, "install_id", p.GetInstallId(), "err", p.GetError())
		return
	}
	l.kexecFallback(ctx, machine, p.GetInstallId(), w.GetArmedAt(), "kexec-failed", "the agent's kexec failed: "+p.GetError())
}

// kexecExpired acts on m's watchdog armed by a kexec: past KexecTimeout
// (or with kexec turned off since) the machine is rebooted the old way.
// It reports whether it acted.
func (l *Lifecycle) kexecExpired(ctx context.Context, m *inventoryv1.Machine) bool {
	w := m.GetWatchdog()
	timeout := l.kexecTimeout()
	if timeout > 0 && l.now().Sub(w.GetArmedAt().AsTime()) < timeout {
		return false
	}
	why := fmt.Sprintf("node %s not READY within %s of the kexec", m.GetName(), timeout)
	if timeout == 0 {
		why = "kexec is turned off on this appliance"
	}
	return l.kexecFallback(ctx, m.GetName(), m.GetInstall().GetInstallId(), w.GetArmedAt(), "kexec-timeout", why)
}

// kexecFallback re-arms machine's watchdog, still armed at armedAt by the
// kexec of install id, for an ordinary install reboot (a CAS: two
// reconcilers, or the agent's error and the timeout, never reboot it
// twice), records why on the timeline, and reboots it. It reports
// whether it did.
func (l *Lifecycle) kexecFallback(ctx context.Context, name, id string, armedAt *timestamppb.Timestamp, event, why string) bool {
	now := timestamppb.New(l.now())
	m, err := l.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		w := m.GetWatchdog()
		if m.GetState() != inventoryv1.Machine_INSTALLING || m.GetInstall().GetInstallId() != id || w.GetArmedBy() != ArmedByKexec ||
			armedAt == nil || !w.GetArmedAt().AsTime().Equal(armedAt.AsTime()) {
			return errSkip
		}
		m.Watchdog = &inventoryv1.BootWatchdog{ArmedAt: now, ArmedBy: armedByInstall}
		m.StateReason = "installed: rebooting into the hypervisor (" + why + ")"
		return nil
	})
	if err != nil {
		if !errors.Is(err, errSkip) {
			l.log.Warn("kexec fallback not recorded", "machine", name, "err", err)
		}
		return false
	}
	l.event(m, "lifecycle", event, why+": rebooting the old way", map[string]string{"install_id": id})
	l.log.Warn("kexec into the hypervisor image abandoned: rebooting the old way", "machine", name, "install_id", id, "reason", why)
	l.reboot(ctx, m, "install reboot after "+event)
	return true
}
