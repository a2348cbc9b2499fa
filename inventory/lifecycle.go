package inventory

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Lifecycle defaults (DESIGN.md §4).
const (
	DefaultReconcileInterval  = 10 * time.Second
	DefaultInstallTimeout     = 15 * time.Minute
	DefaultBootWatchdog       = 300 * time.Second
	DefaultBootWatchdogCycles = 3
)

// NodeIdentity issues node identities for install plans; cmd wires the
// appliance CA to it.
type NodeIdentity interface {
	// IssueNode returns a fresh certificate and key for node name.
	IssueNode(name string) (certPEM, keyPEM []byte, err error)
	// CACertPEM is the CA the node trusts.
	CACertPEM() []byte
}

// Nodes is what the lifecycle needs from the node pool (inventory/pool).
// GetNode returns an error wrapping ErrNotFound for an unknown node;
// DeleteNode refuses a node that holds reservations.
type Nodes interface {
	GetNode(ctx context.Context, name string) (*poolv1.Node, error)
	DeleteNode(ctx context.Context, name string) error
}

// NodeWatcher is optionally implemented by Nodes: names of nodes that
// changed, until ctx ends.
type NodeWatcher interface {
	WatchNodes(ctx context.Context) (<-chan string, error)
}

// LifecycleConfig configures the install workflow and the lifecycle
// timers. Zero durations take the defaults.
type LifecycleConfig struct {
	Nodes    Nodes
	Identity NodeIdentity
	// BMC, when set, reboots and power-cycles machines with an enrolled
	// BMC (PXE next).
	BMC *BMCControl
	// Endpoint is the appliance API endpoint (host:port) put in install
	// plans; nil or "" uses the address the machine's agent dialled.
	Endpoint func(machine string) string
	Logger   *slog.Logger
	// Interval is how often the reconciler runs.
	Interval time.Duration
	// InstallTimeout fails an INSTALLING machine without progress.
	InstallTimeout time.Duration
	// BootWatchdog is how long a machine powered on by the appliance has
	// to register; negative disables the watchdog.
	BootWatchdog time.Duration
	// BootWatchdogCycles is how many power cycles the watchdog makes
	// before the machine is FAILED.
	BootWatchdogCycles int
	// AutoAccept accepts (disk auto, no wipe) machines that become
	// INVENTORIED and match every AutoAcceptSelectors selector.
	AutoAccept          bool
	AutoAcceptSelectors []string
}

// Lifecycle drives machines from INVENTORIED to DEPLOYED (accept, install
// plan delivery, progress, reboot into the hypervisor), back
// (reprovision), in and out of MAINTENANCE, and runs the install timeout
// and boot watchdog. Its methods are safe for concurrent use; every
// machine change is a compare-and-swap that re-checks the state it acts on.
type Lifecycle struct {
	inv  *Inventory
	cfg  LifecycleConfig
	log  *slog.Logger
	sels []selector
}

// NewLifecycle validates cfg and attaches a lifecycle controller to i
// (its session and registration hooks call it). Run runs its reconciler.
func (i *Inventory) NewLifecycle(cfg LifecycleConfig) (*Lifecycle, error) {
	if cfg.Nodes == nil || cfg.Identity == nil {
		return nil, errors.New("inventory: LifecycleConfig.Nodes and Identity are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = i.log
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultReconcileInterval
	}
	if cfg.InstallTimeout <= 0 {
		cfg.InstallTimeout = DefaultInstallTimeout
	}
	if cfg.BootWatchdog == 0 {
		cfg.BootWatchdog = DefaultBootWatchdog
	}
	if cfg.BootWatchdogCycles <= 0 {
		cfg.BootWatchdogCycles = DefaultBootWatchdogCycles
	}
	l := &Lifecycle{inv: i, cfg: cfg, log: cfg.Logger}
	for _, raw := range cfg.AutoAcceptSelectors {
		sel, err := parseSelector(raw)
		if err != nil {
			return nil, fmt.Errorf("auto-accept selector: %w", err)
		}
		l.sels = append(l.sels, sel)
	}
	i.lc.Store(l)
	return l, nil
}

// Run reconciles every Interval (and whenever a node changes, when Nodes
// is a NodeWatcher) until ctx ends; it returns nil then.
func (l *Lifecycle) Run(ctx context.Context) error {
	var changed <-chan string
	if w, ok := l.cfg.Nodes.(NodeWatcher); ok {
		ch, err := w.WatchNodes(ctx)
		if err != nil {
			l.log.Warn("node watch unavailable: DEPLOYED is noticed by the reconciler only", "err", err)
		} else {
			changed = ch
		}
	}
	t := time.NewTicker(l.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case name, ok := <-changed:
			if !ok {
				changed = nil
				continue
			}
			if m, err := l.inv.GetMachine(ctx, name); err == nil {
				l.reconcileMachine(ctx, m)
			}
		case <-t.C:
			if err := l.ReconcileOnce(ctx); err != nil && ctx.Err() == nil {
				l.log.Warn("lifecycle reconcile failed", "err", err)
			}
		}
	}
}

// ReconcileOnce runs one reconcile pass over every machine: INSTALLING
// machines whose Node is READY become DEPLOYED, stalled installs fail,
// plans and wipes are (re)sent to connected agents, and expired boot
// watchdogs act. Machines in MAINTENANCE are left alone.
func (l *Lifecycle) ReconcileOnce(ctx context.Context) error {
	ms, err := l.inv.ListMachines(ctx, &inventoryv1.ListMachinesRequest{})
	if err != nil {
		return err
	}
	for _, m := range ms {
		if ctx.Err() != nil {
			return nil
		}
		l.reconcileMachine(ctx, m)
	}
	return nil
}

func (l *Lifecycle) now() time.Time { return l.inv.cfg.Now() }

func (l *Lifecycle) reconcileMachine(ctx context.Context, m *inventoryv1.Machine) {
	if m.GetState() == inventoryv1.Machine_MAINTENANCE {
		return
	}
	name := m.GetName()
	node, err := l.cfg.Nodes.GetNode(ctx, name)
	if err != nil && !errors.Is(err, ErrNotFound) {
		l.log.Warn("node not read", "machine", name, "err", err)
	}
	ready := node != nil && node.GetState() == poolv1.Node_READY
	if m.GetState() == inventoryv1.Machine_INSTALLING && ready &&
		!node.GetLastHeartbeat().AsTime().Before(m.GetInstall().GetStartedAt().AsTime()) {
		l.deployed(ctx, name)
		return
	}
	if w := m.GetWatchdog(); w.GetArmedAt() != nil && ready && !node.GetLastHeartbeat().AsTime().Before(w.GetArmedAt().AsTime()) {
		l.disarm(ctx, name, "node "+name+" is READY")
		m.Watchdog = nil
	}
	if m.GetState() == inventoryv1.Machine_INSTALLING {
		if l.installTimedOut(ctx, m) {
			return
		}
	}
	if l.watchdog(ctx, m) {
		return
	}
	// Delivery to a connected agent that has not had the current plan or
	// wipe since its session attached.
	since, connected := l.inv.connectedSince(name)
	if !connected {
		return
	}
	if wp := m.GetWipe(); wp.GetDisk() != "" {
		if wp.GetSentAt() == nil || wp.GetSentAt().AsTime().Before(since) {
			l.sendWipe(ctx, m)
		}
		return
	}
	if in := m.GetInstall(); m.GetState() == inventoryv1.Machine_INSTALLING && !in.GetDone() &&
		(in.GetSentAt() == nil || in.GetSentAt().AsTime().Before(since)) {
		l.sendPlan(ctx, m)
	}
}

// deployed moves an INSTALLING machine whose Node is READY to DEPLOYED.
func (l *Lifecycle) deployed(ctx context.Context, name string) {
	m, err := l.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		if m.GetState() != inventoryv1.Machine_INSTALLING {
			return errSkip
		}
		m.State = inventoryv1.Machine_DEPLOYED
		m.StateReason = ""
		m.NodeName = name
		m.BootIntent = inventoryv1.BootIntent_BOOT_INTENT_HYPERVISOR
		m.Watchdog = nil
		return nil
	})
	if err != nil {
		if !errors.Is(err, errSkip) {
			l.log.Warn("machine not marked DEPLOYED", "machine", name, "err", err)
		}
		return
	}
	l.event(m, "lifecycle", "deployed", "node "+name+" is READY: machine DEPLOYED", nil)
	l.log.Info("machine deployed", "machine", name, "node", name)
}

// installTimedOut fails an install without progress for InstallTimeout.
func (l *Lifecycle) installTimedOut(ctx context.Context, m *inventoryv1.Machine) bool {
	in := m.GetInstall()
	if in.GetDone() && m.GetWatchdog().GetArmedAt() != nil && l.cfg.BootWatchdog >= 0 {
		// Installed and rebooting: the boot watchdog owns it now.
		return false
	}
	last := in.GetUpdatedAt()
	if last == nil {
		last = in.GetStartedAt()
	}
	if last != nil && l.now().Sub(last.AsTime()) <= l.cfg.InstallTimeout {
		return false
	}
	id := in.GetInstallId()
	var reason string
	fm, err := l.inv.UpdateMachine(ctx, m.GetName(), func(m *inventoryv1.Machine) error {
		cur := m.GetInstall()
		if m.GetState() != inventoryv1.Machine_INSTALLING || cur.GetInstallId() != id {
			return errSkip
		}
		if u := cur.GetUpdatedAt(); u != nil && l.now().Sub(u.AsTime()) <= l.cfg.InstallTimeout {
			return errSkip
		}
		switch {
		case cur.GetDone():
			reason = fmt.Sprintf("install timeout: installed, but node %s did not become READY within %s (last step: done)", m.GetName(), l.cfg.InstallTimeout)
		case cur.GetStep() == "":
			reason = fmt.Sprintf("install timeout: no progress within %s (the plan was %s)", l.cfg.InstallTimeout, sentWord(cur))
		default:
			reason = fmt.Sprintf("install timeout: no progress within %s after step %s", l.cfg.InstallTimeout, cur.GetStep())
		}
		m.State = inventoryv1.Machine_FAILED
		m.StateReason = reason
		m.Install.Error = reason
		return nil
	})
	if err != nil {
		if !errors.Is(err, errSkip) {
			l.log.Warn("install timeout not recorded", "machine", m.GetName(), "err", err)
		}
		return false
	}
	l.event(fm, "lifecycle", "install-failed", reason, map[string]string{"install_id": id})
	l.log.Warn("install timed out", "machine", m.GetName(), "reason", reason)
	return true
}

func sentWord(in *inventoryv1.Install) string {
	if in.GetSentAt() == nil {
		return "never delivered: no discovery agent connected"
	}
	return "delivered at " + in.GetSentAt().AsTime().UTC().Format(time.RFC3339)
}

// event records a lifecycle event in the machine's timeline (by its boot
// MAC; a machine without a MAC only gets a log line).
func (l *Lifecycle) event(m *inventoryv1.Machine, source, event, detail string, attrs map[string]string) {
	mac := machineMAC(m)
	if mac == "" {
		l.log.Info(source+" "+event, "machine", m.GetName(), "detail", detail)
		return
	}
	l.inv.Event(mac, source, event, detail, attrs)
}

func machineMAC(m *inventoryv1.Machine) string {
	if m.GetBootMac() != "" {
		return m.GetBootMac()
	}
	if len(m.GetMacs()) > 0 {
		return m.GetMacs()[0]
	}
	return ""
}

func newID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func hasBMC(m *inventoryv1.Machine) bool {
	return m.GetBmc().GetAddress() != "" && m.GetBmc().GetUsername() != ""
}

// Accept starts installing a machine: disk is "auto" (or empty: the
// largest non-removable disk in its facts) or one of its fact disks
// ("/dev/vdb" or "vdb"). Only INVENTORIED and FAILED machines with facts
// are accepted (ErrPrecondition otherwise; ErrNotFound for an unknown
// one; ErrInvalid for a disk it does not have). The machine becomes
// INSTALLING with a new install id and boot intent discover, and the plan
// is sent at once when its discovery agent is connected, otherwise when it
// connects (with a BMC, the machine is power-cycled into discovery).
func (l *Lifecycle) Accept(ctx context.Context, name, disk string, wipe bool) (*inventoryv1.Machine, error) {
	return l.accept(ctx, name, disk, wipe, true)
}

// accept is Accept; power says whether a machine whose agent is away may
// be power-cycled into discovery (not when its agent is about to connect).
func (l *Lifecycle) accept(ctx context.Context, name, disk string, wipe, power bool) (*inventoryv1.Machine, error) {
	m, err := l.inv.GetMachine(ctx, name)
	if err != nil {
		return nil, err
	}
	if err := acceptable(m); err != nil {
		return nil, err
	}
	path, err := resolveDisk(m, disk)
	if err != nil {
		return nil, err
	}
	now := timestamppb.New(l.now())
	id := newID()
	m, err = l.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		if err := acceptable(m); err != nil {
			return err
		}
		m.State = inventoryv1.Machine_INSTALLING
		m.StateReason = ""
		m.NodeName = ""
		m.BootIntent = inventoryv1.BootIntent_BOOT_INTENT_DISCOVER
		m.Install = &inventoryv1.Install{InstallId: id, Disk: path, Wipe: wipe, StartedAt: now, UpdatedAt: now}
		return nil
	})
	if err != nil {
		return nil, err
	}
	l.event(m, "lifecycle", "accepted", fmt.Sprintf("install %s: disk %s wipe=%t", id, path, wipe), map[string]string{"install_id": id})
	l.log.Info("machine accepted", "machine", name, "install_id", id, "disk", path, "wipe", wipe)
	switch {
	case l.inv.Connected(name):
		if m.GetWipe().GetDisk() == "" {
			if sm := l.sendPlan(ctx, m); sm != nil {
				m = sm
			}
		}
	case power && hasBMC(m) && l.cfg.BMC != nil:
		if err := l.pxeCycle(ctx, m, "install: boot into discovery"); err == nil {
			l.inv.armWatchdog(ctx, name, "accept")
		}
	default:
		l.event(m, "lifecycle", "waiting", "install plan waits for the discovery agent: network-boot the machine", nil)
	}
	return l.inv.GetMachine(ctx, name)
}

func acceptable(m *inventoryv1.Machine) error {
	name := m.GetName()
	switch m.GetState() {
	case inventoryv1.Machine_INVENTORIED, inventoryv1.Machine_FAILED:
	case inventoryv1.Machine_INSTALLING, inventoryv1.Machine_DEPLOYED:
		return preconditionf("machine %q is %s: already deployed: reprovision it first", name, m.GetState())
	case inventoryv1.Machine_MAINTENANCE:
		return preconditionf("machine %q is in MAINTENANCE: take it out (corral machine maintenance off %s) first", name, name)
	default:
		return preconditionf("machine %q is %s: it has reported no facts yet; network-boot it into discovery first", name, m.GetState())
	}
	if len(m.GetFacts().GetDisks()) == 0 {
		return preconditionf("machine %q reported no disks: nothing to install on", name)
	}
	return nil
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
			return "", preconditionf("machine %q has no non-removable disk: name one with --disk", m.GetName())
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
	return "", invalidf("disk %q is not one of machine %q's disks: %s", disk, m.GetName(), strings.Join(have, ", "))
}

// autoAccept accepts a machine that just became INVENTORIED when the
// policy is on and it matches every selector; nil when not accepted.
func (l *Lifecycle) autoAccept(ctx context.Context, m *inventoryv1.Machine) *inventoryv1.Machine {
	if !l.cfg.AutoAccept || m.GetState() != inventoryv1.Machine_INVENTORIED || !matchAll(l.sels, m) {
		return nil
	}
	// The agent that just registered opens its session next: the plan
	// goes then.
	am, err := l.accept(ctx, m.GetName(), "auto", false, false)
	if err != nil {
		l.event(m, "lifecycle", "auto-accept-failed", err.Error(), nil)
		l.log.Warn("auto-accept failed", "machine", m.GetName(), "err", err)
		return nil
	}
	l.event(am, "lifecycle", "auto-accepted", "auto-accept policy matched", nil)
	return am
}

// endpoint is the API endpoint for machine's install plan.
func (l *Lifecycle) endpoint(machine string) string {
	if l.cfg.Endpoint != nil {
		if ep := l.cfg.Endpoint(machine); ep != "" {
			return ep
		}
	}
	return l.inv.SessionEndpoint(machine)
}

// sendPlan builds the install plan (with a freshly issued node identity)
// and queues it on the machine's session, recording when it was sent. It
// returns the updated machine, or nil when nothing was sent.
func (l *Lifecycle) sendPlan(ctx context.Context, m *inventoryv1.Machine) *inventoryv1.Machine {
	name := m.GetName()
	in := m.GetInstall()
	certPEM, keyPEM, err := l.cfg.Identity.IssueNode(name)
	if err != nil {
		l.log.Error("node identity not issued", "machine", name, "err", err)
		l.event(m, "lifecycle", "plan-failed", "node identity not issued: "+err.Error(), nil)
		return nil
	}
	plan := &nodev1.InstallPlan{
		Disk: in.GetDisk(), Wipe: in.GetWipe(), Hostname: name,
		NodeCertPem: string(certPEM), NodeKeyPem: string(keyPEM), CaCertPem: string(l.cfg.Identity.CACertPEM()),
		ApplianceEndpoint: l.endpoint(name), InstallId: in.GetInstallId(), MachineName: name,
	}
	if err := l.inv.Send(name, &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Install{Install: plan}}); err != nil {
		l.log.Info("install plan not sent: agent not connected", "machine", name, "install_id", in.GetInstallId())
		return nil
	}
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
	if err := l.inv.Send(name, &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Wipe{Wipe: &nodev1.WipePlan{Disk: wp.GetDisk(), InstallId: wp.GetWipeId()}}}); err != nil {
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

// onConnect is the session hook: a machine's agent attached. A pending
// wipe goes first; an INSTALLING machine's plan is (re)sent.
func (l *Lifecycle) onConnect(ctx context.Context, machine string) {
	m, err := l.inv.GetMachine(ctx, machine)
	if err != nil || m.GetState() == inventoryv1.Machine_MAINTENANCE {
		return
	}
	if m.GetWipe().GetDisk() != "" {
		l.sendWipe(ctx, m)
		return
	}
	if m.GetState() == inventoryv1.Machine_INSTALLING && !m.GetInstall().GetDone() {
		l.sendPlan(ctx, m)
	}
}

// onProgress is the session hook for a progress message: one of the
// current install (or wipe) updates the machine; others are ignored.
func (l *Lifecycle) onProgress(ctx context.Context, machine string, p *nodev1.Progress) {
	ctx = context.WithoutCancel(ctx)
	m, err := l.inv.GetMachine(ctx, machine)
	if err != nil {
		return
	}
	id := p.GetInstallId()
	if wp := m.GetWipe(); id != "" && wp.GetWipeId() == id {
		l.wipeProgress(ctx, m, p)
		return
	}
	if id == "" || m.GetState() != inventoryv1.Machine_INSTALLING || m.GetInstall().GetInstallId() != id {
		l.log.Info("stale progress ignored", "machine", machine, "install_id", id, "current", m.GetInstall().GetInstallId(), "state", m.GetState().String())
		return
	}
	now := timestamppb.New(l.now())
	var failed, done bool
	var reason string
	um, err := l.inv.UpdateMachine(ctx, machine, func(m *inventoryv1.Machine) error {
		failed, done = false, false
		if m.GetState() != inventoryv1.Machine_INSTALLING || m.GetInstall().GetInstallId() != id || m.GetInstall().GetDone() {
			return errSkip
		}
		in := m.Install
		if p.GetStep() != "" {
			in.Step = p.GetStep()
		}
		in.Detail = p.GetDetail()
		in.UpdatedAt = now
		switch {
		case p.GetError() != "":
			failed = true
			reason = fmt.Sprintf("install step %s: %s", orStr(in.GetStep(), "?"), p.GetError())
			in.Error = p.GetError()
			m.State = inventoryv1.Machine_FAILED
			m.StateReason = reason
		case p.GetDone():
			done = true
			in.Done = true
			m.BootIntent = inventoryv1.BootIntent_BOOT_INTENT_HYPERVISOR
			m.StateReason = "installed: rebooting into the hypervisor"
		}
		return nil
	})
	if err != nil {
		if !errors.Is(err, errSkip) {
			l.log.Warn("install progress not recorded", "machine", machine, "err", err)
		}
		return
	}
	switch {
	case failed:
		l.event(um, "lifecycle", "install-failed", reason, map[string]string{"install_id": id})
		l.log.Warn("install failed", "machine", machine, "install_id", id, "reason", reason)
	case done:
		l.event(um, "lifecycle", "installed", "install "+id+" done: boot intent hypervisor", map[string]string{"install_id": id})
		l.log.Info("install done: rebooting into the hypervisor", "machine", machine, "install_id", id)
		l.reboot(ctx, um, "install reboot")
	}
}

func orStr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// wipeProgress clears a reprovision's pending wipe when the agent reports
// it done, and sends an install plan waiting behind it.
func (l *Lifecycle) wipeProgress(ctx context.Context, m *inventoryv1.Machine, p *nodev1.Progress) {
	if !p.GetDone() && p.GetError() == "" {
		return
	}
	id := p.GetInstallId()
	var disk string
	um, err := l.inv.UpdateMachine(ctx, m.GetName(), func(m *inventoryv1.Machine) error {
		if m.GetWipe().GetWipeId() != id {
			return errSkip
		}
		disk = m.GetWipe().GetDisk()
		m.Wipe = nil
		if p.GetError() != "" && m.GetState() != inventoryv1.Machine_MAINTENANCE {
			m.State = inventoryv1.Machine_FAILED
			m.StateReason = fmt.Sprintf("reprovision wipe of %s: %s", disk, p.GetError())
		}
		return nil
	})
	if err != nil {
		return
	}
	if p.GetError() != "" {
		l.event(um, "lifecycle", "wipe-failed", um.GetStateReason(), map[string]string{"install_id": id})
		return
	}
	l.event(um, "lifecycle", "wiped", "disk "+disk+" wiped", map[string]string{"install_id": id})
	if um.GetState() == inventoryv1.Machine_INSTALLING && !um.GetInstall().GetDone() && l.inv.Connected(um.GetName()) {
		l.sendPlan(ctx, um)
	}
}

// reboot restarts a machine into network boot: with an enrolled BMC next
// boot PXE and a power cycle, otherwise the Reboot command on its
// session. It arms the boot watchdog.
func (l *Lifecycle) reboot(ctx context.Context, m *inventoryv1.Machine, why string) {
	if hasBMC(m) && l.cfg.BMC != nil {
		if err := l.pxeCycle(ctx, m, why); err == nil {
			l.inv.armWatchdog(ctx, m.GetName(), why)
			return
		}
	}
	if err := l.inv.Send(m.GetName(), &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Reboot_{Reboot: &nodev1.ApplianceMessage_Reboot{}}}); err != nil {
		l.event(m, "lifecycle", "reboot-failed", why+": no BMC and no agent session: reboot the machine by hand", nil)
		return
	}
	l.event(m, "lifecycle", "reboot", why+": reboot command sent to the agent", nil)
	l.inv.armWatchdog(ctx, m.GetName(), why)
}

// pxeCycle sets next boot PXE and power-cycles through the BMC.
func (l *Lifecycle) pxeCycle(ctx context.Context, m *inventoryv1.Machine, why string) error {
	name := m.GetName()
	if err := l.cfg.BMC.SetBootDevice(ctx, &inventoryv1.SetBootDeviceRequest{Name: name, Device: inventoryv1.BootDevice_BOOT_DEVICE_PXE}); err != nil {
		l.event(m, "lifecycle", "power-cycle-failed", why+": next boot PXE: "+err.Error(), nil)
		return err
	}
	if _, err := l.cfg.BMC.setPower(ctx, name, inventoryv1.PowerAction_POWER_ACTION_CYCLE); err != nil {
		l.event(m, "lifecycle", "power-cycle-failed", why+": "+err.Error(), nil)
		return err
	}
	l.event(m, "lifecycle", "power-cycle", why+": next boot PXE, power cycled through the BMC", nil)
	return nil
}

// armWatchdog arms a machine's boot watchdog (cycles reset) when it is
// to network-boot (boot intent discover or hypervisor, not MAINTENANCE).
func (i *Inventory) armWatchdog(ctx context.Context, name, by string) {
	now := timestamppb.New(i.cfg.Now())
	_, err := i.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		if m.GetState() == inventoryv1.Machine_MAINTENANCE {
			return errSkip
		}
		switch m.GetBootIntent() {
		case inventoryv1.BootIntent_BOOT_INTENT_DISCOVER, inventoryv1.BootIntent_BOOT_INTENT_HYPERVISOR, inventoryv1.BootIntent_BOOT_INTENT_UNSPECIFIED:
		default:
			return errSkip
		}
		m.Watchdog = &inventoryv1.BootWatchdog{ArmedAt: now, ArmedBy: by}
		return nil
	})
	if err != nil && !errors.Is(err, errSkip) {
		i.log.Warn("boot watchdog not armed", "machine", name, "err", err)
	}
}

func (l *Lifecycle) disarm(ctx context.Context, name, why string) {
	m, err := l.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		if m.GetWatchdog().GetArmedAt() == nil {
			return errSkip
		}
		m.Watchdog = nil
		return nil
	})
	if err == nil {
		l.log.Debug("boot watchdog disarmed", "machine", m.GetName(), "why", why)
	}
}

// watchdog acts on an expired boot watchdog: with a BMC it power-cycles
// (PXE first) up to BootWatchdogCycles times, then (or at once without a
// BMC) the machine is FAILED with its last timeline entry as the reason.
// It reports whether it acted.
func (l *Lifecycle) watchdog(ctx context.Context, m *inventoryv1.Machine) bool {
	w := m.GetWatchdog()
	if l.cfg.BootWatchdog < 0 || w.GetArmedAt() == nil || l.now().Sub(w.GetArmedAt().AsTime()) < l.cfg.BootWatchdog {
		return false
	}
	name := m.GetName()
	armed := w.GetArmedAt().AsTime()
	if int(w.GetCycles()) < l.cfg.BootWatchdogCycles && hasBMC(m) && l.cfg.BMC != nil {
		n := w.GetCycles() + 1
		// Claim this expiry first (CAS on the arm time), so two
		// reconcilers never cycle one machine twice for it.
		now := timestamppb.New(l.now())
		cm, err := l.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
			if m.GetState() == inventoryv1.Machine_MAINTENANCE || !m.GetWatchdog().GetArmedAt().AsTime().Equal(armed) {
				return errSkip
			}
			m.Watchdog.ArmedAt = now
			m.Watchdog.Cycles = n
			return nil
		})
		if err != nil {
			return false
		}
		detail := fmt.Sprintf("boot watchdog: no agent after %s: power cycle %d/%d", l.cfg.BootWatchdog, n, l.cfg.BootWatchdogCycles)
		l.event(cm, "watchdog", "power-cycle", detail, map[string]string{"cycle": fmt.Sprint(n)})
		l.log.Warn("boot watchdog expired: power cycling", "machine", name, "cycle", n)
		_ = l.pxeCycle(ctx, cm, "boot watchdog")
		return true
	}
	last := l.lastEntry(ctx, name)
	var reason string
	if w.GetCycles() > 0 {
		reason = fmt.Sprintf("boot watchdog: no agent after %s ×%d; last: %s", l.cfg.BootWatchdog, w.GetCycles(), last)
	} else {
		reason = fmt.Sprintf("boot watchdog: no agent after %s (no BMC to power-cycle); last: %s", l.cfg.BootWatchdog, last)
	}
	fm, err := l.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		if m.GetState() == inventoryv1.Machine_MAINTENANCE || !m.GetWatchdog().GetArmedAt().AsTime().Equal(armed) {
			return errSkip
		}
		m.Watchdog = nil
		m.State = inventoryv1.Machine_FAILED
		m.StateReason = reason
		return nil
	})
	if err != nil {
		return false
	}
	l.event(fm, "watchdog", "failed", reason, nil)
	l.log.Warn("boot watchdog: machine FAILED", "machine", name, "reason", reason)
	return true
}

// lastEntry describes the newest timeline entry not written by the
// watchdog or its own power actions: the last thing the machine did.
func (l *Lifecycle) lastEntry(ctx context.Context, name string) string {
	es, err := l.inv.Timeline(ctx, name, "", 200)
	if err != nil {
		return "no timeline"
	}
	for k := len(es) - 1; k >= 0; k-- {
		e := es[k]
		switch e.GetSource() {
		case "watchdog", "bmc", "lifecycle":
			continue
		}
		s := e.GetSource() + " " + e.GetEvent()
		// Name what was fetched and how it ended (HTTP, TFTP entries).
		for _, k := range []string{"status", "path", "file"} {
			if v := e.GetAttributes()[k]; v != "" {
				s += " " + k + "=" + v
			}
		}
		if e.GetDetail() != "" {
			s += ": " + e.GetDetail()
		}
		return s
	}
	return "nothing in the timeline"
}

// Reprovision takes a machine back to discovery: refused (ErrPrecondition
// naming them) while its Node holds reservations; otherwise its Node is
// removed, boot intent becomes discover, the state DISCOVERED (INVENTORIED
// again when the agent registers) and the install disk is remembered to be
// wiped when the discovery agent's session comes up. With a BMC the
// machine is power-cycled into PXE; otherwise the state reason says the
// operator must reboot it.
func (l *Lifecycle) Reprovision(ctx context.Context, name string) (*inventoryv1.Machine, error) {
	m, err := l.inv.GetMachine(ctx, name)
	if err != nil {
		return nil, err
	}
	if m.GetState() == inventoryv1.Machine_MAINTENANCE {
		return nil, preconditionf("machine %q is in MAINTENANCE: take it out (corral machine maintenance off %s) first", name, name)
	}
	node, err := l.cfg.Nodes.GetNode(ctx, name)
	switch {
	case errors.Is(err, ErrNotFound):
	case err != nil:
		return nil, err
	default:
		var held []string
		for k := range node.GetReservedComputes() {
			held = append(held, "compute/"+k)
		}
		for k := range node.GetReservedStorages() {
			held = append(held, "storage/"+k)
		}
		if len(held) > 0 {
			sort.Strings(held)
			return nil, preconditionf("machine %q: node %s still holds %d reservation(s): %s; delete its VMs and volumes first", name, name, len(held), strings.Join(held, ", "))
		}
		if err := l.cfg.Nodes.DeleteNode(ctx, name); err != nil && !errors.Is(err, ErrNotFound) {
			return nil, fmt.Errorf("machine %q: remove node: %w", name, err)
		}
	}
	bmc := hasBMC(m) && l.cfg.BMC != nil
	reason := "reprovisioning: waiting for the discovery agent"
	if !bmc {
		reason = "reprovisioning: no BMC enrolled: reboot the machine into network boot"
	}
	now := timestamppb.New(l.now())
	m, err = l.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		if m.GetState() == inventoryv1.Machine_MAINTENANCE {
			return preconditionf("machine %q is in MAINTENANCE", name)
		}
		m.State = inventoryv1.Machine_DISCOVERED
		m.StateReason = reason
		m.NodeName = ""
		m.BootIntent = inventoryv1.BootIntent_BOOT_INTENT_DISCOVER
		m.Watchdog = nil
		if d := m.GetInstall().GetDisk(); d != "" {
			m.Wipe = &inventoryv1.PendingWipe{Disk: d, WipeId: newID(), RequestedAt: now}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	detail := "node removed, boot intent discover"
	if d := m.GetWipe().GetDisk(); d != "" {
		detail += "; " + d + " is wiped when the discovery agent connects"
	}
	l.event(m, "lifecycle", "reprovision", detail, nil)
	l.log.Info("machine reprovisioned", "machine", name, "wipe", m.GetWipe().GetDisk())
	if bmc {
		if err := l.pxeCycle(ctx, m, "reprovision"); err != nil {
			_, _ = l.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
				m.StateReason = "reprovisioning: BMC power cycle failed (" + err.Error() + "): reboot the machine into network boot"
				return nil
			})
		} else {
			l.inv.armWatchdog(ctx, name, "reprovision")
		}
	} else {
		l.event(m, "lifecycle", "reboot-needed", reason, nil)
		if l.inv.Connected(name) {
			l.sendWipe(ctx, m)
		}
	}
	return l.inv.GetMachine(ctx, name)
}

// SetMaintenance puts a machine in MAINTENANCE (remembering its state and
// reason; it boots its local disk and no automation touches it) or takes
// it out, restoring them. Taking out a machine not in MAINTENANCE is
// ErrPrecondition.
func (l *Lifecycle) SetMaintenance(ctx context.Context, name string, on bool, reason string) (*inventoryv1.Machine, error) {
	now := timestamppb.New(l.now())
	m, err := l.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		if on {
			if m.GetState() != inventoryv1.Machine_MAINTENANCE {
				m.MaintenancePreviousState = m.GetState()
				m.MaintenancePreviousReason = m.GetStateReason()
			}
			m.State = inventoryv1.Machine_MAINTENANCE
			m.StateReason = orStr(reason, "maintenance")
			m.Watchdog = nil
			return nil
		}
		if m.GetState() != inventoryv1.Machine_MAINTENANCE {
			return preconditionf("machine %q is %s, not in MAINTENANCE", name, m.GetState())
		}
		prev := m.GetMaintenancePreviousState()
		if prev == inventoryv1.Machine_UNSPECIFIED || prev == inventoryv1.Machine_MAINTENANCE {
			prev = inventoryv1.Machine_DISCOVERED
			if m.GetFacts() != nil {
				prev = inventoryv1.Machine_INVENTORIED
			}
		}
		m.State = prev
		m.StateReason = m.GetMaintenancePreviousReason()
		m.MaintenancePreviousState = inventoryv1.Machine_UNSPECIFIED
		m.MaintenancePreviousReason = ""
		if prev == inventoryv1.Machine_INSTALLING && m.Install != nil {
			// The install timeout starts afresh.
			m.Install.UpdatedAt = now
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if on {
		l.event(m, "lifecycle", "maintenance-on", m.GetStateReason(), nil)
	} else {
		l.event(m, "lifecycle", "maintenance-off", "state "+m.GetState().String()+" restored", nil)
	}
	l.log.Info("maintenance", "machine", name, "on", on, "state", m.GetState().String())
	return m, nil
}
