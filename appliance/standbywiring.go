package appliance

import (
	"context"
	"time"

	fleetv1 "github.com/corralhq/corral/api/fleet/v1"
	"github.com/corralhq/corral/lifecycle/standby"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
)

// standbyClaimFresh is how recent a fleet peer's agent-session claim must
// be for the standby controller to count the machine as booted (kip's
// healthy timeout).
const standbyClaimFresh = 90 * time.Second

// initStandby wires standby pools (package lifecycle/standby):
// StandbyPoolService on every appliance, the controller as the leader's
// singleton work, its power actions through the lifecycle's
// compare-and-swap paths; release's default erase level is the pool's.
// Call it after initLifecycle.
func (s *Server) initStandby() error {
	svc := standby.NewService(s.store, nil, s.log.With("component", "standby-pools"))
	ctrl, err := standby.NewController(standby.Config{
		Pools: svc, Machines: s.inv, Power: s.lifecycle, Agents: s.agentConnected,
		WatchMachines: s.inv.WatchMachines, Interval: s.cfg.Lifecycle.StandbyInterval,
		Logger: s.log.With("component", "standby-pools"),
	})
	if err != nil {
		return err
	}
	s.standby = svc
	// Release erases a pool's machines at the pool's level by default.
	s.lifecycle.SetErasePolicy(svc)
	standby.Register(s.grpc, svc)
	s.addSingleton("standby-pools", ctrl.Run)
	return nil
}

// StandbyPools is the standby pools' service: EraseLevel(pool) is what
// release erases a pool's machines with by default.
func (s *Server) StandbyPools() *standby.Service { return s.standby }

// agentConnected reports whether machine's discovery agent holds a
// session on this appliance or, in a fleet, on a peer whose claim on it
// is fresh.
func (s *Server) agentConnected(machine string) bool {
	if s.lifecycle.AgentConnected(machine) {
		return true
	}
	if s.cfg.Store.Kind != StoreEtcd {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var sc fleetv1.SessionClaim
	if _, err := record.Get(ctx, s.store, store.SessionsPrefix+machine, &sc); err != nil {
		return false
	}
	return time.Since(sc.GetBeatAt().AsTime()) <= standbyClaimFresh
}

// agentHere reports whether machine's discovery agent holds a session on
// this appliance: allocations take such machines first (inventory's
// Config.Warm). Only this appliance's sessions are asked — an allocation
// must not wait on the store for each candidate — so on a fleet a booted
// machine whose agent is on another appliance is taken like any other.
func (s *Server) agentHere(machine string) bool {
	return s.lifecycle != nil && s.lifecycle.AgentConnected(machine)
}
