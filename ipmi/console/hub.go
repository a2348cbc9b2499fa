// Package console keeps machines' serial consoles in the appliance: one
// session per machine, shared by a bounded number of viewers (one writer
// at a time, the others read-only), a bounded scrollback that a new viewer
// receives first, and the serial link opened on the first viewer and
// closed a while after the last one leaves. It serves ConsoleService (the
// API edge: gRPC codes appear only in server.go). The link itself (IPMI
// Serial-over-LAN, package ipmi/sol, or a Redfish BMC's serial console
// over SSH, package ipmi/sshcon; for a hub of virtual machines, the
// VM's serial port through its node) and the audit are wired in by the
// appliance through the interfaces declared here. It imports the API and
// the error classes only, never store/, inventory/ or the appliance.
package console

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/corralhq/corral/internal/apierr"
)

// Link is the serial link to machines' consoles.
type Link interface {
	// Check says whether machine has a console the link can open, before
	// a viewer is attached: apierr.ErrNotFound, apierr.ErrPrecondition
	// (no BMC, a protocol without a serial console) and the like.
	Check(ctx context.Context, machine string) error
	// Run copies in to the machine's serial port and its output to out
	// until ctx ends (nil) or the link fails (an error). It calls up once
	// the link carries bytes. out is written from one goroutine at a time.
	Run(ctx context.Context, machine string, in io.Reader, out io.Writer, up func()) error
}

// Action is one step of a viewer's life that the audit records. Its words
// are fixed (String), never user data.
type Action int

// The actions, in the order of a viewer's life.
const (
	ActionAttachReadOnly Action = iota + 1
	ActionAttachWrite
	ActionTakeWrite
	ActionDetach
)

func (a Action) String() string {
	switch a {
	case ActionAttachReadOnly:
		return "console attach read-only"
	case ActionAttachWrite:
		return "console attach write"
	case ActionTakeWrite:
		return "console take write"
	case ActionDetach:
		return "console detach"
	}
	return "console"
}

// Auditor records viewers' actions on a machine's console. It must not
// block.
type Auditor interface {
	ConsoleAction(ctx context.Context, machine string, a Action)
}

// Mode is what a viewer may do.
type Mode int

// The modes: ReadOnly watches, Write types too.
const (
	ReadOnly Mode = iota + 1
	Write
)

// Event is a change in a viewer's session (the API's ConsoleEvent).
type Event int

// The events; EventNone marks an Output that carries data only.
const (
	EventNone Event = iota
	EventAttached
	EventLive
	EventWriteTaken
	EventLinkDown
	EventLinkUp
)

// Output is one message to a viewer: data, or an event with its detail.
type Output struct {
	Data   []byte
	Event  Event
	Detail string
}

// Errors of Attach and of a viewer's input and life.
var (
	// ErrReadOnly: input from a viewer that does not hold the write side.
	ErrReadOnly = errors.New("a console stream from a viewer is refused")
	// ErrSlow: the viewer did not keep up with the output and was cut.
	ErrSlow = errors.New("console viewer did not keep up with the machine's output")
	// ErrClosed: the hub is shutting down.
	ErrClosed = errors.New("console hub is shutting down")
)

// Defaults.
const (
	DefaultScrollback      = 1 << 20
	DefaultMaxViewers      = 16
	DefaultLinger          = 30 * time.Second
	DefaultKeptScrollbacks = 64
	DefaultViewerBuffer    = 256
	DefaultRetry           = 2 * time.Second
	// MaxChunk bounds the data of one Output.
	MaxChunk = 16 << 10
	// MaxInput bounds one input message.
	MaxInput = 4096
)

// Config configures a Hub. Link is required; zero values take the
// defaults.
type Config struct {
	Link Link
	// Kind names the hub's targets in its errors (default "machine"; a
	// hub of virtual machines' consoles says "virtual machine").
	Kind    string
	Auditor Auditor // nil: nothing recorded
	Logger  *slog.Logger
	// Scrollback is the bytes kept per machine (default 1 MiB).
	Scrollback int
	// MaxViewers bounds viewers per machine (default 16).
	MaxViewers int
	// Linger keeps the link open after the last viewer leaves (default
	// 30s), so a reconnecting viewer misses nothing.
	Linger time.Duration
	// KeptScrollbacks bounds the machines whose scrollback is kept with
	// no viewer (default 64); the longest idle is dropped first.
	KeptScrollbacks int
	// ViewerBuffer is the outputs queued per viewer before it is cut
	// (default 256).
	ViewerBuffer int
	// Retry is the wait before a failed link is opened again while
	// viewers remain (default 2s).
	Retry time.Duration
}

// Hub holds every machine's console session. Its methods are safe for
// concurrent use.
type Hub struct {
	cfg  Config
	log  *slog.Logger
	base context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup

	mu       sync.Mutex
	sessions map[string]*session
	closed   bool
}

type session struct {
	machine string
	ring    *ring
	viewers map[*Viewer]struct{}
	writer  *Viewer
	input   chan []byte
	cancel  context.CancelFunc // stops the link; nil when not running
	linger  *time.Timer
	idle    time.Time // when the last viewer left
}

// New checks cfg and returns a Hub; Run owns its links.
func New(cfg Config) (*Hub, error) {
	if cfg.Link == nil {
		return nil, errors.New("console: Config.Link is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Kind == "" {
		cfg.Kind = "machine"
	}
	if cfg.Scrollback <= 0 {
		cfg.Scrollback = DefaultScrollback
	}
	if cfg.MaxViewers <= 0 {
		cfg.MaxViewers = DefaultMaxViewers
	}
	if cfg.Linger <= 0 {
		cfg.Linger = DefaultLinger
	}
	if cfg.KeptScrollbacks <= 0 {
		cfg.KeptScrollbacks = DefaultKeptScrollbacks
	}
	if cfg.ViewerBuffer <= 0 {
		cfg.ViewerBuffer = DefaultViewerBuffer
	}
	if cfg.Retry <= 0 {
		cfg.Retry = DefaultRetry
	}
	base, stop := context.WithCancel(context.Background())
	return &Hub{cfg: cfg, log: cfg.Logger, base: base, stop: stop, sessions: map[string]*session{}}, nil
}

// Run blocks until ctx ends, then closes every link and cuts every viewer
// (ErrClosed) and returns nil once the links have stopped.
func (h *Hub) Run(ctx context.Context) error {
	<-ctx.Done()
	h.mu.Lock()
	h.closed = true
	for _, s := range h.sessions {
		for v := range s.viewers {
			v.cutLocked(classed(apierr.ErrUnavailable, ErrClosed, ""))
		}
		if s.linger != nil {
			s.linger.Stop()
		}
	}
	h.mu.Unlock()
	h.stop()
	h.wg.Wait()
	return nil
}

// Attach adds a viewer to machine's console, opening the link if it is
// the first. who names the viewer to others (a writer taken over is told
// who took it). A second writer without take is apierr.ErrPrecondition;
// more than MaxViewers is apierr.ErrExhausted; Link.Check's error is
// returned as it is. The viewer's first outputs are EventAttached, the
// scrollback and EventLive.
func (h *Hub) Attach(ctx context.Context, machine string, mode Mode, take bool, who string) (*Viewer, error) {
	if mode != ReadOnly && mode != Write {
		return nil, apierr.Invalidf("console mode: read-only or write")
	}
	if err := h.cfg.Link.Check(ctx, machine); err != nil {
		return nil, err
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, classed(apierr.ErrUnavailable, ErrClosed, "")
	}
	s := h.sessions[machine]
	if s == nil {
		s = &session{machine: machine, ring: newRing(h.cfg.Scrollback), viewers: map[*Viewer]struct{}{}, input: make(chan []byte, 64)}
		h.sessions[machine] = s
	}
	if len(s.viewers) >= h.cfg.MaxViewers {
		h.mu.Unlock()
		return nil, apierr.Exhaustedf("%s %q's console has %d viewers, the most it takes", h.cfg.Kind, machine, h.cfg.MaxViewers)
	}
	var taken *Viewer
	if mode == Write && s.writer != nil {
		if !take {
			holder := s.writer.who
			h.mu.Unlock()
			return nil, apierr.Preconditionf("%s %q's console has a writer (%s): attach read-only, or take the write side", h.cfg.Kind, machine, holder)
		}
		taken = s.writer
	}
	back := h.cfg.Scrollback/MaxChunk + 1
	v := &Viewer{h: h, s: s, ctx: ctx, who: who, mode: mode, out: make(chan Output, h.cfg.ViewerBuffer+back+2), gone: make(chan struct{})}
	label := "read-only"
	if mode == Write {
		label = "write"
		s.writer = v
	}
	v.out <- Output{Event: EventAttached, Detail: label}
	for b := s.ring.Bytes(); len(b) > 0; {
		n := min(len(b), MaxChunk)
		v.out <- Output{Data: b[:n]}
		b = b[n:]
	}
	v.out <- Output{Event: EventLive}
	if taken != nil {
		taken.mode = ReadOnly
		taken.sendLocked(Output{Event: EventWriteTaken, Detail: who})
	}
	s.viewers[v] = struct{}{}
	if s.linger != nil {
		s.linger.Stop()
		s.linger = nil
	}
	if s.cancel == nil {
		h.startLocked(s)
	}
	h.mu.Unlock()
	if h.cfg.Auditor != nil {
		a := ActionAttachReadOnly
		if mode == Write {
			a = ActionAttachWrite
		}
		h.cfg.Auditor.ConsoleAction(ctx, machine, a)
		if taken != nil {
			h.cfg.Auditor.ConsoleAction(ctx, machine, ActionTakeWrite)
		}
	}
	return v, nil
}

// startLocked starts s's link loop. h.mu is held.
func (h *Hub) startLocked(s *session) {
	ctx, cancel := context.WithCancel(h.base)
	s.cancel = cancel
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		h.linkLoop(ctx, s)
	}()
}

// linkLoop runs the link, and again after a failure, until ctx ends.
func (h *Hub) linkLoop(ctx context.Context, s *session) {
	log := h.log.With("machine", s.machine)
	failed := false
	for ctx.Err() == nil {
		in := &inputReader{ctx: ctx, ch: s.input}
		out := &sessionWriter{h: h, s: s}
		up := func() {
			if failed {
				h.broadcast(s, Output{Event: EventLinkUp})
			}
			log.Info("console link up")
		}
		err := h.cfg.Link.Run(ctx, s.machine, in, out, up)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			err = errors.New("the link closed")
		}
		failed = true
		log.Warn("console link down", "error", err)
		h.broadcast(s, Output{Event: EventLinkDown, Detail: err.Error()})
		t := time.NewTimer(h.cfg.Retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func (h *Hub) broadcast(s *session, o Output) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for v := range s.viewers {
		v.sendLocked(o)
	}
}

// sessionWriter is the link's output: into the scrollback and to every
// viewer.
type sessionWriter struct {
	h *Hub
	s *session
}

func (w *sessionWriter) Write(p []byte) (int, error) {
	w.h.mu.Lock()
	defer w.h.mu.Unlock()
	w.s.ring.Write(p)
	for b := p; len(b) > 0; {
		n := min(len(b), MaxChunk)
		chunk := append([]byte(nil), b[:n]...)
		for v := range w.s.viewers {
			v.sendLocked(Output{Data: chunk})
		}
		b = b[n:]
	}
	return len(p), nil
}

// inputReader is the link's input: the session's writer's keys.
type inputReader struct {
	ctx  context.Context
	ch   <-chan []byte
	rest []byte
}

func (r *inputReader) Read(p []byte) (int, error) {
	if len(r.rest) == 0 {
		select {
		case <-r.ctx.Done():
			return 0, io.EOF
		case b := <-r.ch:
			r.rest = b
		}
	}
	n := copy(p, r.rest)
	r.rest = r.rest[n:]
	return n, nil
}

// Viewers reports how many viewers machine's console has and whether its
// link is open.
func (h *Hub) Viewers(machine string) (int, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.sessions[machine]
	if s == nil {
		return 0, false
	}
	return len(s.viewers), s.cancel != nil
}

// Forget drops machine's session: its link, viewers and scrollback (a
// deleted machine).
func (h *Hub) Forget(machine string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.sessions[machine]
	if s == nil {
		return
	}
	for v := range s.viewers {
		v.cutLocked(apierr.NotFoundf("%s %q was deleted", h.cfg.Kind, machine))
	}
	h.stopLocked(s)
	delete(h.sessions, machine)
}

func (h *Hub) stopLocked(s *session) {
	if s.linger != nil {
		s.linger.Stop()
		s.linger = nil
	}
	if s.cancel != nil {
		s.cancel()
		s.cancel = nil
	}
}

// leave removes v; the last viewer out starts the linger. It reports
// whether v was attached until now (not closed, nor cut: a cut viewer's
// detach is recorded too, once).
func (h *Hub) leave(v *Viewer) bool {
	h.mu.Lock()
	s := v.s
	if v.left {
		h.mu.Unlock()
		return false
	}
	v.left = true
	if _, ok := s.viewers[v]; !ok {
		h.mu.Unlock()
		return true
	}
	delete(s.viewers, v)
	if s.writer == v {
		s.writer = nil
	}
	if len(s.viewers) == 0 && !h.closed {
		s.idle = time.Now()
		s.linger = time.AfterFunc(h.cfg.Linger, func() { h.lingerEnd(s) })
	}
	h.mu.Unlock()
	return true
}

// lingerEnd closes an idle session's link and bounds the idle
// scrollbacks kept.
func (h *Hub) lingerEnd(s *session) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(s.viewers) > 0 || h.sessions[s.machine] != s {
		return
	}
	h.stopLocked(s)
	var idle []*session
	for _, o := range h.sessions {
		if len(o.viewers) == 0 && o.cancel == nil {
			idle = append(idle, o)
		}
	}
	for len(idle) > h.cfg.KeptScrollbacks {
		oldest := 0
		for i, o := range idle {
			if o.idle.Before(idle[oldest].idle) {
				oldest = i
			}
		}
		delete(h.sessions, idle[oldest].machine)
		idle = append(idle[:oldest], idle[oldest+1:]...)
	}
}

// Viewer is one attached viewer. Output, Done and Err may be called from
// any goroutine; Input from one at a time.
type Viewer struct {
	h    *Hub
	s    *session
	ctx  context.Context // Attach's: who attached, for the audit
	who  string
	out  chan Output
	gone chan struct{}
	// guarded by h.mu
	mode Mode
	err  error
	done bool // cut by the hub
	left bool // Close was called
}

// Output is the viewer's outputs, in order. It is never closed: select
// on Done too.
func (v *Viewer) Output() <-chan Output { return v.out }

// Done is closed when the hub cut the viewer (Err says why).
func (v *Viewer) Done() <-chan struct{} { return v.gone }

// Err is why the hub cut the viewer, or nil.
func (v *Viewer) Err() error {
	v.h.mu.Lock()
	defer v.h.mu.Unlock()
	return v.err
}

// Mode is the viewer's mode now (a writer taken over becomes ReadOnly).
func (v *Viewer) Mode() Mode {
	v.h.mu.Lock()
	defer v.h.mu.Unlock()
	return v.mode
}

// Input sends keys to the machine. A viewer that does not hold the write
// side gets ErrReadOnly (wrapped in apierr.ErrPermissionDenied). It
// blocks while the link's input queue is full, until ctx ends.
func (v *Viewer) Input(ctx context.Context, p []byte) error {
	if len(p) > MaxInput {
		return apierr.Invalidf("console input of %d bytes: at most %d a message", len(p), MaxInput)
	}
	v.h.mu.Lock()
	writer := v.mode == Write && v.s.writer == v && !v.done
	v.h.mu.Unlock()
	if !writer {
		return classed(apierr.ErrPermissionDenied, ErrReadOnly, "this viewer is read-only (attach with write to type)")
	}
	if len(p) == 0 {
		return nil
	}
	select {
	case v.s.input <- append([]byte(nil), p...):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-v.gone:
		return v.Err()
	}
}

// Close detaches the viewer (recorded as ActionDetach). It is
// idempotent.
func (v *Viewer) Close() {
	if v.h.leave(v) && v.h.cfg.Auditor != nil {
		v.h.cfg.Auditor.ConsoleAction(v.ctx, v.s.machine, ActionDetach)
	}
}

// sendLocked queues o or cuts a viewer that does not keep up. h.mu held.
func (v *Viewer) sendLocked(o Output) {
	if v.done {
		return
	}
	select {
	case v.out <- o:
	default:
		v.cutLocked(classed(apierr.ErrExhausted, ErrSlow, fmt.Sprintf("more than %d outputs queued", cap(v.out))))
	}
}

// cutLocked ends the viewer with err and removes it. h.mu held.
func (v *Viewer) cutLocked(err error) {
	if v.done {
		return
	}
	v.done, v.err = true, err
	close(v.gone)
	s := v.s
	delete(s.viewers, v)
	if s.writer == v {
		s.writer = nil
	}
	if len(s.viewers) == 0 && !v.h.closed && s.cancel != nil && s.linger == nil {
		s.idle = time.Now()
		s.linger = time.AfterFunc(v.h.cfg.Linger, func() { v.h.lingerEnd(s) })
	}
}

// classedErr is one of this package's errors in an apierr class; its text
// is the error's and the detail's, without the class (the code says it).
type classedErr struct {
	class, err error
	detail     string
}

func classed(class, err error, detail string) error {
	return &classedErr{class: class, err: err, detail: detail}
}

func (e *classedErr) Error() string {
	if e.detail == "" {
		return e.err.Error()
	}
	return e.err.Error() + ": " + e.detail
}

func (e *classedErr) Unwrap() []error { return []error{e.class, e.err} }
