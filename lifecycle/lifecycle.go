package lifecycle

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/inventory"
)

// Lifecycle defaults (docs/architecture.md).
const (
	DefaultReconcileInterval  = 10 * time.Second
	DefaultInstallTimeout     = 15 * time.Minute
	DefaultBootWatchdog       = 300 * time.Second
	DefaultBootWatchdogCycles = 3
)

// Config configures the install workflow and the lifecycle timers. Zero
// durations take the defaults.
type Config struct {
	// Machines and Events are the inventory (required).
	Machines Machines
	Events   Events
	Nodes    Nodes
	Identity NodeIdentity
	// Certs, when set, revokes a machine's node certificates when it is
	// reprovisioned or deleted.
	Certs CertRevoker
	// BMC, when set, reboots and power-cycles machines with an enrolled
	// BMC (PXE next).
	BMC Power
	// Endpoint is the appliance API endpoint (host:port) put in install
	// plans; nil or "" uses the address the machine's agent dialled.
	Endpoint func(machine string) string
	Logger   *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
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
	// Release and erase (release.go, erase.go): ErasePolicy says a
	// standby pool's erase level (SetErasePolicy; nil: no pool erases by
	// default); EraseTimeout fails an erase not finished in time (default
	// DefaultEraseTimeout), EraseStall one without progress (default
	// DefaultEraseStall); EraseDone counts finished erases by level and
	// outcome (ok, failed, timeout).
	ErasePolicy  inventory.ErasePolicy
	EraseTimeout time.Duration
	EraseStall   time.Duration
	// CommissionStall fails a commissioning from which nothing was heard
	// for this long (counted from its request, its delivery or the last
	// test reported, whichever is latest; default DefaultCommissionStall):
	// an agent that died, or a machine never network-booted.
	CommissionStall time.Duration
	EraseDone       func(level, outcome string)
	// AutoAccept accepts (disk auto, no wipe) machines that become
	// INVENTORIED and match every AutoAcceptSelectors selector.
	AutoAccept          bool
	AutoAcceptSelectors []string
	// AutoAcceptSerials, when not empty, is the allowlist of serials
	// auto-accept is limited to (autoaccept.go).
	AutoAcceptSerials []string
	// Agents bounds the agent edge: sessions and progress (sessions.go).
	Agents AgentLimits
	// Owns reports whether this appliance runs machine's per-machine work
	// (the boot watchdog); nil = every machine (an appliance alone).
	Owns func(machine string) bool
	// WatchMachines, when set, streams names of machines that change, so
	// Deliver hands a plan written by another appliance to a local agent
	// at once rather than on the next tick.
	WatchMachines func(ctx context.Context) (<-chan string, error)
	// PeerEndpoints lists the other appliances' API endpoints; install
	// plans name them after this appliance's own so nodes fail over.
	PeerEndpoints func(ctx context.Context) []string
	// Claims, when set (a fleet), keeps one live agent session per
	// machine across appliances (claims.go).
	Claims SessionClaims
	// Kexec, when set, renders the hypervisor boot that an agent naming
	// the kexec capability boots with kexec after its install, instead of
	// a reboot (kexec.go). KexecTimeout is how long its node then has to
	// become READY before the machine is rebooted the old way (default
	// DefaultKexecTimeout; negative: no kexec).
	Kexec        HypervisorBoot
	KexecTimeout time.Duration
	// KexecAhead sends the KexecPlan right behind the install plan to an
	// agent naming kexec-prefetch, which then fetches, verifies and loads
	// the image while it installs (kexecAhead). Off by default: in the
	// 2-core TCG virtual rack the agent's hashing and the install's module
	// loads slowed each other more than the overlap saved (plan → image
	// loaded 19.8 s against 18.2 s serially, medians of 8 and 6 boots).
	KexecAhead bool
	// DeployTimeout fails a deploy whose agent reports no progress for
	// that long while it writes (default DefaultDeployTimeout);
	// DeployBootTimeout one whose OS does not phone home that long after
	// the image was written (default DefaultDeployBootTimeout).
	DeployTimeout     time.Duration
	DeployBootTimeout time.Duration
	// DeployOutcome, when set, is told each deploy's start and end
	// (DeployStarted, DeployDeployed, DeployFailed, DeployTimedOut):
	// corrald's metrics. It must be quick.
	DeployOutcome func(outcome string)
}

// Lifecycle drives machines from INVENTORIED to DEPLOYED (accept, install
// plan delivery, progress, reboot into the hypervisor), back
// (reprovision), in and out of MAINTENANCE, and runs the install timeout
// and boot watchdog. Its methods are safe for concurrent use; every
// machine change is a compare-and-swap that re-checks the state it acts on.
type Lifecycle struct {
	inv  Machines
	ev   Events
	cfg  Config
	log  *slog.Logger
	sels inventory.Selectors
	sess *sessions
	// streams ties install plans to the agent stream they went on
	// (csr.go); its zero value is ready.
	streams planStreams
	// eraseMu guards cfg.ErasePolicy (SetErasePolicy).
	eraseMu sync.Mutex
	// commissionOverlay is SetCommissionOverlay's (commission.go).
	commissionOverlay CommissionOverlay
	// kexecMu guards cfg.Kexec (SetKexec) and commissionOverlay.
	kexecMu sync.Mutex
	// deployMu guards deploySvc (SetDeploy); deployIndex finds a
	// phone-home's machine (deploy.go).
	deployMu    sync.Mutex
	deploySvc   DeployServices
	deployIndex deployIndex
}

// New validates cfg and returns a Lifecycle. Run runs its reconciler; the
// agent edge (AgentServer) and MachineServer serve through it.
func New(cfg Config) (*Lifecycle, error) {
	if cfg.Machines == nil || cfg.Events == nil || cfg.Nodes == nil || cfg.Identity == nil {
		return nil, errors.New("lifecycle: Config.Machines, Events, Nodes and Identity are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
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
	cfg.EraseTimeout, cfg.EraseStall = eraseTimeouts(cfg.EraseTimeout, cfg.EraseStall)
	if cfg.CommissionStall <= 0 {
		cfg.CommissionStall = DefaultCommissionStall
	}
	if cfg.KexecTimeout == 0 {
		cfg.KexecTimeout = DefaultKexecTimeout
	}
	if cfg.DeployTimeout <= 0 {
		cfg.DeployTimeout = DefaultDeployTimeout
	}
	if cfg.DeployBootTimeout <= 0 {
		cfg.DeployBootTimeout = DefaultDeployBootTimeout
	}
	sels, err := inventory.ParseSelectors(cfg.AutoAcceptSelectors)
	if err != nil {
		return nil, fmt.Errorf("auto-accept selector: %w", err)
	}
	return &Lifecycle{inv: cfg.Machines, ev: cfg.Events, cfg: cfg, log: cfg.Logger, sels: sels, sess: newSessions(cfg.Agents, cfg.Logger)}, nil
}

var errSkip = errors.New("skip")

// Run is the leader's reconciler: every Interval (and whenever a node
// changes, when Nodes is a NodeWatcher) it moves INSTALLING machines whose
// Node is READY to DEPLOYED, fails stalled installs and releases machines
// whose allocation expired (expiry.go), until ctx ends; it
// returns nil then. Several appliances sharing a store run it on the
// elected leader only; Deliver runs on every appliance.
func (l *Lifecycle) Run(ctx context.Context) error {
	var watch func(context.Context) (<-chan string, error)
	if w, ok := l.cfg.Nodes.(NodeWatcher); ok {
		watch = w.WatchNodes
	}
	return l.loop(ctx, "node", watch, func(ctx context.Context, m *inventoryv1.Machine) { l.reconcileLeader(ctx, m) })
}

// Deliver is every appliance's share of the lifecycle: it delivers pending
// install plans and wipes — records on the machine, written by whichever
// appliance accepted or reprovisioned it — to agents whose session this
// appliance holds, and runs the boot watchdog of the machines this
// appliance owns (Config.Owns). It reacts to machine changes when
// Config.WatchMachines is set and runs every Interval, until ctx ends.
func (l *Lifecycle) Deliver(ctx context.Context) error {
	return l.loop(ctx, "machine", l.cfg.WatchMachines, func(ctx context.Context, m *inventoryv1.Machine) { l.reconcileLocal(ctx, m) })
}

// loop runs fn on every machine each Interval and, when watch is set, on
// each machine named by the watch (a node's name is its machine's). A
// watch the store drops is opened again after a pause.
func (l *Lifecycle) loop(ctx context.Context, kind string, watch func(context.Context) (<-chan string, error), fn func(context.Context, *inventoryv1.Machine)) error {
	var changed <-chan string
	var retry <-chan time.Time
	subscribe := func() {
		ch, err := watch(ctx)
		if err != nil {
			if ctx.Err() == nil {
				l.log.Warn(kind+" watch unavailable: changes are noticed on the reconciler's tick until it returns", "err", err)
			}
			retry = time.After(time.Second)
			return
		}
		changed, retry = ch, nil
	}
	if watch != nil {
		subscribe()
	}
	t := time.NewTicker(l.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-retry:
			subscribe()
		case name, ok := <-changed:
			if !ok {
				changed = nil
				if ctx.Err() == nil {
					retry = time.After(time.Second)
				}
				continue
			}
			if m, err := l.inv.GetMachine(ctx, name); err == nil {
				fn(ctx, m)
			}
		case <-t.C:
			if err := l.each(ctx, fn); err != nil && ctx.Err() == nil {
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
	return l.each(ctx, l.reconcileMachine)
}

// machineScanner is implemented by an Inventory that can scan machines a
// bounded batch at a time (*inventory.Inventory): each then never holds
// every record at once.
type machineScanner interface {
	EachMachine(ctx context.Context, req *inventoryv1.ListMachinesRequest, fn func(*inventoryv1.Machine) error) error
}

// errStopScan ends a scan early.
var errStopScan = errors.New("scan stopped")

// each runs fn on every machine, in the SUMMARY view: the reconcilers read
// state, install, wipe and watchdog, never facts, and write through
// UpdateMachine on the whole record.
func (l *Lifecycle) each(ctx context.Context, fn func(context.Context, *inventoryv1.Machine)) error {
	req := &inventoryv1.ListMachinesRequest{View: inventoryv1.MachineView_MACHINE_VIEW_SUMMARY}
	if s, ok := l.inv.(machineScanner); ok {
		stopping := func() bool { return ctx.Err() != nil }
		err := s.EachMachine(ctx, req, func(m *inventoryv1.Machine) error {
			if stopping() {
				return errStopScan // the rest wait for the next pass
			}
			fn(ctx, m)
			return nil
		})
		if stopping() {
			return nil
		}
		return err
	}
	ms, err := l.inv.ListMachines(ctx, req)
	if err != nil {
		return err
	}
	for _, m := range ms {
		select {
		case <-ctx.Done():
			return nil // the rest wait for the next pass
		default:
		}
		fn(ctx, m)
	}
	return nil
}

func (l *Lifecycle) now() time.Time { return l.cfg.Now() }

func (l *Lifecycle) owns(machine string) bool { return l.cfg.Owns == nil || l.cfg.Owns(machine) }

func (l *Lifecycle) reconcileMachine(ctx context.Context, m *inventoryv1.Machine) {
	if l.reconcileLeader(ctx, m) {
		return
	}
	l.reconcileLocal(ctx, m)
}

// readyNode reads machine name's Node: whether it is READY, and the node.
func (l *Lifecycle) readyNode(ctx context.Context, name string) (*poolv1.Node, bool) {
	node, err := l.cfg.Nodes.GetNode(ctx, name)
	if err != nil && !errors.Is(err, apierr.ErrNotFound) {
		l.log.Warn("node not read", "machine", name, "err", err)
	}
	return node, node != nil && node.GetState() == poolv1.Node_READY
}

// reconcileLeader is the leader's part of a reconcile of m: DEPLOYED when
// its node is READY, the install timeout. It reports whether it settled
// the machine (nothing more to do for it in this pass).
func (l *Lifecycle) reconcileLeader(ctx context.Context, m *inventoryv1.Machine) bool {
	if m.GetState() == inventoryv1.Machine_MAINTENANCE {
		return true
	}
	if m.GetState() == inventoryv1.Machine_RELEASING {
		return l.eraseTimedOut(ctx, m)
	}
	if pendingCommission(m) && l.commissionStalled(ctx, m) { // commission.go
		return true
	}
	if l.expired(m) {
		l.expire(ctx, m)
		return true
	}
	if m.GetState() == inventoryv1.Machine_DEPLOYING {
		return l.deployTimedOut(ctx, m) // no node: the OS is its owner's
	}
	name := m.GetName()
	node, ready := l.readyNode(ctx, name)
	if (m.GetState() == inventoryv1.Machine_INSTALLING || failedAfterInstall(m)) && ready &&
		!node.GetLastHeartbeat().AsTime().Before(m.GetInstall().GetStartedAt().AsTime()) {
		l.deployed(ctx, name)
		return true
	}
	if w := m.GetWatchdog(); w.GetArmedAt() != nil && ready && !node.GetLastHeartbeat().AsTime().Before(w.GetArmedAt().AsTime()) {
		l.disarm(ctx, name, nil, "node "+name+" is READY")
		m.Watchdog = nil
	}
	return m.GetState() == inventoryv1.Machine_INSTALLING && l.installTimedOut(ctx, m)
}

// reconcileLocal is the part of a reconcile of m that belongs to this
// appliance: the boot watchdog when this appliance owns the machine's
// per-machine work, and delivery of a pending plan or wipe when the
// machine's agent session is on this appliance.
func (l *Lifecycle) reconcileLocal(ctx context.Context, m *inventoryv1.Machine) {
	if m.GetState() == inventoryv1.Machine_MAINTENANCE {
		return
	}
	name := m.GetName()
	if l.owns(name) && m.GetWatchdog().GetArmedAt() != nil {
		if node, ready := l.readyNode(ctx, name); ready && !node.GetLastHeartbeat().AsTime().Before(m.GetWatchdog().GetArmedAt().AsTime()) {
			// The leader disarms too; whoever is first wins the CAS.
			l.disarm(ctx, name, nil, "node "+name+" is READY")
			m.Watchdog = nil
		} else if l.watchdog(ctx, m) {
			return
		}
	}
	if pendingErase(m) {
		l.deliverErase(ctx, m) // erase.go
		return
	}
	if l.deliverCommission(ctx, m) { // commission.go
		return
	}
	// Delivery to an agent connected here that has not had the current
	// plan or wipe since its session attached.
	since, connected := l.sess.connectedSince(name)
	if !connected {
		return
	}
	if l.deployDeliver(ctx, m, since) {
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

// failedAfterInstall reports whether the boot watchdog failed m after its
// install was done: its reboot into the hypervisor took longer than the
// watchdog (a firmware stuck retrying a busy boot server under a storm,
// with no BMC to cycle it). Its node coming READY later, with the
// certificate that install got, still makes it DEPLOYED.
func failedAfterInstall(m *inventoryv1.Machine) bool {
	return m.GetState() == inventoryv1.Machine_FAILED && m.GetInstall().GetDone() &&
		strings.HasPrefix(m.GetStateReason(), watchdogReasonPrefix)
}

// deployed moves an INSTALLING machine whose Node is READY to DEPLOYED
// (or one the boot watchdog failed after its install: failedAfterInstall).
func (l *Lifecycle) deployed(ctx context.Context, name string) {
	late := false
	m, err := l.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		late = failedAfterInstall(m)
		ev := inventory.EventNodeReady
		if late {
			ev = inventory.EventNodeReadyAfterWatchdog
		}
		if inventory.Transition(m, ev) != nil {
			return errSkip
		}
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
	detail := "node " + name + " is READY: machine DEPLOYED"
	if late {
		detail = "node " + name + " is READY after the boot watchdog failed the machine: machine DEPLOYED"
	}
	l.event(m, "lifecycle", "deployed", detail, nil)
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
		if err := inventory.Transition(m, inventory.EventInstallFailed); err != nil {
			return err
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
	l.ev.Event(mac, source, event, detail, attrs)
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
