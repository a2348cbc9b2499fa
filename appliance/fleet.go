package appliance

import (
	"context"
	"fmt"

	fleetv1 "github.com/corralhq/corral/api/fleet/v1"
	"github.com/corralhq/corral/fleet"
)

// initFleet wires this appliance into the fleet (docs/DESIGN.md §7): its
// runner record and heartbeat (every appliance), the owner that follows
// the assignments and filters the power poller (every appliance), the
// dispatcher of per-machine work (leader only), and ApplianceService.
// self is this appliance's spec (name, API endpoint, boot segments, BMC
// networks, version); solo says it is alone on its store (bbolt) and owns
// every machine.
func (s *Server) initFleet(self *fleetv1.Appliance, solo bool) error {
	if err := fleet.CheckAppliance(self); err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	log := s.log.With("component", "fleet")
	name := self.GetName()
	s.fleetSelf = self // initBoot adds the DHCP segments before the runner starts
	owner := &fleet.Owner{Store: s.store, Self: name, Solo: solo, Logger: log}
	runner := &fleet.Runner{Store: s.store, Self: self, Load: owner.Count, Logger: log}
	dispatcher := &fleet.Dispatcher{Store: s.store, Self: name, Logger: log}
	svc := &fleet.Service{Store: s.store, FetchArtifact: s.artifacts.FetchArtifact, Leader: func(ctx context.Context) (string, error) {
		if s.leadership == nil {
			return name, nil
		}
		return s.leadership.Leader(ctx)
	}}
	fleet.Register(s.grpc, svc)
	s.addComponent("fleet-owner", owner.Run)
	s.addComponent("fleet-runner", runner.Run)
	s.addSingleton("dispatcher", dispatcher.Run)
	s.owner = owner.Owns
	s.runner = owner.Runner
	if !solo && s.peers == nil {
		peers := &fleet.Peers{Store: s.store, Self: name}
		s.peers = peers.Endpoints
	}
	return nil
}
