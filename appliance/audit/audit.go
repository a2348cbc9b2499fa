// Package audit is the appliance's audit stream: an interceptor that
// records every mutating RPC as an AuditEvent in the store, the writer that
// stores them in batches, the retention purge, and AuditService (list and
// watch). It consumes the store and the machines' boot timeline through
// Deps and must not import the appliance package that wires it.
package audit

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	auditv1 "github.com/corralhq/corral/api/audit/v1"
	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/auth"
	"github.com/corralhq/corral/internal/lograte"
	"github.com/corralhq/corral/internal/termsafe"
	"github.com/corralhq/corral/store"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// The audit stream: every mutating RPC (auditRules) is recorded after it
// finishes, refused calls included, as an AuditEvent under
// /audit/<id>, where the id starts with the UTC time at fixed width so key
// order is time order and an hour's events share a key prefix. The
// interceptor only builds the event and queues it (never blocks; a full
// queue drops and counts); one writer (Run) stores queued events in
// batches of concurrent Puts, which the bolt store commits together, and
// puts calls that concern a machine on its boot timeline as well. A
// singleton (the leader's) purges past MaxAge and past each class's cap.
//
// Two retention classes (docs/security.md, "Audit retention classes"):
// the records of people and appliances (VIEWER, OPERATOR, ADMIN and
// APPLIANCE principals) and those of the boot LAN (discovery agents, node
// certificates and callers that did not authenticate). A boot-LAN record's
// id ends in agentIDSuffix, so the purge tells the classes apart by key,
// without decoding; each class has its own cap (MaxEvents,
// MaxAgentEvents), so however many calls the boot LAN makes, the purge
// deletes boot-LAN records for them and never an operator's.

// Audit defaults.
const (
	DefaultQueue          = 4096
	DefaultMaxEvents      = 100_000
	DefaultMaxAgentEvents = 50_000
	DefaultMaxAge         = 90 * 24 * time.Hour
	// auditBatch is the most events one writer round stores; auditWriters
	// how many of them are in flight at once.
	auditBatch   = 256
	auditWriters = 256
	// auditWriteTimeout bounds one Put (a slow store delays the audit, never
	// the RPC).
	auditWriteTimeout = 10 * time.Second
	// auditPurgeInterval is how often the leader applies the retention.
	auditPurgeInterval = 10 * time.Minute
	// Refused calls of the boot LAN (unauthenticated, or over the agent
	// rate limits) cost an attacker nothing, so their records are
	// rate-limited (the rest counted and logged) lest a flood fill the
	// store between two purges: a burst of auditUnauthBurst, then
	// auditUnauthRate a second.
	auditUnauthRate  = 1
	auditUnauthBurst = 100
)

// Config bounds the audit stream; zero values take the defaults.
type Config struct {
	// Queue is how many events may wait for the writer (default 4096).
	Queue int
	// MaxEvents and MaxAge are the retention: at most MaxEvents events of
	// people and appliances, at most MaxAgentEvents of the boot LAN
	// (agents, node certificates, unauthenticated callers), none older
	// than MaxAge (defaults 100,000, 50,000 and 90 days).
	MaxEvents      int
	MaxAgentEvents int
	MaxAge         time.Duration
}

// check refuses negative bounds (zero takes the default).
func (c *Config) check() error {
	switch {
	case c.Queue < 0:
		return fmt.Errorf("--audit-queue %d: must be positive (default %d)", c.Queue, DefaultQueue)
	case c.MaxEvents < 0:
		return fmt.Errorf("--audit-max-events %d: must be positive (default %d)", c.MaxEvents, DefaultMaxEvents)
	case c.MaxAgentEvents < 0:
		return fmt.Errorf("--audit-max-agent-events %d: must be positive (default %d)", c.MaxAgentEvents, DefaultMaxAgentEvents)
	case c.MaxAge < 0:
		return fmt.Errorf("--audit-max-age %s: must be positive (default %s)", c.MaxAge, DefaultMaxAge)
	}
	return nil
}

func (c *Config) fill() {
	if c.Queue <= 0 {
		c.Queue = DefaultQueue
	}
	if c.MaxEvents <= 0 {
		c.MaxEvents = DefaultMaxEvents
	}
	if c.MaxAgentEvents <= 0 {
		c.MaxAgentEvents = DefaultMaxAgentEvents
	}
	if c.MaxAge <= 0 {
		c.MaxAge = DefaultMaxAge
	}
}

// Recorder records every mutating call.
type Recorder struct {
	cfg       Config
	st        store.Store
	log       *slog.Logger
	appliance string
	now       func() time.Time
	// timeline puts a machine call on the machine's boot timeline (nil:
	// nowhere).
	timeline Timeline

	queue chan auditItem
	// instance and seq make ids unique among appliances sharing a store.
	instance string
	seq      atomic.Uint64

	dropped    atomic.Uint64 // events dropped on a full queue, ever
	suppressed atomic.Uint64 // refused boot-LAN calls not recorded (rate), ever
	failed     atomic.Uint64 // events the store refused, ever
	// purged counts the events the retention deleted, by class.
	purgedOps, purgedAgents atomic.Uint64
	unauth                  *rate.Limiter
	// agentWrites counts boot-LAN events stored since the last purge
	// began; past a quarter of MaxAgentEvents the writer wakes the purge
	// (kick) early, so a burst does not wait out auditPurgeInterval.
	agentWrites atomic.Int64
	kick        chan struct{}

	drops, suppressions, failures lograte.Counter
}

// auditItem is a queued event and, for a machine call, the words for its
// timeline and the MAC when it was read before the call (a deleted
// machine's).
type auditItem struct {
	ev   *auditv1.AuditEvent
	verb string
	mac  string
	// flush, when set, is closed once every item queued before it is
	// stored (tests).
	flush chan struct{}
}

// newAuditor returns a Recorder writing to st; Run stores what it queues.
func newAuditor(cfg Config, st store.Store, appliance string, log *slog.Logger) *Recorder {
	cfg.fill()
	var b [4]byte
	rand.Read(b[:])
	a := &Recorder{cfg: cfg, st: st, log: log, appliance: appliance, now: time.Now,
		queue: make(chan auditItem, cfg.Queue), instance: hex.EncodeToString(b[:]),
		unauth: rate.NewLimiter(auditUnauthRate, auditUnauthBurst), kick: make(chan struct{}, 1)}
	return a
}

// Deps are what a Recorder needs from the appliance that hosts it.
type Deps struct {
	// Store keeps the events under /audit/.
	Store store.Store
	// Appliance names this appliance in each event.
	Appliance string
	// Timeline takes the machine calls besides the stream (nil: none).
	Timeline Timeline
	Logger   *slog.Logger
}

// New checks cfg and returns a Recorder; nothing runs until Run (the
// writer, on every appliance) and RunPurge (the retention, a singleton)
// are started by the host, and the interceptors and Register are wired
// into its gRPC server.
func New(cfg Config, d Deps) (*Recorder, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	a := newAuditor(cfg, d.Store, d.Appliance, cmp.Or(d.Logger, slog.New(slog.DiscardHandler)))
	a.timeline = d.Timeline
	return a, nil
}

// Register serves AuditService on r.
func (a *Recorder) Register(r grpc.ServiceRegistrar) {
	auditv1.RegisterAuditServiceServer(r, &auditServer{a: a})
}

// Interceptors record mutating calls. They run before the auth
// interceptor, which tells them who called through an auth.Resolution.
func (a *Recorder) Interceptors() (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		rule, ok := auditRuleFor(info.FullMethod)
		if !ok {
			return handler(ctx, req)
		}
		ctx, res := auth.WithResolution(ctx)
		start := a.now()
		object := auditObject(rule, req)
		var mac string
		if rule.machine && info.FullMethod == "/corral.inventory.v1.MachineService/DeleteMachine" && a.timeline != nil {
			// Afterwards the machine is gone, and with it which MAC's
			// timeline to write to.
			mac = a.timeline.MachineMAC(ctx, machineName(object))
		}
		resp, err := handler(ctx, req)
		object, machine := auditResponseObject(object, resp)
		if rule.machine {
			machine = machineName(object)
		}
		item := auditItem{mac: mac}
		if rule.machine {
			item.verb = timelineVerb(info.FullMethod, req)
		}
		a.record(ctx, rule, info.FullMethod, res, start, err, object, machine, item)
		return resp, err
	}
	stream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		rule, ok := auditRuleFor(info.FullMethod)
		if !ok {
			return handler(srv, ss)
		}
		ctx, res := auth.WithResolution(ss.Context())
		start := a.now()
		err := handler(srv, &auditStream{ServerStream: ss, ctx: ctx})
		// A stream's messages are never looked at (a backup's carries its
		// passphrase): the object is the rule's kind alone.
		a.record(ctx, rule, info.FullMethod, res, start, err, auditObject(rule, nil), "", auditItem{})
		return err
	}
	return unary, stream
}

// auditStream gives the handler the context carrying the Resolution.
type auditStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *auditStream) Context() context.Context { return s.ctx }

// machineName is the machine an object "machine/<name>" names, or "".
func machineName(object string) string {
	name, _ := strings.CutPrefix(object, "machine/")
	if name == object {
		return ""
	}
	return name
}

// Note records one step of a long call as an event of its own, before
// the call ends: a console viewer's attach, take-write and detach. ctx is
// the call's (its principal, set by the auth interceptor, says who);
// action is fixed words built by the caller from its own enums, never
// user data; the event also goes on machine's timeline. It never blocks.
func (a *Recorder) Note(ctx context.Context, method, machine, action string) {
	p, ok := auth.FromContext(ctx)
	object := "machine/" + clipUTF8(termsafe.Escape(machine), maxAuditObjectBytes)
	a.record(ctx, auditRule{class: auditMutating, machine: true}, method, principalOf{p, ok}, a.now(), nil, object,
		machineName(object), auditItem{verb: action})
}

// NoteVM is Note for a virtual machine's console: the object is
// virtualmachine/<name> (as VirtualMachineService's calls record it) and
// no machine timeline is written.
func (a *Recorder) NoteVM(ctx context.Context, method, vm, action string) {
	p, ok := auth.FromContext(ctx)
	object := "virtualmachine/" + clipUTF8(termsafe.Escape(vm), maxAuditObjectBytes)
	a.record(ctx, auditRule{class: auditMutating}, method, principalOf{p, ok}, a.now(), nil, object, "", auditItem{verb: action})
}

// caller is who made a call: the auth interceptor's Resolution, or a
// principal already known (Note).
type caller interface {
	Principal() (auth.Principal, bool)
	ClaimedTokenID() string
}

type principalOf struct {
	p  auth.Principal
	ok bool
}

func (w principalOf) Principal() (auth.Principal, bool) { return w.p, w.ok }
func (w principalOf) ClaimedTokenID() string            { return "" }

// record builds the event of a finished call and queues it.
func (a *Recorder) record(ctx context.Context, rule auditRule, method string, res caller, start time.Time, callErr error,
	object, machine string, item auditItem) {
	st, _ := status.FromError(callErr)
	code := st.Code()
	p, known := res.Principal()
	if rule.nodeHeartbeat && known && p.Role == authv1.Role_ROLE_NODE && code != codes.PermissionDenied {
		return
	}
	bootLAN := !known || p.Role == authv1.Role_ROLE_AGENT || p.Role == authv1.Role_ROLE_NODE
	if bootLAN && (code == codes.Unauthenticated || code == codes.ResourceExhausted) && !a.unauth.Allow() {
		n := a.suppressed.Add(1)
		a.suppressions.Add(1, func(since int64) {
			a.log.Warn("audit: refused boot-LAN calls (unauthenticated or over a rate limit) over the record rate: counted, not recorded",
				"method", method, "code", code.String(), "suppressed_since_last_log", since, "suppressed_total", n, "rate_per_s", auditUnauthRate)
		})
		return
	}
	now := a.now()
	ev := &auditv1.AuditEvent{
		Id:         a.newID(now, bootLAN),
		At:         timestamppb.New(now),
		Method:     method,
		Object:     object,
		Machine:    machine,
		Code:       code.String(),
		Appliance:  a.appliance,
		DurationMs: now.Sub(start).Milliseconds(),
		Action:     item.verb,
	}
	if code != codes.OK {
		ev.Message = clipUTF8(termsafe.Escape(st.Message()), maxAuditMessageBytes)
	}
	if pr, ok := peer.FromContext(ctx); ok && pr.Addr != nil {
		ev.Peer = pr.Addr.String()
	}
	switch {
	case known:
		ev.Role = p.Role
		switch {
		case p.Role == authv1.Role_ROLE_AGENT && p.MAC != "":
			ev.Who, ev.TokenId = "agent:"+p.MAC, p.ID
		case p.ID != "":
			ev.Who, ev.TokenId, ev.TokenDescription = "token:"+p.ID+" ("+p.Subject+")", p.ID, p.Subject
		default:
			ev.Who, ev.Subject = "cert:"+p.Subject, p.Subject
		}
	case res.ClaimedTokenID() != "":
		ev.TokenId = res.ClaimedTokenID()
		ev.Who = "token:" + ev.TokenId + " (unauthenticated)"
	default:
		ev.Who = "unauthenticated"
	}
	ev.Who = clipUTF8(ev.Who, maxAuditWhoBytes)
	ev.TokenDescription = clipUTF8(ev.TokenDescription, maxAuditWhoBytes)
	ev.Subject = clipUTF8(ev.Subject, maxAuditWhoBytes)
	if machine == "" || code == codes.PermissionDenied || code == codes.Unauthenticated {
		// A refused call did nothing to the machine: it is in the audit
		// stream only (and cannot flood the machine's timeline).
		item.verb = ""
	}
	item.ev = ev
	a.enqueue(item)
}

// enqueue queues an event for the writer, or drops and counts it when the
// queue is full. It never blocks.
func (a *Recorder) enqueue(it auditItem) {
	select {
	case a.queue <- it:
	default:
		n := a.dropped.Add(1)
		a.drops.Add(1, func(since int64) {
			a.log.Warn("audit queue full: events dropped", "queue", a.cfg.Queue, "dropped_since_last_log", since, "dropped_total", n)
		})
	}
}

// CounterFuncs is where the Recorder exports its counts (the appliance's
// metrics registry).
type CounterFuncs interface {
	CounterFunc(name, help string, labels map[string]string, read func() uint64)
}

// CountInto exports what the audit did not keep to c: events dropped on
// a full queue, refused boot-LAN calls not recorded over the record
// rate, events the store refused, and events the retention purged, by
// class.
func (a *Recorder) CountInto(c CounterFuncs) {
	const dropped = "corral_audit_events_dropped_total"
	const droppedHelp = "Audit events not stored, by reason: queue_full (the writer fell behind), rate (refused boot-LAN calls over the record rate), store_error (the store refused the write)."
	c.CounterFunc(dropped, droppedHelp, map[string]string{"reason": "queue_full"}, a.dropped.Load)
	c.CounterFunc(dropped, droppedHelp, map[string]string{"reason": "rate"}, a.suppressed.Load)
	c.CounterFunc(dropped, droppedHelp, map[string]string{"reason": "store_error"}, a.failed.Load)
	const purged = "corral_audit_events_purged_total"
	const purgedHelp = "Audit events the retention deleted, by class: operator (people and appliances, --audit-max-events) and boot_lan (agents, node certificates, unauthenticated callers, --audit-max-agent-events); both by --audit-max-age."
	c.CounterFunc(purged, purgedHelp, map[string]string{"class": "operator"}, a.purgedOps.Load)
	c.CounterFunc(purged, purgedHelp, map[string]string{"class": "boot_lan"}, a.purgedAgents.Load)
}
