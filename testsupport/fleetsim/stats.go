package fleetsim

import (
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// Phases, in the order a machine goes through them.
const (
	PhaseDHCP       = "dhcp discover→ack"
	PhaseTFTP       = "tftp ipxe binary"
	PhaseIPXEDHCP   = "ipxe dhcp"
	PhaseScript     = "script"
	PhaseFetch      = "kernel+initrd"
	PhaseRegister   = "register"
	PhaseSession    = "session open"
	PhaseAccept     = "register→plan"
	PhaseInstall    = "install plan→done"
	PhaseReboot     = "reboot→node ready"
	PhaseKexecFetch = "kexec fetch"
	PhaseKexecReady = "kexec→node ready"
	PhaseNodeJoin   = "node join"
	PhaseHeartbeat  = "node heartbeat"
	PhaseAgentBeat  = "agent heartbeat"
	PhasePowerToInv = "power-on→registered"
)

var phaseOrder = []string{PhaseDHCP, PhaseTFTP, PhaseIPXEDHCP, PhaseScript, PhaseFetch, PhaseRegister, PhaseSession, PhaseAccept,
	PhaseInstall, PhaseReboot, PhaseKexecFetch, PhaseKexecReady, PhaseNodeJoin, PhaseHeartbeat, PhaseAgentBeat, PhasePowerToInv}

// maxSamples bounds each phase's samples (heartbeats run all along):
// past it, samples replace random earlier ones (reservoir).
const maxSamples = 200_000

// stats collects per-phase durations and failures by cause. Safe for
// concurrent use.
type stats struct {
	mu       sync.Mutex
	phases   map[string]*reservoir
	failures map[string]int
	counts   map[string]int64
}

type reservoir struct {
	n int64
	d []time.Duration
}

func newStats() *stats {
	return &stats{phases: map[string]*reservoir{}, failures: map[string]int{}, counts: map[string]int64{}}
}

func (s *stats) observe(phase string, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.phases[phase]
	if r == nil {
		r = &reservoir{}
		s.phases[phase] = r
	}
	r.n++
	if len(r.d) < maxSamples {
		r.d = append(r.d, d)
		return
	}
	if j := randN(r.n); j < maxSamples {
		r.d[j] = d
	}
}

// maxCauses bounds the failure causes kept (a cause is a short fixed
// string, but errors can carry addresses).
const maxCauses = 64

func (s *stats) fail(cause string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.failures[cause]; !ok && len(s.failures) >= maxCauses {
		cause = "other"
	}
	s.failures[cause]++
}

func (s *stats) add(counter string, n int64) {
	s.mu.Lock()
	if _, ok := s.counts[counter]; !ok && len(s.counts) >= maxCauses {
		counter = "other"
	}
	s.counts[counter] += n
	s.mu.Unlock()
}

// PhaseFigures are one phase's percentiles.
type PhaseFigures struct {
	Phase    string
	N        int64
	P50, P99 time.Duration
	Max      time.Duration
}

func (s *stats) figures() []PhaseFigures {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []PhaseFigures
	for _, p := range phaseOrder {
		r := s.phases[p]
		if r == nil || len(r.d) == 0 {
			continue
		}
		d := slices.Clone(r.d)
		slices.Sort(d)
		pct := func(q float64) time.Duration { return d[min(len(d)-1, int(q*float64(len(d))))] }
		out = append(out, PhaseFigures{Phase: p, N: r.n, P50: pct(0.50), P99: pct(0.99), Max: d[len(d)-1]})
	}
	return out
}

func randN(n int64) int64 { return rand.Int64N(n) }

// n is how many samples a phase has had.
func (s *stats) n(phase string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.phases[phase]; r != nil {
		return r.n
	}
	return 0
}
