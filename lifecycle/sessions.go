package lifecycle

import (
	"crypto/rand"
	"encoding/hex"
	"sync"
	"time"

	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/internal/apierr"
)

// sessions tracks the agents connected to this appliance: which session id
// belongs to which machine, and the command channel of each open stream.
// It is process-local by nature (a stream lives on one appliance); no
// shared record is kept here.
type sessions struct {
	mu      sync.Mutex
	byID    map[string]sessionID
	streams map[string]chan *nodev1.ApplianceMessage
	seen    map[string]time.Time // machine -> last persisted last_seen
	since   map[string]time.Time // machine -> when its open stream attached
	local   map[string]string    // machine -> appliance address its agent dialled
}

// sessionID is what Register learned about the agent a session id was
// given to.
type sessionID struct {
	machine string
	mac     string // the machine's boot MAC: its timeline key
}

func newSessions() *sessions {
	return &sessions{byID: map[string]sessionID{}, streams: map[string]chan *nodev1.ApplianceMessage{}, seen: map[string]time.Time{}, since: map[string]time.Time{}, local: map[string]string{}}
}

func (s *sessions) open(machine, mac string) string {
	b := make([]byte, 16)
	rand.Read(b)
	id := hex.EncodeToString(b)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.byID[id] = sessionID{machine: machine, mac: mac}
	return id
}

func (s *sessions) lookup(id string) (sessionID, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.byID[id]
	return m, ok
}

// attach registers a stream's command channel for machine, replacing (and
// closing) an older stream of the same machine.
func (s *sessions) attach(machine string, now time.Time, localAddr string) chan *nodev1.ApplianceMessage {
	ch := make(chan *nodev1.ApplianceMessage, 8)
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.streams[machine]; ok {
		close(old)
	}
	s.streams[machine] = ch
	s.since[machine] = now
	if localAddr != "" {
		s.local[machine] = localAddr
	}
	return ch
}

func (s *sessions) detach(machine string, ch chan *nodev1.ApplianceMessage) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.streams[machine]; ok && cur == ch {
		delete(s.streams, machine)
		delete(s.since, machine)
		close(ch)
	}
}

// send queues a command for a machine's connected agent. It returns
// ErrUnavailable when no agent of that machine is connected here.
func (s *sessions) send(machine string, msg *nodev1.ApplianceMessage) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch, ok := s.streams[machine]
	if !ok {
		return apierr.ErrUnavailable
	}
	select {
	case ch <- msg:
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

// connectedSince says when the machine's open session attached.
func (s *sessions) connectedSince(machine string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.since[machine]
	return t, ok
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
	if now.Sub(s.seen[machine]) < time.Minute {
		return false
	}
	s.seen[machine] = now
	return true
}
