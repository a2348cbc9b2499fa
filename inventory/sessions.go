package inventory

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
)

// sessions tracks the agents connected to this appliance: which session id
// belongs to which machine, and the command channel of each open stream.
// It is process-local by nature (a stream lives on one appliance); no
// shared record is kept here.
type sessions struct {
	mu      sync.Mutex
	byID    map[string]string // session id -> machine
	streams map[string]chan *nodev1.ApplianceMessage
	seen    map[string]time.Time // machine -> last persisted last_seen
	since   map[string]time.Time // machine -> when its open stream attached
	local   map[string]string    // machine -> appliance address its agent dialled
}

func newSessions() *sessions {
	return &sessions{byID: map[string]string{}, streams: map[string]chan *nodev1.ApplianceMessage{}, seen: map[string]time.Time{}, since: map[string]time.Time{}, local: map[string]string{}}
}

func (s *sessions) open(machine string) string {
	b := make([]byte, 16)
	rand.Read(b)
	id := hex.EncodeToString(b)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.byID[id] = machine
	return id
}

func (s *sessions) machine(id string) (string, bool) {
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

// Send queues a command for a machine's connected agent. It returns
// ErrUnavailable when no agent of that machine is connected here.
func (i *Inventory) Send(machine string, msg *nodev1.ApplianceMessage) error {
	s := i.sess
	s.mu.Lock()
	defer s.mu.Unlock()
	ch, ok := s.streams[machine]
	if !ok {
		return ErrUnavailable
	}
	select {
	case ch <- msg:
		return nil
	default:
		return ErrUnavailable
	}
}

// Connected reports whether an agent of machine has a session open here.
func (i *Inventory) Connected(machine string) bool {
	i.sess.mu.Lock()
	defer i.sess.mu.Unlock()
	_, ok := i.sess.streams[machine]
	return ok
}

// connectedSince says when the machine's open session attached.
func (i *Inventory) connectedSince(machine string) (time.Time, bool) {
	i.sess.mu.Lock()
	defer i.sess.mu.Unlock()
	t, ok := i.sess.since[machine]
	return t, ok
}

// SessionEndpoint is the appliance address (host:port) the machine's agent
// last dialled for its session, or "" when none is known. It is the
// endpoint the boot script gave that agent.
func (i *Inventory) SessionEndpoint(machine string) string {
	i.sess.mu.Lock()
	defer i.sess.mu.Unlock()
	return i.sess.local[machine]
}

// heartbeat records that machine's agent is alive, persisting last_seen at
// most once a minute per machine.
func (i *Inventory) heartbeat(ctx context.Context, machine string) {
	now := i.cfg.Now()
	i.sess.mu.Lock()
	last := i.sess.seen[machine]
	due := now.Sub(last) >= time.Minute
	if due {
		i.sess.seen[machine] = now
	}
	i.sess.mu.Unlock()
	if !due {
		return
	}
	_, err := i.UpdateMachine(ctx, machine, func(m *inventoryv1.Machine) error {
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		m.Annotations[AnnotationLastSeen] = now.UTC().Format("2006-01-02T15:04:05Z")
		return nil
	})
	if err != nil {
		i.log.Debug("last_seen not updated", "machine", machine, "err", err)
	}
}
