package appliance

import (
	"context"
	"net"
	"slices"

	"github.com/corralhq/corral/appliance/metrics"
)

// MetricsConfig configures /metrics, /healthz and /readyz (package
// metrics).
type MetricsConfig = metrics.Config

// runGroup adds components to s for Run: the run group the feature
// packages take.
type runGroup struct{ s *Server }

func (g runGroup) Add(name string, run func(ctx context.Context) error) { g.s.addComponent(name, run) }

// bootComponents are the components readiness waits for.
var bootComponents = []string{"dhcp", "tftp", "boot-http"}

// startMetrics hands the boot servers to readiness and starts the health
// loop and the metrics listener; it runs last in New, when every service
// is registered.
func (s *Server) startMetrics() error {
	// The boot servers bound their sockets in New; they serve once their
	// component runs. Readiness and READY=1 wait for that.
	for i, c := range s.components {
		if slices.Contains(bootComponents, c.name) {
			s.components[i].run = s.obs.TrackBoot(c.name, c.run)
		}
	}
	return s.obs.Start(metrics.Deps{Store: s.store, Services: s.grpc, Health: s.health, APIAddr: s.lis.Addr(), Run: runGroup{s}})
}

// MetricsAddr is the bound metrics and health address (nil: off).
func (s *Server) MetricsAddr() net.Addr { return s.obs.Addr() }
