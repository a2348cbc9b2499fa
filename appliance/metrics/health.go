package metrics

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/corralhq/corral/store"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// readinessProbeKey is read to learn whether the store answers; it is
// never written (a missing key answers as well as any).
const readinessProbeKey = "/health/probe"

// readiness says whether the appliance can serve: the store answers a read
// within readyStoreTimeout and every boot server it runs is serving.
// Store checks are shared: callers within storeCheckReuse of the last one
// take its result, so probes from the LAN cannot turn into store load.
type readiness struct {
	store store.Store

	mu    sync.Mutex
	boot  []bootFlag
	at    time.Time // last store check
	cause string    // its result ("" = answered)
}

type bootFlag struct {
	name    string
	running *atomic.Bool
}

const storeCheckReuse = time.Second

// track registers a boot server; the returned flag is true while it runs.
func (r *readiness) track(name string) *atomic.Bool {
	f := &atomic.Bool{}
	r.mu.Lock()
	r.boot = append(r.boot, bootFlag{name: name, running: f})
	r.mu.Unlock()
	return f
}

// bootServing reports the boot servers that are not serving ("" = all
// serve).
func (r *readiness) bootServing() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var down []string
	for _, b := range r.boot {
		if !b.running.Load() {
			down = append(down, b.name)
		}
	}
	if len(down) == 0 {
		return ""
	}
	return "boot servers not serving: " + strings.Join(down, ", ")
}

// storeAnswers reads the probe key within readyStoreTimeout and returns
// why the store did not answer ("" = it did). A fresh result of another
// caller is reused.
func (r *readiness) storeAnswers(ctx context.Context) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.at.IsZero() && time.Since(r.at) < storeCheckReuse {
		return r.cause
	}
	ctx, cancel := context.WithTimeout(ctx, readyStoreTimeout)
	defer cancel()
	_, err := r.store.Get(ctx, readinessProbeKey)
	r.at, r.cause = time.Now(), ""
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		r.cause = fmt.Sprintf("store does not answer within %s: %v", readyStoreTimeout, err)
	}
	return r.cause
}

// check returns why the appliance is not ready ("" = ready).
func (r *readiness) check(ctx context.Context) string {
	var why []string
	if c := r.storeAnswers(ctx); c != "" {
		why = append(why, c)
	}
	if c := r.bootServing(); c != "" {
		why = append(why, c)
	}
	return strings.Join(why, "; ")
}

func servingStatus(ok bool) healthpb.HealthCheckResponse_ServingStatus {
	if ok {
		return healthpb.HealthCheckResponse_SERVING
	}
	return healthpb.HealthCheckResponse_NOT_SERVING
}

// runHealth keeps the gRPC health statuses and systemd informed until ctx
// ends: READY=1 (with a STATUS) once every boot server serves, then every
// HealthInterval a store check that sets every service SERVING or
// NOT_SERVING and, while the store answers and systemd asked for a
// watchdog, WATCHDOG=1 at half its period; at the end NOT_SERVING for
// everything and STOPPING=1. Without NOTIFY_SOCKET the notifications are
// no-ops.
func (o *Metrics) runHealth(ctx context.Context) error {
	log := o.log.With("component", "health")
	interval := o.cfg.HealthInterval
	if interval <= 0 {
		interval = 5 * time.Second
	}
	wd, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		log.Warn("systemd watchdog settings unreadable; not sending WATCHDOG=1", "err", err)
	}
	if wd > 0 {
		interval = min(interval, wd/2)
	}
	notify := func(state string) {
		if _, err := daemon.SdNotify(false, state); err != nil {
			log.Warn("systemd notification not sent", "state", strings.SplitN(state, "\n", 2)[0], "err", err)
		}
	}
	defer func() {
		o.deps.Health.Shutdown()
		notify("STOPPING=1\nSTATUS=shutting down")
	}()

	// READY=1 once the boot servers serve (the gRPC listener is bound
	// since New, and Serve starts beside this component).
	tick := time.NewTicker(20 * time.Millisecond)
	for o.ready.bootServing() != "" {
		select {
		case <-ctx.Done():
			tick.Stop()
			return nil
		case <-tick.C:
		}
	}
	tick.Stop()
	status := "serving API on " + o.deps.APIAddr.String()
	if a := o.Addr(); a != nil {
		status += ", metrics on " + a.String()
	}
	notify("READY=1\nSTATUS=" + status)
	log.Debug("ready", "status", status, "health_interval", interval.String(), "watchdog", wd.String())

	serving := true
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		cause := o.ready.storeAnswers(ctx)
		if ok := cause == ""; ok != serving {
			serving = ok
			o.setAllHealth(ok)
			if ok {
				log.Info("store answers again: gRPC health SERVING")
				notify("STATUS=" + status)
			} else {
				log.Warn("store does not answer: gRPC health NOT_SERVING", "cause", cause)
				notify("STATUS=store unreachable: " + cause)
			}
		}
		if serving && wd > 0 {
			notify("WATCHDOG=1")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// setAllHealth sets every registered service's (and the server's) gRPC
// health.
func (o *Metrics) setAllHealth(ok bool) {
	names := []string{""}
	for name := range o.deps.Services.GetServiceInfo() {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, n := range names {
		o.deps.Health.SetServingStatus(n, servingStatus(ok))
	}
}

// promhttpHandler serves reg's metrics: at most two scrapes at once (more
// get 503), each within 10 s; errors are logged and the rest is served.
func promhttpHandler(reg *prometheus.Registry, log *slog.Logger) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog:            newLogLogger(log),
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 2,
		Timeout:             10 * time.Second,
	})
}

func newLogLogger(l *slog.Logger) *log.Logger {
	return slog.NewLogLogger(l.Handler(), slog.LevelWarn)
}
