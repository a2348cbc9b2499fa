package server

import (
	"context"
	"sync"
)

// Leadership is this appliance's place in the fleet: whether it leads (runs
// the singleton work) and who does. A single appliance on its bbolt file
// always leads; appliances on etcd campaign through an etcd election
// (store/etcd's Elector).
type Leadership interface {
	// Lead blocks until this appliance leads, then returns a context that
	// ends when leadership is lost (or ctx ends).
	Lead(ctx context.Context) (context.Context, error)
	// Leader names the current leader ("" while none is elected).
	Leader(ctx context.Context) (string, error)
}

// solo is the Leadership of an appliance alone on its store: it always
// leads.
type solo struct{ name string }

func (s solo) Lead(ctx context.Context) (context.Context, error) { return ctx, nil }

func (s solo) Leader(context.Context) (string, error) { return s.name, nil }

// singletons is the work only the leader runs: reconcilers, sweeps,
// expiry, purges, the dispatcher. Components registered with addSingleton
// start when this appliance becomes leader and stop when it loses the lead.
type singletons struct {
	mu   sync.Mutex
	list []component
}

// addSingleton registers leader-only work for Run.
func (s *Server) addSingleton(name string, run func(ctx context.Context) error) {
	s.single.mu.Lock()
	defer s.single.mu.Unlock()
	s.single.list = append(s.single.list, component{name: name, run: run})
}

// peerEndpoints are the API endpoints (host:port) of the other live
// appliances of the fleet, for boot scripts and install plans to name after
// this appliance's own, so agents and nodes can fail over. An appliance
// alone has none.
func (s *Server) peerEndpoints(ctx context.Context) []string {
	if s.peers == nil {
		return nil
	}
	return s.peers(ctx)
}
