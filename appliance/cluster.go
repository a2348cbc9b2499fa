package appliance

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"

	fleetv1 "github.com/corralhq/corral/api/fleet/v1"
	"github.com/corralhq/corral/boot/dhcp"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/store/etcd"
	"golang.org/x/sync/errgroup"
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

// owns reports whether this appliance runs machine's per-machine work (the
// boot watchdog, power polling): always when alone; in a fleet, when the
// leader's dispatch gave the machine to this appliance.
func (s *Server) owns(machine string) bool {
	if s.owner == nil {
		return true
	}
	return s.owner(machine)
}

// FleetConfig names this appliance among several sharing a store.
type FleetConfig struct {
	// Name is this appliance's name in the fleet (default the host name).
	Name string
	// BMCNetworks are the networks (CIDR) from which this appliance
	// reaches BMCs; empty = any. The leader prefers appliances whose
	// networks hold a machine's BMC for its per-machine work.
	BMCNetworks []string
}

func (c *FleetConfig) fill() error {
	if c.Name == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("appliance name: %w (set --appliance-name)", err)
		}
		c.Name = h
	}
	if err := inventory.CheckName(c.Name); err != nil {
		return fmt.Errorf("--appliance-name: %w", err)
	}
	for _, n := range c.BMCNetworks {
		if _, _, err := net.ParseCIDR(n); err != nil {
			return fmt.Errorf("--bmc-network %q: want a CIDR such as 10.0.0.0/24", n)
		}
	}
	return nil
}

// initLeadership picks how this appliance decides whether it leads: always
// on its own bbolt file, through an etcd election on a shared store.
func (s *Server) initLeadership() error {
	es, ok := s.store.(*etcd.Store)
	if !ok {
		s.leadership = solo{name: s.cfg.Fleet.Name}
		return nil
	}
	el, err := etcd.NewElector(es, s.cfg.Fleet.Name, s.cfg.Store.LeaseTTL, s.log.With("component", "election"))
	if err != nil {
		return err
	}
	s.leadership = el
	return nil
}

// runSingletons runs the singleton work whenever this appliance leads,
// until ctx ends: campaign, run every singleton under the lead's context,
// and when the lead is lost wait for them all to stop before campaigning
// again, so two appliances never run them at once for longer than the
// lease allows. A singleton's error stops the appliance, as a component's
// does.
func (s *Server) runSingletons(ctx context.Context) error {
	s.single.mu.Lock()
	list := slices.Clone(s.single.list)
	s.single.mu.Unlock()
	if len(list) == 0 {
		return nil
	}
	for {
		lctx, err := s.leadership.Lead(ctx)
		if err != nil {
			select {
			case <-ctx.Done():
				return nil
			default:
				return fmt.Errorf("leader election: %w", err)
			}
		}
		s.obs.Leading(true)
		if _, alone := s.leadership.(solo); !alone {
			s.log.Info("leader: starting singleton work", "appliance", s.cfg.Fleet.Name, "count", len(list))
		}
		g, gctx := errgroup.WithContext(lctx)
		for _, c := range list {
			g.Go(func() error {
				if err := c.run(gctx); err != nil {
					return fmt.Errorf("%s: %w", c.name, err)
				}
				return nil
			})
		}
		err = g.Wait()
		s.obs.Leading(false)
		if err != nil && ctx.Err() == nil && lctx.Err() == nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		default:
		}
		s.log.Warn("no longer leader: singleton work stopped; campaigning again", "appliance", s.cfg.Fleet.Name)
	}
}

// selfAppliance is this appliance's runner record spec: its name, the API
// endpoint agents, nodes and peers dial, the boot segments it serves and
// the BMC networks it reaches.
func (s *Server) selfAppliance() *fleetv1.Appliance {
	a := &fleetv1.Appliance{Name: s.cfg.Fleet.Name, ApiEndpoint: s.advertisedEndpoint(), BmcNetworks: s.cfg.Fleet.BMCNetworks}
	if ifname := s.cfg.Boot.Interface; ifname != "" {
		if ifi, err := net.InterfaceByName(ifname); err == nil {
			addrs, _ := ifi.Addrs()
			for _, ad := range addrs {
				if n, ok := ad.(*net.IPNet); ok && n.IP.To4() != nil {
					a.BootSegments = append(a.BootSegments, (&net.IPNet{IP: n.IP.Mask(n.Mask), Mask: n.Mask}).String())
				}
			}
		}
	}
	return a
}

// advertisedEndpoint is the API host:port other machines reach this
// appliance at: --api-advertise, else the listen address when it names a
// host, else the boot interface's address, else loopback (an appliance
// alone on a workstation).
func (s *Server) advertisedEndpoint() string {
	if ep := s.cfg.Lifecycle.APIAdvertise; ep != "" {
		return ep
	}
	_, port, _ := net.SplitHostPort(s.lis.Addr().String())
	if h, _, _ := net.SplitHostPort(s.cfg.APIListen); h != "" && !isUnspecified(h) {
		return net.JoinHostPort(h, port)
	}
	if ifname := s.cfg.Boot.Interface; ifname != "" {
		if ip, err := dhcp.InterfaceIPv4(ifname); err == nil {
			return net.JoinHostPort(ip.String(), port)
		}
	}
	return s.endpoint()
}
