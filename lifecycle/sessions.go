package lifecycle

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sync"
	"time"

	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/internal/lograte"
)

// Agent session rules (docs/security.md, "Per-boot credentials", copies this).
//
// Register returns a session id; the agent's Session stream presents it in
// its first message. The id is bound to the caller that registered (its
// token id, or a node certificate's name) and to the machine: another
// caller presenting it is refused, so a session id read off one agent is
// worth nothing to anyone else. An id is used once (a stream that ends
// makes the agent register again), expires unused after
// AgentLimits.SessionIDTTL, and is replaced when its machine registers
// again. The ids waiting for their stream are bounded
// (AgentLimits.MaxPendingSessions, the oldest evicted with a log line).
//
// One stream per machine. A second stream for a machine whose stream is
// alive is refused with FailedPrecondition and the refusal is put on the
// machine's timeline; it is not the new stream that wins. Alive means its
// RPC has not ended and its last heartbeat (or its start) is within
// AgentLimits.HeartbeatTimeout (default 30 s: three of the agent's 10 s
// heartbeats). Why refuse rather than replace: the discovery token is
// public on the boot LAN and a machine's serial is no secret, so whoever
// can register as a machine could, if the newest stream won, take the
// session of the agent actually running on it — and with it the install
// plan and the node certificate. Refusing keeps the install with the
// agent that holds the session; the cost is that an agent whose connection
// died without a reset waits up to the heartbeat timeout before its new
// stream is taken (it retries with backoff anyway). A stream found dead is
// closed and replaced.
//
// Install and wipe plans are sent only to a stream whose Register matched
// the machine by its identity: the serial or system UUID recorded on the
// machine, or a machine with neither recorded (inventory.Register refuses
// every other report, so an admitted one is identified; the stream keeps
// the fact so that a plan can never go to one that is not).

// Agent edge defaults (AgentLimits).
const (
	DefaultAgentHeartbeatTimeout = 30 * time.Second
	DefaultSessionIDTTL          = 10 * time.Minute
	DefaultMaxPendingSessions    = 10000
	DefaultMaxProgressBytes      = 4 << 10
)

// AgentLimits bound the agent edge. Zero values take the defaults.
type AgentLimits struct {
	// HeartbeatTimeout is how long a session stream counts as alive after
	// its last heartbeat (--agent-heartbeat-timeout).
	HeartbeatTimeout time.Duration
	// SessionIDTTL is how long a session id from Register waits for its
	// stream (--agent-session-id-ttl).
	SessionIDTTL time.Duration
	// MaxPendingSessions bounds the session ids waiting for their stream
	// (--agent-max-pending-sessions).
	MaxPendingSessions int
	// MaxProgressBytes caps each of a progress message's step, detail and
	// error (--agent-max-progress-bytes); longer ones are truncated with a
	// marker before they reach the timeline or the store.
	MaxProgressBytes int
}

func (a *AgentLimits) setDefaults() {
	if a.HeartbeatTimeout <= 0 {
		a.HeartbeatTimeout = DefaultAgentHeartbeatTimeout
	}
	if a.SessionIDTTL <= 0 {
		a.SessionIDTTL = DefaultSessionIDTTL
	}
	if a.MaxPendingSessions <= 0 {
		a.MaxPendingSessions = DefaultMaxPendingSessions
	}
	if a.MaxProgressBytes <= 0 {
		a.MaxProgressBytes = DefaultMaxProgressBytes
	}
}

// sessions tracks the agents connected to this appliance: the session ids
// Register handed out and the command channel of each open stream. It is
// process-local by nature (a stream lives on one appliance); no shared
// record is kept here. Every map is bounded: pending by
// MaxPendingSessions, the others by the machines with a stream.
type sessions struct {
	lim AgentLimits
	log *slog.Logger

	mu        sync.Mutex
	pending   map[string]pendingSession // session id -> what Register learned
	byMachine map[string]string         // machine -> its pending session id
	streams   map[string]*stream        // machine -> its open stream
	seen      map[string]time.Time      // machine -> last persisted last_seen
	local     map[string]string         // machine -> appliance address its agent dialled

	evictLog *lograte.Gate // pending ids evicted
	warnGate *lograte.Gate // the agent edge's refusal log lines (Lifecycle.warn)
	noteGate *lograte.Gate // the agent edge's refusal timeline entries (Lifecycle.note)
}

// pendingSession is what Register learned about the agent a session id
// was given to.
type pendingSession struct {
	machine    string
	mac        string // the machine's boot MAC: its timeline key
	owner      string // the caller that registered (callerKey)
	identified bool
	kexec      bool // the agent named the kexec capability
	prefetch   bool // and the kexec-prefetch one
	created    time.Time
}

// stream is a machine's open Session stream.
type stream struct {
	ch         chan *nodev1.ApplianceMessage
	since      time.Time
	beat       time.Time // last heartbeat
	identified bool
	kexec      bool // its agent carries out KexecPlans
	prefetch   bool // and takes one while the install it follows runs
	owner      string
	done       <-chan struct{} // closed when its RPC ends
}

func newSessions(lim AgentLimits, log *slog.Logger) *sessions {
	lim.setDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &sessions{lim: lim, log: log,
		pending: map[string]pendingSession{}, byMachine: map[string]string{}, streams: map[string]*stream{},
		seen: map[string]time.Time{}, local: map[string]string{},
		evictLog: lograte.NewGate(time.Minute, 1), warnGate: lograte.NewGate(time.Second, 10), noteGate: lograte.NewGate(50*time.Millisecond, 100)}
}

// open hands out a session id for machine's agent, registered by owner
// (kexec: it named the kexec capability; prefetch: the kexec-prefetch one
// too). An older id of the machine that was never used expires now.
func (s *sessions) open(machine, mac, owner string, identified, kexec, prefetch bool, now time.Time) string {
	b := make([]byte, 16)
	rand.Read(b)
	id := hex.EncodeToString(b)
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.byMachine[machine]; ok {
		delete(s.pending, old)
	}
	if len(s.pending) >= s.lim.MaxPendingSessions {
		s.purgeLocked(now)
	}
	for len(s.pending) >= s.lim.MaxPendingSessions {
		s.evictOldestLocked()
	}
	s.pending[id] = pendingSession{machine: machine, mac: mac, owner: owner, identified: identified, kexec: kexec, prefetch: kexec && prefetch, created: now}
	s.byMachine[machine] = id
	// Register (the only caller) has just written last_seen in its own
	// machine mutation: the session's first heartbeat need not write it
	// again (one CAS of the machine record, facts and all, per boot).
	s.noteSeenLocked(machine, now)
	return id
}

// purgeLocked drops expired pending ids.
func (s *sessions) purgeLocked(now time.Time) {
	for id, p := range s.pending {
		if now.Sub(p.created) > s.lim.SessionIDTTL {
			s.dropLocked(id, p)
		}
	}
}

func (s *sessions) dropLocked(id string, p pendingSession) {
	delete(s.pending, id)
	if s.byMachine[p.machine] == id {
		delete(s.byMachine, p.machine)
	}
}

// evictOldestLocked drops the oldest pending id (the table is full of live
// ones) and logs that the bound bit, at most once a minute.
func (s *sessions) evictOldestLocked() {
	var oldID string
	var old pendingSession
	for id, p := range s.pending {
		if oldID == "" || p.created.Before(old.created) {
			oldID, old = id, p
		}
	}
	s.dropLocked(oldID, old)
	if dropped, ok := s.evictLog.Allow(); ok {
		s.log.Warn("agent session table full: the oldest unused session id evicted (raise --agent-max-pending-sessions if this is not an attack)",
			"max", s.lim.MaxPendingSessions, "machine", old.machine, "suppressed", dropped)
	}
}

// take consumes a session id presented by owner: it returns what Register
// learned, or found=false for an unknown, used or expired id. An id
// presented by another caller than the one it was issued to is returned
// with mine=false and stays pending (a stranger cannot burn it).
func (s *sessions) take(id, owner string, now time.Time) (p pendingSession, found, mine bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.pending[id]
	if !ok {
		return pendingSession{}, false, false
	}
	if now.Sub(p.created) > s.lim.SessionIDTTL {
		s.dropLocked(id, p)
		return pendingSession{}, false, false
	}
	if p.owner != owner {
		return p, true, false
	}
	s.dropLocked(id, p)
	return p, true, true
}

// attach registers a stream's command channel for machine. When another
// stream of the machine is alive it returns ErrPrecondition and that
// stream's age; a dead one is closed and replaced. done is closed when
// the new stream's RPC ends.
func (s *sessions) attach(machine string, p pendingSession, now time.Time, localAddr string, done <-chan struct{}) (*stream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.streams[machine]; ok {
		if s.aliveLocked(old, now) {
			return nil, apierr.Preconditionf("machine %s already has a live agent session (last heartbeat %s ago, started %s ago): a second session is refused while it is alive (within %s of its last heartbeat)",
				machine, now.Sub(old.beat).Round(time.Second), now.Sub(old.since).Round(time.Second), s.lim.HeartbeatTimeout)
		}
		close(old.ch)
		delete(s.streams, machine)
	}
	st := &stream{ch: make(chan *nodev1.ApplianceMessage, 8), since: now, beat: now, identified: p.identified, kexec: p.kexec, prefetch: p.prefetch, owner: p.owner, done: done}
	s.streams[machine] = st
	if localAddr != "" {
		s.local[machine] = localAddr
	}
	return st, nil
}

func (s *sessions) aliveLocked(st *stream, now time.Time) bool {
	select {
	case <-st.done:
		return false
	default:
	}
	return now.Sub(st.beat) <= s.lim.HeartbeatTimeout
}

// beat notes a heartbeat of st; it reports false when st is no longer its
// machine's stream (replaced after it was found dead).
func (s *sessions) beat(machine string, st *stream, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.streams[machine] != st {
		return false
	}
	st.beat = now
	return true
}

// current reports whether st is still machine's stream.
func (s *sessions) current(machine string, st *stream) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.streams[machine] == st
}

func (s *sessions) detach(machine string, st *stream) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.streams[machine]; ok && cur == st {
		delete(s.streams, machine)
		close(st.ch)
	}
}

// send queues a command for a machine's connected agent. It returns
// ErrUnavailable when no agent of that machine is connected here or its
// queue is full, and ErrPermissionDenied for an install or wipe plan when
// the connected agent did not register with the machine's identity.
func (s *sessions) send(machine string, msg *nodev1.ApplianceMessage) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.streams[machine]
	if !ok {
		return apierr.ErrUnavailable
	}
	switch msg.GetCmd().(type) {
	case *nodev1.ApplianceMessage_Kexec:
		if !st.identified || !st.kexec {
			return apierr.PermissionDeniedf("machine %s: the connected agent did not register with the machine's identity and the kexec capability", machine)
		}
	case *nodev1.ApplianceMessage_Install, *nodev1.ApplianceMessage_Wipe:
		if !st.identified {
			s.log.Warn("plan not sent: the connected agent did not register with the machine's identity", "machine", machine)
			return apierr.PermissionDeniedf("machine %s: the connected agent did not register with the machine's identity", machine)
		}
	}
	select {
	case st.ch <- msg:
		return nil
	default:
		return apierr.ErrUnavailable
	}
}

// connected reports whether an agent of machine has a session open here.
func (s *sessions) connected(machine string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.streams[machine]
	return ok
}

// canKexec reports whether machine's open session registered with the
// machine's identity and the kexec capability.
func (s *sessions) canKexec(machine string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.streams[machine]
	return ok && st.identified && st.kexec
}

// canPrefetch reports whether machine's open session can kexec and named
// the kexec-prefetch capability.
func (s *sessions) canPrefetch(machine string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.streams[machine]
	return ok && st.identified && st.kexec && st.prefetch
}

// connectedSince says when the machine's open session attached.
func (s *sessions) connectedSince(machine string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.streams[machine]
	if !ok {
		return time.Time{}, false
	}
	return st.since, true
}

// endpoint is the appliance address (host:port) the machine's agent last
// dialled for its session, or "" when none is known. It is the endpoint
// the boot script gave that agent.
func (s *sessions) endpoint(machine string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.local[machine]
}

// seenDue reports whether machine's last_seen should be persisted now (at
// most once a minute per machine) and notes it.
func (s *sessions) seenDue(machine string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.Sub(s.seen[machine]) < seenEvery {
		return false
	}
	s.noteSeenLocked(machine, now)
	return true
}

// seenEvery is how often a machine's last_seen is persisted; maxSeen
// bounds the table that remembers when it last was. An entry older than
// seenEvery means the same as none, so a full table first drops those,
// and if every entry is younger (more machines beating in seenEvery than
// the bound) it starts over: that costs extra writes, never memory.
const (
	seenEvery = time.Minute
	maxSeen   = 1 << 16
)

func (s *sessions) noteSeenLocked(machine string, now time.Time) {
	if _, ok := s.seen[machine]; !ok && len(s.seen) >= maxSeen {
		for m, t := range s.seen {
			if now.Sub(t) >= seenEvery {
				delete(s.seen, m)
			}
		}
		if len(s.seen) >= maxSeen {
			clear(s.seen)
		}
	}
	s.seen[machine] = now
}

// pendingCount is how many session ids wait for their stream (tests).
func (s *sessions) pendingCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pending)
}

// Validate refuses negative limits (corrald's flags); zero means default.
func (a AgentLimits) Validate() error {
	switch {
	case a.HeartbeatTimeout < 0:
		return fmt.Errorf("--agent-heartbeat-timeout %s: must not be negative", a.HeartbeatTimeout)
	case a.SessionIDTTL < 0:
		return fmt.Errorf("--agent-session-id-ttl %s: must not be negative", a.SessionIDTTL)
	case a.MaxPendingSessions < 0:
		return fmt.Errorf("--agent-max-pending-sessions %d: must not be negative", a.MaxPendingSessions)
	case a.MaxProgressBytes < 0:
		return fmt.Errorf("--agent-max-progress-bytes %d: must not be negative", a.MaxProgressBytes)
	case a.MaxProgressBytes > 0 && a.MaxProgressBytes < 64:
		return fmt.Errorf("--agent-max-progress-bytes %d: at least 64 (room for the truncation marker)", a.MaxProgressBytes)
	}
	return nil
}
