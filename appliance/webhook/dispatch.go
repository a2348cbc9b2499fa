package webhook

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	auditv1 "github.com/corralhq/corral/api/audit/v1"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	webhookv1 "github.com/corralhq/corral/api/webhook/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
)

// Defaults of Config.
const (
	DefaultQueueSize       = 1024
	DefaultMaxAttempts     = 20
	DefaultMaxAge          = 15 * time.Minute
	DefaultInitialInterval = 500 * time.Millisecond
	DefaultMaxInterval     = 30 * time.Second
	DefaultTimeout         = 10 * time.Second
	// maxResponseBody is how much of a receiver's answer is read.
	maxResponseBody = 64 << 10
)

// Config configures a Dispatcher. Zero values take the defaults above.
type Config struct {
	// Store is where receivers and the watched records live; it must keep
	// a watch history (store.HistoryWatcher).
	Store   store.Store
	Service *Service
	// Source is the CloudEvents source, e.g. corral://<appliance>.
	Source string
	// Registerer takes the webhook metrics (nil: not exported).
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// QueueSize bounds each receiver's queue; an event that finds it full
	// cuts the receiver off.
	QueueSize int
	// MaxAttempts and MaxAge bound the retries of one event; after them
	// it is dropped (counted as failed) and the next is sent.
	MaxAttempts     uint
	MaxAge          time.Duration
	InitialInterval time.Duration
	MaxInterval     time.Duration
	// Timeout bounds one attempt (connect, TLS, answer).
	Timeout time.Duration
}

// Dispatcher follows the store and posts events to the receivers. Run it
// on one appliance of a fleet only (the leader's singleton work): each
// event is then sent once, with an ID every appliance would give it.
type Dispatcher struct {
	cfg     Config
	hw      store.HistoryWatcher
	log     *slog.Logger
	metrics *dispatchMetrics

	mu      sync.Mutex
	targets map[string]*target
}

type dispatchMetrics struct {
	deliveries *prometheus.CounterVec   // receiver, outcome
	depth      *prometheus.GaugeVec     // receiver
	overflow   *prometheus.CounterVec   // receiver
	latency    *prometheus.HistogramVec // receiver
	cut        *prometheus.GaugeVec     // receiver
}

func newDispatchMetrics(reg prometheus.Registerer) *dispatchMetrics {
	m := &dispatchMetrics{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "corral_webhook_deliveries_total",
			Help: "Webhook delivery attempts by receiver and outcome (delivered; retry: an attempt failed and will be retried; failed: given up after the attempts or age allowed; rejected: the receiver answered 4xx or a redirect)."}, []string{"receiver", "outcome"}),
		depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "corral_webhook_queue_depth",
			Help: "Events waiting in a webhook receiver's queue."}, []string{"receiver"}),
		overflow: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "corral_webhook_overflow_total",
			Help: "Events dropped for a webhook receiver because its queue was full (the first cuts it off) or it was already cut off."}, []string{"receiver"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "corral_webhook_delivery_seconds",
			Help:    "Time from an event's production to its receiver's 2xx answer, retries included.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10, 60, 300}}, []string{"receiver"}),
		cut: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "corral_webhook_receiver_cut",
			Help: "1 when a webhook receiver was cut off for overflowing its queue (remove and add it again to resume)."}, []string{"receiver"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.deliveries, m.depth, m.overflow, m.latency, m.cut} {
			if err := reg.Register(c); err != nil {
				var are prometheus.AlreadyRegisteredError
				if !errors.As(err, &are) {
					panic(err)
				}
			}
		}
	}
	return m
}

// NewDispatcher checks cfg and registers the metrics.
func NewDispatcher(cfg Config) (*Dispatcher, error) {
	hw, ok := store.AsHistoryWatcher(cfg.Store)
	if !ok {
		return nil, errors.New("webhook: the store keeps no watch history")
	}
	if cfg.Service == nil {
		return nil, errors.New("webhook: no receivers' service")
	}
	cfg.QueueSize = cmp.Or(cfg.QueueSize, DefaultQueueSize)
	cfg.MaxAttempts = cmp.Or(cfg.MaxAttempts, DefaultMaxAttempts)
	cfg.MaxAge = cmp.Or(cfg.MaxAge, DefaultMaxAge)
	cfg.InitialInterval = cmp.Or(cfg.InitialInterval, DefaultInitialInterval)
	cfg.MaxInterval = cmp.Or(cfg.MaxInterval, DefaultMaxInterval)
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	cfg.Source = cmp.Or(cfg.Source, "corral://appliance")
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Dispatcher{cfg: cfg, hw: hw, log: log, metrics: newDispatchMetrics(cfg.Registerer), targets: map[string]*target{}}, nil
}

// target is one receiver as the dispatcher serves it: its queue and the
// worker that empties it.
type target struct {
	name string
	// url is fixed for the target's life (a new URL is a new target); the
	// worker reads it without the lock.
	url     string
	rec     *webhookv1.Receiver
	classes []string
	key     []byte
	client  *http.Client
	queue   chan *Event
	cut     atomic.Bool
	cancel  context.CancelFunc
	done    chan struct{}
}

// Run follows receivers, machines, nodes and the audit log until ctx
// ends, and returns nil then.
func (d *Dispatcher) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
		d.mu.Lock()
		for name, t := range d.targets {
			d.stopLocked(name, t)
		}
		d.mu.Unlock()
	}()
	recv := &follower{d: d, prefix: store.WebhooksPrefix, seed: d.seedReceivers, handle: d.receiverEvent}
	// Receivers first, so no event produced below finds them missing.
	if err := recv.start(ctx); err != nil {
		return err
	}
	ms := &machineFollower{d: d, state: map[string]string{}, health: map[string]string{}, unreachable: map[string]bool{}}
	ns := &nodeFollower{d: d, state: map[string]string{}}
	fs := []*follower{recv,
		{d: d, prefix: store.MachinesPrefix, seed: ms.seed, handle: ms.handle},
		{d: d, prefix: store.NodesPrefix, seed: ns.seed, handle: ns.handle},
		{d: d, prefix: store.AuditPrefix, handle: d.auditEvent},
	}
	for _, f := range fs[1:] {
		if err := f.start(ctx); err != nil {
			return err
		}
	}
	for _, f := range fs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.run(ctx)
		}()
	}
	<-ctx.Done()
	return nil
}

// follower follows one prefix of the store: seed sees the list it starts
// from, handle every change after it, in revision order. When the watch
// ends early (the watcher fell behind, or the history no longer reaches
// back) it resumes, re-listing if it must.
type follower struct {
	d      *Dispatcher
	prefix string
	seed   func(kvs []store.KV)
	handle func(ev store.Event)
	rev    int64
	ch     <-chan store.Event
}

func (f *follower) start(ctx context.Context) error {
	if f.seed != nil {
		kvs, rev, err := f.d.hw.ListRevision(ctx, f.prefix)
		if err != nil {
			return err
		}
		f.seed(kvs)
		f.rev = rev
	} else {
		rev, err := f.d.hw.Revision(ctx)
		if err != nil {
			return err
		}
		f.rev = rev
	}
	ch, err := f.d.hw.WatchFrom(ctx, f.prefix, f.rev)
	if err != nil {
		return err
	}
	f.ch = ch
	return nil
}

func (f *follower) run(ctx context.Context) {
	for {
		for ev := range f.ch {
			f.rev = ev.KV.Revision
			f.handle(ev)
		}
		if ctx.Err() != nil {
			return
		}
		ch, err := f.d.hw.WatchFrom(ctx, f.prefix, f.rev)
		if errors.Is(err, store.ErrCompacted) {
			f.d.log.Warn("webhook: watch history lost, re-listing", "prefix", f.prefix, "err", err)
			err = f.start(ctx)
			ch = f.ch
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			f.d.log.Warn("webhook: watch", "prefix", f.prefix, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			ch = nil
		}
		if ch == nil {
			ch = closedEvents
		}
		f.ch = ch
	}
}

var closedEvents = func() <-chan store.Event { c := make(chan store.Event); close(c); return c }()

func (d *Dispatcher) seedReceivers(kvs []store.KV) {
	for _, kv := range kvs {
		d.receiverEvent(store.Event{Type: store.EventPut, KV: kv})
	}
}

// receiverEvent starts, replaces or stops a receiver's worker.
func (d *Dispatcher) receiverEvent(ev store.Event) {
	name := strings.TrimPrefix(ev.KV.Key, store.WebhooksPrefix)
	d.mu.Lock()
	defer d.mu.Unlock()
	old := d.targets[name]
	if ev.Type == store.EventDelete {
		if old != nil {
			d.stopLocked(name, old)
			d.forget(name)
		}
		return
	}
	r := &webhookv1.Receiver{}
	if err := record.Unmarshal(ev.KV.Value, r); err != nil {
		d.log.Warn("webhook: receiver record", "webhook", name, "err", err)
		return
	}
	if old != nil && sameReceiver(old.rec, r) {
		old.rec = r
		return
	}
	if old != nil {
		d.stopLocked(name, old)
	}
	t, err := d.newTarget(r)
	if err != nil {
		d.log.Warn("webhook: receiver not served", "webhook", name, "err", err)
		return
	}
	d.targets[name] = t
	if r.GetCutAt() != nil {
		t.cut.Store(true)
		d.metrics.cut.WithLabelValues(name).Set(1)
		return
	}
	d.metrics.cut.WithLabelValues(name).Set(0)
	d.metrics.depth.WithLabelValues(name).Set(0)
	ctx, cancel := context.WithCancel(context.Background())
	t.cancel = cancel
	t.done = make(chan struct{})
	go d.work(ctx, t)
}

// sameReceiver: b is a (the same receiver) with only its counters
// changed.
func sameReceiver(a, b *webhookv1.Receiver) bool {
	return a.GetUrl() == b.GetUrl() && a.GetCreatedAt().AsTime().Equal(b.GetCreatedAt().AsTime()) &&
		bytes.Equal(a.GetSealedSecret(), b.GetSealedSecret()) && (a.GetCutAt() == nil) == (b.GetCutAt() == nil)
}

func (d *Dispatcher) stopLocked(name string, t *target) {
	if t.cancel != nil {
		t.cancel()
		<-t.done
		t.cancel = nil
	}
	delete(d.targets, name)
}

func (d *Dispatcher) forget(name string) {
	for _, v := range []*prometheus.MetricVec{d.metrics.depth.MetricVec, d.metrics.cut.MetricVec} {
		v.DeletePartialMatch(prometheus.Labels{"receiver": name})
	}
}

func (d *Dispatcher) newTarget(r *webhookv1.Receiver) (*target, error) {
	key, err := d.cfg.Service.secret(r)
	if err != nil {
		return nil, err
	}
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if len(r.GetCaPem()) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(r.GetCaPem()) {
			return nil, errors.New("CA holds no certificate")
		}
		tlsCfg.RootCAs = pool
	}
	dialer := &net.Dialer{Timeout: min(d.cfg.Timeout, 5*time.Second), Control: d.cfg.Service.guard.Control(r.GetAllowBootLan())}
	tr := &http.Transport{
		Proxy:                 nil, // the guard must see the receiver's address, not a proxy's
		DialContext:           dialer.DialContext,
		TLSClientConfig:       tlsCfg,
		TLSHandshakeTimeout:   min(d.cfg.Timeout, 5*time.Second),
		ResponseHeaderTimeout: d.cfg.Timeout,
		MaxIdleConnsPerHost:   2,
		IdleConnTimeout:       90 * time.Second,
		ForceAttemptHTTP2:     true,
	}
	client := &http.Client{Transport: tr, Timeout: d.cfg.Timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return &target{name: r.GetName(), url: r.GetUrl(), rec: r, classes: r.GetEvents(), key: key, client: client,
		queue: make(chan *Event, d.cfg.QueueSize)}, nil
}

// publish hands ev to every receiver of its class. It never blocks: a
// receiver whose queue is full is cut off.
func (d *Dispatcher) publish(ev *Event) {
	body, err := Encode(ev, d.cfg.Source)
	if err != nil {
		d.log.Warn("webhook: encode", "err", err)
		return
	}
	ev.body = body
	ev.queued = time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, t := range d.targets {
		if !slices.Contains(t.classes, ev.Class) {
			continue
		}
		if t.cut.Load() {
			d.metrics.overflow.WithLabelValues(t.name).Inc()
			continue
		}
		select {
		case t.queue <- ev:
			d.metrics.depth.WithLabelValues(t.name).Inc()
		default:
			d.cutOff(t)
		}
	}
}

// cutOff marks t cut, stops its worker without waiting, drops its queue
// and records the cut on its record (in the background: the producer
// never waits on the store).
func (d *Dispatcher) cutOff(t *target) {
	if !t.cut.CompareAndSwap(false, true) {
		return
	}
	if t.cancel != nil {
		t.cancel()
	}
	dropped := uint64(1)
	for {
		select {
		case <-t.queue:
			dropped++
			continue
		default:
		}
		break
	}
	d.metrics.overflow.WithLabelValues(t.name).Add(float64(dropped))
	d.metrics.depth.WithLabelValues(t.name).Set(0)
	d.metrics.cut.WithLabelValues(t.name).Set(1)
	d.log.Warn("webhook receiver cut off: its queue is full", "webhook", t.name, "dropped", dropped)
	name := t.name
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := record.Update(ctx, d.cfg.Store, store.WebhooksPrefix+name, func() *webhookv1.Receiver { return &webhookv1.Receiver{} },
			func(r *webhookv1.Receiver, exists bool) (bool, error) {
				if !exists {
					return false, errGone
				}
				r.Overflowed += dropped
				if r.CutAt == nil {
					r.CutAt = timestamppb.Now()
					r.CutReason = fmt.Sprintf("queue of %d events full", d.cfg.QueueSize)
				}
				return false, nil
			})
		if err != nil && !errors.Is(err, errGone) {
			d.log.Warn("webhook: record the cut", "webhook", name, "err", err)
		}
	}()
}

var errGone = errors.New("receiver removed")

// work sends t's events in order, one at a time.
func (d *Dispatcher) work(ctx context.Context, t *target) {
	defer close(t.done)
	defer t.client.CloseIdleConnections()
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-t.queue:
			d.metrics.depth.WithLabelValues(t.name).Dec()
			d.deliver(ctx, t, ev)
		}
	}
}

// errRejected is a receiver's refusal (4xx but 408 and 429, or a
// redirect): not retried.
var errRejected = errors.New("rejected")

// deliver posts ev to t until it is accepted, refused, or the attempts
// or age allowed run out.
func (d *Dispatcher) deliver(ctx context.Context, t *target, ev *Event) {
	b := d.newBackOff()
	age := d.cfg.MaxAge - time.Since(ev.queued)
	if age <= 0 {
		age = time.Millisecond
	}
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		err := d.attempt(ctx, t, ev)
		if err != nil && !errors.Is(err, errRejected) && ctx.Err() == nil {
			d.metrics.deliveries.WithLabelValues(t.name, "retry").Inc()
		}
		return struct{}{}, err
	}, backoff.WithBackOff(b), backoff.WithMaxTries(d.cfg.MaxAttempts), backoff.WithMaxElapsedTime(age))
	switch {
	case err == nil:
		d.metrics.deliveries.WithLabelValues(t.name, "delivered").Inc()
		d.metrics.latency.WithLabelValues(t.name).Observe(time.Since(ev.queued).Seconds())
	case ctx.Err() != nil:
	case errors.Is(err, errRejected):
		d.metrics.deliveries.WithLabelValues(t.name, "rejected").Inc()
		d.log.Warn("webhook event rejected", "webhook", t.name, "event", ev.ID, "err", err)
	default:
		d.metrics.deliveries.WithLabelValues(t.name, "failed").Inc()
		d.log.Warn("webhook event given up", "webhook", t.name, "event", ev.ID, "err", err)
	}
}

// newBackOff is one event's retry schedule: from InitialInterval,
// doubling up to MaxInterval, each pause jittered by ±50 %.
func (d *Dispatcher) newBackOff() *backoff.ExponentialBackOff {
	b := &backoff.ExponentialBackOff{InitialInterval: d.cfg.InitialInterval, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: d.cfg.MaxInterval}
	b.Reset()
	return b
}

func (d *Dispatcher) attempt(ctx context.Context, t *target, ev *Event) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.url, bytes.NewReader(ev.body))
	if err != nil {
		return backoff.Permanent(fmt.Errorf("%w: %v", errRejected, err))
	}
	SetHeaders(req.Header, t.key, ev.ID, time.Now().Unix(), ev.body)
	req.Header.Set("User-Agent", "corral-webhook/1")
	resp, err := t.client.Do(req)
	if err != nil {
		if errors.Is(err, ErrRefused) {
			return backoff.Permanent(fmt.Errorf("%w: %v", errRejected, err))
		}
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponseBody))
	resp.Body.Close()
	switch c := resp.StatusCode; {
	case c >= 200 && c < 300:
		return nil
	case c == http.StatusRequestTimeout || c == http.StatusTooManyRequests || c >= 500:
		return fmt.Errorf("answer %d", c)
	default:
		return backoff.Permanent(fmt.Errorf("%w: answer %d", errRejected, c))
	}
}

// machineFollower turns machine records into state changes and BMC
// health conditions, in each machine's order.
type machineFollower struct {
	d      *Dispatcher
	state  map[string]string
	health map[string]string
	// unreachable: the machine's power state reads UNKNOWN (its BMC did
	// not answer the last poll).
	unreachable map[string]bool
}

func (m *machineFollower) seed(kvs []store.KV) {
	for _, kv := range kvs {
		mc := &inventoryv1.Machine{}
		if record.Unmarshal(kv.Value, mc) == nil {
			name := strings.TrimPrefix(kv.Key, store.MachinesPrefix)
			m.state[name] = mc.GetState().String()
			m.health[name] = mc.GetBmc().GetHealth().GetStatus()
			m.unreachable[name] = mc.GetPowerState() == inventoryv1.PowerState_POWER_STATE_UNKNOWN
		}
	}
}

func (m *machineFollower) handle(ev store.Event) {
	name := strings.TrimPrefix(ev.KV.Key, store.MachinesPrefix)
	prev, known := m.state[name]
	if ev.Type == store.EventDelete {
		delete(m.state, name)
		delete(m.health, name)
		delete(m.unreachable, name)
		m.d.publish(&Event{ID: EventID(ClassMachineState, ev.KV.Key, ev.KV.Revision), Class: ClassMachineState, Type: TypeMachineState,
			Subject: "machine/" + name, Time: time.Now(), Data: jsonData(map[string]any{"machine": name, "state": "DELETED", "previous_state": prev, "store_revision": ev.KV.Revision})})
		return
	}
	mc := &inventoryv1.Machine{}
	if err := record.Unmarshal(ev.KV.Value, mc); err != nil {
		return
	}
	st := mc.GetState().String()
	m.state[name] = st
	if !known || prev != st {
		data := map[string]any{"machine": name, "state": st, "previous_state": prev, "reason": mc.GetStateReason(),
			"power_state": mc.GetPowerState().String(), "store_revision": ev.KV.Revision}
		m.d.publish(&Event{ID: EventID(ClassMachineState, ev.KV.Key, ev.KV.Revision), Class: ClassMachineState, Type: TypeMachineState,
			Subject: "machine/" + name, Time: time.Now(), Data: jsonData(data)})
	}
	if un, was := mc.GetPowerState() == inventoryv1.PowerState_POWER_STATE_UNKNOWN, m.unreachable[name]; un != was {
		m.unreachable[name] = un
		cond := "bmc_reachable"
		if un {
			cond = "bmc_unreachable"
		}
		data := map[string]any{"condition": cond, "machine": name, "power_state": mc.GetPowerState().String(), "store_revision": ev.KV.Revision}
		m.d.publish(&Event{ID: EventID(ClassHealth+".bmc", ev.KV.Key, ev.KV.Revision), Class: ClassHealth, Type: TypeHealth,
			Subject: "machine/" + name, Time: time.Now(), Data: jsonData(data)})
	}
	h := mc.GetBmc().GetHealth().GetStatus()
	if ph := m.health[name]; h != ph {
		m.health[name] = h
		if h != "" || ph != "" {
			data := map[string]any{"condition": "bmc_health", "machine": name, "status": h, "previous_status": ph,
				"log_critical": mc.GetBmc().GetHealth().GetLogCritical(), "store_revision": ev.KV.Revision}
			m.d.publish(&Event{ID: EventID(ClassHealth, ev.KV.Key, ev.KV.Revision), Class: ClassHealth, Type: TypeHealth,
				Subject: "machine/" + name, Time: time.Now(), Data: jsonData(data)})
		}
	}
}

// nodeFollower turns node records into READY / NOT_READY conditions.
type nodeFollower struct {
	d     *Dispatcher
	state map[string]string
}

func (n *nodeFollower) seed(kvs []store.KV) {
	for _, kv := range kvs {
		nd := &poolv1.Node{}
		if record.Unmarshal(kv.Value, nd) == nil {
			n.state[strings.TrimPrefix(kv.Key, store.NodesPrefix)] = nd.GetState().String()
		}
	}
}

func (n *nodeFollower) handle(ev store.Event) {
	name := strings.TrimPrefix(ev.KV.Key, store.NodesPrefix)
	prev := n.state[name]
	st := "DELETED"
	if ev.Type == store.EventPut {
		nd := &poolv1.Node{}
		if err := record.Unmarshal(ev.KV.Value, nd); err != nil {
			return
		}
		st = nd.GetState().String()
		n.state[name] = st
	} else {
		delete(n.state, name)
	}
	if st == prev {
		return
	}
	data := map[string]any{"condition": "node_state", "node": name, "state": st, "previous_state": prev, "store_revision": ev.KV.Revision}
	n.d.publish(&Event{ID: EventID(ClassHealth, ev.KV.Key, ev.KV.Revision), Class: ClassHealth, Type: TypeHealth,
		Subject: "node/" + name, Time: time.Now(), Data: jsonData(data)})
}

// auditEvent exports each new audit record.
func (d *Dispatcher) auditEvent(ev store.Event) {
	if ev.Type != store.EventPut {
		return
	}
	a := &auditv1.AuditEvent{}
	if err := record.Unmarshal(ev.KV.Value, a); err != nil {
		return
	}
	data, err := protojson.Marshal(a)
	if err != nil {
		return
	}
	// The audit record is written once under its own key: the key alone
	// identifies it.
	at := time.Now()
	if a.GetAt() != nil {
		at = a.GetAt().AsTime()
	}
	d.publish(&Event{ID: EventID(ClassAudit, ev.KV.Key, 0), Class: ClassAudit, Type: TypeAudit, Subject: a.GetObject(),
		Time: at, Data: data})
}

func jsonData(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}
