package webhook

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
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
	"google.golang.org/protobuf/types/known/timestamppb"

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
	// CursorInterval is how often the receivers' delivery cursors are
	// written to the store.
	CursorInterval time.Duration
}

// Dispatcher follows the store and posts events to the receivers. Run it
// on one appliance of a fleet only (the leader's singleton work): each
// event is then sent once, with an ID every appliance would give it.
type Dispatcher struct {
	cfg     Config
	hw      store.HistoryWatcher
	log     *slog.Logger
	metrics *dispatchMetrics

	// seen is the store revision through which the follower has handed
	// every change to publish.
	seen atomic.Int64
	// handling is the revision of the change the follower is handling
	// (read by publish, on the follower's goroutine).
	handling int64

	mu      sync.Mutex
	targets map[string]*target
}

type dispatchMetrics struct {
	deliveries *prometheus.CounterVec   // receiver, outcome
	depth      *prometheus.GaugeVec     // receiver
	overflow   *prometheus.CounterVec   // receiver
	latency    *prometheus.HistogramVec // receiver
	cut        *prometheus.GaugeVec     // receiver
	lost       *prometheus.CounterVec   // receiver
	cursor     *prometheus.GaugeVec     // receiver
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
			Help: "1 when a webhook receiver was cut off for overflowing its queue (corral webhook enable resumes it)."}, []string{"receiver"}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "corral_webhook_history_lost_total",
			Help: "Times a webhook receiver's delivery cursor was older than the store's history (compacted), so the events in between were never sent to it."}, []string{"receiver"}),
		cursor: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "corral_webhook_cursor_revision",
			Help: "The store revision through which a webhook receiver's events were delivered or given up, as last written to the store."}, []string{"receiver"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.deliveries, m.depth, m.overflow, m.latency, m.cut, m.lost, m.cursor} {
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
	cfg.CursorInterval = cmp.Or(cfg.CursorInterval, DefaultCursorInterval)
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
	stopped chan struct{}
	// skip: events of a revision <= skip were handled by an earlier
	// leader (the stored cursor) or predate the receiver.
	skip int64
	// pending counts the events queued or in flight; done is the cursor
	// (every event <= done is finished); flushed is the cursor as stored.
	pending atomic.Int64
	done    atomic.Int64
	flushed atomic.Int64
}

// Run follows receivers, machines, nodes and the audit log until ctx
// ends, and returns nil then. Each receiver resumes after its stored
// delivery cursor (a receiver without one starts now), so a new leader
// re-sends what its predecessor had queued or not yet seen, under the
// same event IDs.
func (d *Dispatcher) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
		d.mu.Lock()
		for _, t := range d.targets {
			if t.cancel != nil {
				t.cancel()
				<-t.stopped
				t.cancel = nil
			}
		}
		d.mu.Unlock()
		// What finished before the stop is kept for the next leader.
		fctx, fcancel := context.WithTimeout(context.Background(), 5*time.Second)
		d.flushCursors(fctx)
		fcancel()
		d.mu.Lock()
		for name, t := range d.targets {
			d.stopLocked(name, t)
		}
		d.mu.Unlock()
	}()
	f, err := d.start(ctx)
	if err != nil {
		return err
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		f.run(ctx)
	}()
	go func() {
		defer wg.Done()
		tick := time.NewTicker(d.cfg.CursorInterval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				d.flushCursors(ctx)
			}
		}
	}()
	<-ctx.Done()
	return nil
}

// follower follows the whole store in one watch, so that its position
// (Dispatcher.seen) is a store revision every receiver's cursor can
// follow, and routes each change by its key's prefix, in revision order.
type follower struct {
	d  *Dispatcher
	ms *machineFollower
	ns *nodeFollower
	// recvAfter, machAfter, nodeAfter: changes at or below them are in
	// the lists the follower was seeded with.
	recvAfter, machAfter, nodeAfter int64
	rev                             int64
	ch                              <-chan store.Event
}

// start seeds the receivers from the store and resumes the watch after
// the oldest receiver's cursor. Seeded from lists, machines and nodes give
// a state change only when their state differs; resumed from a cursor,
// the first change of each after it is sent as a state change whatever
// its previous state (which the store no longer has).
func (d *Dispatcher) start(ctx context.Context) (*follower, error) {
	f := &follower{d: d, ms: &machineFollower{d: d, state: map[string]string{}, health: map[string]string{}, unreachable: map[string]bool{}},
		ns: &nodeFollower{d: d, state: map[string]string{}}}
	kvs, now, err := d.hw.ListRevision(ctx, store.WebhooksPrefix)
	if err != nil {
		return nil, err
	}
	from := now
	for _, kv := range kvs {
		name := strings.TrimPrefix(kv.Key, store.WebhooksPrefix)
		skip := now
		c, ok, err := ReadCursor(ctx, d.cfg.Store, name)
		if err != nil {
			return nil, err
		}
		if ok && c.Revision < now {
			skip = c.Revision
		}
		if t := d.receiverEvent(store.Event{Type: store.EventPut, KV: kv}, skip); t != nil && !t.cut.Load() {
			from = min(from, skip)
		}
	}
	f.recvAfter = now
	if from == now {
		mkvs, mrev, err := d.hw.ListRevision(ctx, store.MachinesPrefix)
		if err != nil {
			return nil, err
		}
		f.ms.seed(mkvs)
		nkvs, nrev, err := d.hw.ListRevision(ctx, store.NodesPrefix)
		if err != nil {
			return nil, err
		}
		f.ns.seed(nkvs)
		f.machAfter, f.nodeAfter = mrev, nrev
	} else {
		d.log.Info("webhook: resuming receivers from their delivery cursors", "from_revision", from, "store_revision", now)
	}
	f.rev = from
	d.seen.Store(from)
	ch, err := d.hw.WatchFrom(ctx, "", from)
	if errors.Is(err, store.ErrCompacted) {
		ch, err = f.compacted(ctx, err)
	}
	if err != nil {
		return nil, err
	}
	f.ch = ch
	return f, nil
}

// compacted resumes the watch after the oldest revision the store keeps
// once f.rev is no longer in its history: every receiver whose cursor is
// older is told (historyLost); what the follower knew of machines and nodes
// is forgotten.
func (f *follower) compacted(ctx context.Context, cause error) (<-chan store.Event, error) {
	oldest, err := f.d.oldestAvailable(ctx, cause)
	if err != nil {
		return nil, err
	}
	f.d.mu.Lock()
	for _, t := range f.d.targets {
		if !t.cut.Load() && t.done.Load() < oldest {
			f.d.historyLost(t.name, t.done.Load(), oldest)
			t.advance(oldest)
		}
	}
	f.d.mu.Unlock()
	clear(f.ms.state)
	clear(f.ms.health)
	clear(f.ms.unreachable)
	clear(f.ns.state)
	f.rev = max(f.rev, oldest)
	f.d.seen.Store(f.rev)
	return f.d.hw.WatchFrom(ctx, "", f.rev)
}

// handle routes one change.
func (f *follower) handle(ev store.Event) {
	rev := ev.KV.Revision
	f.d.handling = rev
	switch k := ev.KV.Key; {
	case strings.HasPrefix(k, store.WebhooksPrefix):
		if rev > f.recvAfter {
			f.d.receiverEvent(ev, rev)
		}
	case strings.HasPrefix(k, store.MachinesPrefix):
		if rev > f.machAfter {
			f.ms.handle(ev)
		}
	case strings.HasPrefix(k, store.NodesPrefix):
		if rev > f.nodeAfter {
			f.ns.handle(ev)
		}
	case strings.HasPrefix(k, store.AuditPrefix):
		f.d.auditEvent(ev)
	}
}

func (f *follower) run(ctx context.Context) {
	for {
		for ev := range f.ch {
			f.handle(ev)
			f.rev = ev.KV.Revision
			// The cursors' own writes do not move them: an idle store
			// then sees no cursor write at all.
			if !strings.HasPrefix(ev.KV.Key, store.WebhookCursorsPrefix) {
				f.d.seen.Store(f.rev)
			}
		}
		if ctx.Err() != nil {
			return
		}
		ch, err := f.d.hw.WatchFrom(ctx, "", f.rev)
		if errors.Is(err, store.ErrCompacted) {
			f.d.log.Warn("webhook: watch history lost", "after", f.rev, "err", err)
			ch, err = f.compacted(ctx, err)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			f.d.log.Warn("webhook: watch", "err", err)
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

// receiverEvent starts, replaces or stops a receiver's worker; the
// receiver gets the events of revisions after skip. It returns the
// receiver's target (nil when none).
func (d *Dispatcher) receiverEvent(ev store.Event, skip int64) *target {
	name := strings.TrimPrefix(ev.KV.Key, store.WebhooksPrefix)
	d.mu.Lock()
	defer d.mu.Unlock()
	old := d.targets[name]
	if ev.Type == store.EventDelete {
		if old != nil {
			d.stopLocked(name, old)
			d.forget(name)
		}
		return nil
	}
	r := &webhookv1.Receiver{}
	if err := record.Unmarshal(ev.KV.Value, r); err != nil {
		d.log.Warn("webhook: receiver record", "webhook", name, "err", err)
		return old
	}
	if old != nil && sameReceiver(old.rec, r) {
		old.rec = r
		return old
	}
	if old != nil {
		d.stopLocked(name, old)
	}
	t, err := d.newTarget(r)
	if err != nil {
		d.log.Warn("webhook: receiver not served", "webhook", name, "err", err)
		return nil
	}
	t.skip = skip
	t.done.Store(skip)
	d.targets[name] = t
	if r.GetCutAt() != nil {
		t.cut.Store(true)
		d.metrics.cut.WithLabelValues(name).Set(1)
		return t
	}
	d.metrics.cut.WithLabelValues(name).Set(0)
	d.metrics.depth.WithLabelValues(name).Set(0)
	ctx, cancel := context.WithCancel(context.Background())
	t.cancel = cancel
	t.stopped = make(chan struct{})
	go d.work(ctx, t)
	return t
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
		<-t.stopped
		t.cancel = nil
	}
	delete(d.targets, name)
}

func (d *Dispatcher) forget(name string) {
	for _, v := range []*prometheus.MetricVec{d.metrics.depth.MetricVec, d.metrics.cut.MetricVec, d.metrics.cursor.MetricVec} {
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
	ev.rev = d.handling
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, t := range d.targets {
		if !slices.Contains(t.classes, ev.Class) || ev.rev <= t.skip {
			continue
		}
		if t.cut.Load() {
			d.metrics.overflow.WithLabelValues(t.name).Inc()
			continue
		}
		t.pending.Add(1)
		select {
		case t.queue <- ev:
			d.metrics.depth.WithLabelValues(t.name).Inc()
		default:
			t.pending.Add(-1)
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
	defer close(t.stopped)
	defer t.client.CloseIdleConnections()
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-t.queue:
			d.metrics.depth.WithLabelValues(t.name).Dec()
			d.deliver(ctx, t, ev)
			if ctx.Err() != nil {
				// Not finished: the next leader sends it again.
				return
			}
			// Delivered, refused or given up: every event before ev's
			// revision is finished (ev's revision may hold more).
			t.advance(ev.rev - 1)
			t.pending.Add(-1)
			d.settle(t)
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
