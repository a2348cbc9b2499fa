package metrics

import (
	"container/list"
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
	"github.com/prometheus/client_golang/prometheus"
)

// timelineEntriesPrefix holds the boot timeline's entries
// (the inventory/timeline package owns it; read by prefix here, not imported).
const timelineEntriesPrefix = store.TimelinePrefix

// Boot phases, the label values of corral_boot_phase_seconds.
const (
	phasePowerToDHCP   = "power_to_dhcp"    // a power on/cycle/reset → the first DISCOVER
	phaseDHCPToScript  = "dhcp_to_script"   // the boot's first DISCOVER → its iPXE script
	phaseScriptToImage = "script_to_images" // the script → kernel and initrd both served
	phaseImageToAgent  = "images_to_agent"  // kernel and initrd served → the agent registered (or the node READY)
	phaseInstall       = "install"          // install plan sent → installed
	phaseToReady       = "install_to_ready" // installed → the node READY (machine DEPLOYED)
)

// maxPhaseMACs bounds the MACs whose boot is followed: the boot LAN can
// send DISCOVERs from any number of spoofed MACs; the least recently seen
// are forgotten first.
const maxPhaseMACs = 16384

// maxPhase is the longest duration observed; a longer gap is two boots,
// not one slow phase.
const maxPhase = 24 * time.Hour

// phaseTracker turns boot timeline entries into phase durations. It
// follows the timeline through the store's Watch (so it sees every
// appliance's entries when the store is shared), keeps per MAC the start
// of the phase in progress, and observes a phase when the entry that ends
// it is written, timed by the entries' own timestamps.
type phaseTracker struct {
	log  *slog.Logger
	hist *prometheus.HistogramVec

	// lastRev is the newest timeline revision seen (run's goroutine only).
	lastRev int64

	mu   sync.Mutex
	macs map[string]*list.Element // value *macPhases
	lru  *list.List               // front: seen most recently
}

type macPhases struct {
	mac      string
	power    time.Time // last power action, until the DISCOVER it causes
	discover time.Time // this boot's first DISCOVER
	script   time.Time // this boot's script
	// early: the script was taken before its boot's DISCOVER, whose
	// timeline entry can be stored later (the timeline's writers run in
	// parallel); dhcp_to_script is observed when the DISCOVER arrives.
	early     bool
	kernel    bool      // kernel served since the script
	initrd    bool      // initrd served since the script
	images    time.Time // both served, until the agent arrives
	planSent  time.Time // install plan sent, until installed
	installed time.Time // installed, until the node is READY
}

func newPhaseTracker(log *slog.Logger) *phaseTracker {
	return &phaseTracker{log: log, macs: map[string]*list.Element{}, lru: list.New(),
		hist: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "corral_boot_phase_seconds",
			Help:    "Boot phase durations from the boot timeline: power_to_dhcp, dhcp_to_script, script_to_images, images_to_agent, install, install_to_ready.",
			Buckets: []float64{.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600},
		}, []string{"phase"})}
}

// state returns mac's phases, creating them (and forgetting the least
// recently seen MAC past maxPhaseMACs) when create is set.
func (p *phaseTracker) state(mac string, create bool) *macPhases {
	if e, ok := p.macs[mac]; ok {
		p.lru.MoveToFront(e)
		return e.Value.(*macPhases)
	}
	if !create {
		return nil
	}
	if p.lru.Len() >= maxPhaseMACs {
		old := p.lru.Back()
		p.lru.Remove(old)
		delete(p.macs, old.Value.(*macPhases).mac)
	}
	st := &macPhases{mac: mac}
	p.macs[mac] = p.lru.PushFront(st)
	return st
}

func (p *phaseTracker) observe(phase string, from, to time.Time) {
	if from.IsZero() {
		return
	}
	if d := to.Sub(from); d >= 0 && d <= maxPhase {
		p.hist.WithLabelValues(phase).Observe(d.Seconds())
	}
}

// entry takes one timeline entry.
func (p *phaseTracker) entry(e *inventoryv1.TimelineEntry) {
	mac, src, ev := e.GetMac(), e.GetSource(), e.GetEvent()
	if mac == "" || e.GetAt() == nil {
		return
	}
	t := e.GetAt().AsTime()
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case (src == "bmc" || src == "lifecycle" || src == "watchdog") && (ev == "power-on" || ev == "power-cycle" || ev == "power-reset"):
		st := p.state(mac, true)
		*st = macPhases{mac: mac, power: t, planSent: st.planSent, installed: st.installed}
	case src == "dhcp" && ev == "discover":
		st := p.state(mac, true)
		if st.early && !t.After(st.script) {
			// This boot's DISCOVER, stored after its script.
			p.observe(phasePowerToDHCP, st.power, t)
			p.observe(phaseDHCPToScript, t, st.script)
			st.power, st.discover, st.early = time.Time{}, t, false
			break
		}
		st.early = false
		p.observe(phasePowerToDHCP, st.power, t)
		st.power = time.Time{}
		if st.discover.IsZero() || !st.script.IsZero() {
			// The first DISCOVER of a boot (iPXE's own DHCP, after the
			// firmware's, belongs to the same boot).
			st.discover, st.script, st.kernel, st.initrd, st.images = t, time.Time{}, false, false, time.Time{}
		}
	case src == "lifecycle" && ev == "kexec":
		// The install's kexec into the hypervisor image (lifecycle/kexec.go):
		// a boot without power action, DISCOVER or script; the agent's
		// fetch of kernel and initrd follows, then the node's READY.
		st := p.state(mac, true)
		st.power, st.discover, st.script, st.kernel, st.initrd, st.images = time.Time{}, time.Time{}, t, false, false, time.Time{}
	case src == "http" && ev == "script":
		st := p.state(mac, true)
		if !st.script.IsZero() {
			return
		}
		if st.discover.IsZero() {
			st.early = true
		}
		p.observe(phaseDHCPToScript, st.discover, t)
		st.script, st.kernel, st.initrd = t, false, false
	case src == "http" && ev == "artifact":
		st := p.state(mac, false)
		if st == nil || st.script.IsZero() || !st.images.IsZero() {
			return
		}
		switch e.GetAttributes()["kind"] {
		case "kernel":
			st.kernel = true
		case "initrd":
			st.initrd = true
		}
		if st.kernel && st.initrd {
			p.observe(phaseScriptToImage, st.script, t)
			st.images = t
		}
	case src == "inventory" && ev == "registered", src == "lifecycle" && ev == "deployed":
		st := p.state(mac, false)
		if st == nil {
			return
		}
		p.observe(phaseImageToAgent, st.images, t)
		st.images = time.Time{}
		if ev == "deployed" {
			p.observe(phaseToReady, st.installed, t)
			st.installed = time.Time{}
		}
	case src == "lifecycle" && ev == "plan-sent":
		p.state(mac, true).planSent = t
	case src == "lifecycle" && ev == "installed":
		st := p.state(mac, true)
		p.observe(phaseInstall, st.planSent, t)
		st.planSent, st.installed = time.Time{}, t
	case src == "lifecycle" && ev == "install-failed":
		if st := p.state(mac, false); st != nil {
			st.planSent, st.installed = time.Time{}, time.Time{}
		}
	}
}

// run follows the timeline until ctx ends. A watch cut for falling behind
// resumes after the last entry seen (store.HistoryWatcher); entries the
// store no longer keeps are not seen, and a phase they end is simply not
// observed.
func (p *phaseTracker) run(ctx context.Context, st store.Store) error {
	pause := time.Second
	for ctx.Err() == nil {
		started := time.Now()
		err := p.follow(ctx, st)
		select {
		case <-ctx.Done():
			return nil // the watch ended with ctx: no retry
		default:
		}
		if time.Since(started) > time.Minute {
			pause = time.Second
		}
		p.log.Warn("boot phases: timeline watch ended; watching again", "err", err, "retry_in", pause.String())
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Minute)
	}
	return nil
}

func (p *phaseTracker) follow(ctx context.Context, st store.Store) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var ch <-chan store.Event
	var err error
	if hw, ok := store.AsHistoryWatcher(st); ok && p.lastRev > 0 {
		// Resume after the last entry seen; history gone: from now.
		ch, err = hw.WatchFrom(wctx, timelineEntriesPrefix, p.lastRev)
		if err != nil && !errors.Is(err, store.ErrCompacted) {
			return err
		}
	}
	if ch == nil {
		if ch, err = st.Watch(wctx, timelineEntriesPrefix); err != nil {
			return err
		}
	}
	for ev := range ch {
		p.lastRev = max(p.lastRev, ev.KV.Revision)
		if ev.Type != store.EventPut {
			continue
		}
		var e inventoryv1.TimelineEntry
		if record.Unmarshal(ev.KV.Value, &e) != nil {
			continue
		}
		p.entry(&e)
	}
	return errWatchCut
}
