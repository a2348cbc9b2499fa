package console

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/internal/apierr"
)

// fakeLink is a machine's serial port in memory: the test writes what the
// machine prints (print) and reads what it was sent (keys).
type fakeLink struct {
	mu      sync.Mutex
	outs    map[string]io.Writer
	starts  map[string]int
	running map[string]bool
	keys    chan []byte
	check   error
	fail    error // Run returns it at once when set
}

func newFakeLink() *fakeLink {
	return &fakeLink{outs: map[string]io.Writer{}, starts: map[string]int{}, running: map[string]bool{}, keys: make(chan []byte, 100)}
}

func (f *fakeLink) Check(ctx context.Context, machine string) error { return f.check }

func (f *fakeLink) Run(ctx context.Context, machine string, in io.Reader, out io.Writer, up func()) error {
	f.mu.Lock()
	if f.fail != nil {
		err := f.fail
		f.mu.Unlock()
		return err
	}
	f.outs[machine], f.starts[machine], f.running[machine] = out, f.starts[machine]+1, true
	f.mu.Unlock()
	up()
	defer func() {
		f.mu.Lock()
		f.running[machine] = false
		f.mu.Unlock()
	}()
	buf := make([]byte, 256)
	for {
		n, err := in.Read(buf)
		if err != nil {
			return nil
		}
		f.keys <- append([]byte(nil), buf[:n]...)
	}
}

// print writes what the machine prints, once its link runs.
func (f *fakeLink) print(t *testing.T, machine, s string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		f.mu.Lock()
		w, ok := f.outs[machine], f.running[machine]
		f.mu.Unlock()
		if ok && w != nil {
			_, _ = w.Write([]byte(s))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("link of %s never started", machine)
		}
		time.Sleep(time.Millisecond)
	}
}

func (f *fakeLink) state(machine string) (int, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.starts[machine], f.running[machine]
}

type auditLog struct {
	mu  sync.Mutex
	got []string
}

func (a *auditLog) ConsoleAction(ctx context.Context, machine string, act Action) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.got = append(a.got, machine+": "+act.String())
}

func (a *auditLog) list() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.got...)
}

func newHub(t *testing.T, cfg Config) (*Hub, *fakeLink) {
	t.Helper()
	link := newFakeLink()
	if cfg.Link == nil {
		cfg.Link = link
	}
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = h.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return h, link
}

// collect reads v's outputs until the data seen contains want.
func collect(t *testing.T, v *Viewer, want string) (string, []Event) {
	t.Helper()
	var data strings.Builder
	var evs []Event
	timeout := time.After(5 * time.Second)
	for !strings.Contains(data.String(), want) {
		select {
		case o := <-v.Output():
			data.Write(o.Data)
			if o.Event != EventNone {
				evs = append(evs, o.Event)
			}
		case <-v.Done():
			t.Fatalf("viewer cut: %v (data %q)", v.Err(), data.String())
		case <-timeout:
			t.Fatalf("never saw %q; got %q", want, data.String())
		}
	}
	return data.String(), evs
}

func TestScrollbackFirstThenLive(t *testing.T) {
	h, link := newHub(t, Config{Scrollback: 1000})
	ctx := context.Background()
	v1, err := h.Attach(ctx, "m1", ReadOnly, false, "a")
	if err != nil {
		t.Fatal(err)
	}
	defer v1.Close()
	// 2,500 bytes printed: the scrollback keeps the last 1,000.
	printed := strings.Repeat("0123456789", 249) + "END-MARKER"
	link.print(t, "m1", printed)
	collect(t, v1, "END-MARKER")
	v2, err := h.Attach(ctx, "m1", ReadOnly, false, "b")
	if err != nil {
		t.Fatal(err)
	}
	defer v2.Close()
	var first []Output
	for len(first) == 0 || first[len(first)-1].Event != EventLive {
		first = append(first, <-v2.Output())
	}
	if first[0].Event != EventAttached || first[0].Detail != "read-only" {
		t.Fatalf("first output %+v, want ATTACHED read-only", first[0])
	}
	var back []byte
	for _, o := range first {
		back = append(back, o.Data...)
	}
	if want := printed[len(printed)-1000:]; string(back) != want {
		t.Fatalf("scrollback is %d bytes %q..., want the last 1000 printed", len(back), back[:min(20, len(back))])
	}
	link.print(t, "m1", "live line")
	collect(t, v2, "live line")
}

func TestRingBounds(t *testing.T) {
	for name, tc := range map[string]struct {
		size   int
		writes []string
		want   string
	}{
		"empty":         {4, nil, ""},
		"under":         {8, []string{"ab", "cd"}, "abcd"},
		"exactly full":  {4, []string{"ab", "cd"}, "abcd"},
		"wraps":         {4, []string{"abc", "def"}, "cdef"},
		"one big write": {4, []string{"abcdefgh"}, "efgh"},
		"many small":    {3, []string{"a", "b", "c", "d", "e"}, "cde"},
	} {
		t.Run(name, func(t *testing.T) {
			r := newRing(tc.size)
			for _, w := range tc.writes {
				r.Write([]byte(w))
			}
			if got := string(r.Bytes()); got != tc.want {
				t.Fatalf("ring holds %q, want %q", got, tc.want)
			}
		})
	}
}

func TestOneWriterAndReadOnlyViewers(t *testing.T) {
	audit := &auditLog{}
	h, link := newHub(t, Config{Auditor: audit})
	ctx := context.Background()
	w1, err := h.Attach(ctx, "m1", Write, false, "token:alice")
	if err != nil {
		t.Fatal(err)
	}
	ro, err := h.Attach(ctx, "m1", ReadOnly, false, "token:carol")
	if err != nil {
		t.Fatal(err)
	}
	if err := w1.Input(ctx, []byte("ls\r")); err != nil {
		t.Fatal(err)
	}
	if got := <-link.keys; string(got) != "ls\r" {
		t.Fatalf("machine got %q", got)
	}
	err = ro.Input(ctx, []byte("x"))
	if !errors.Is(err, ErrReadOnly) || !errors.Is(err, apierr.ErrPermissionDenied) {
		t.Fatalf("read-only input: %v, want ErrReadOnly in PermissionDenied", err)
	}
	if _, err := h.Attach(ctx, "m1", Write, false, "token:bob"); !errors.Is(err, apierr.ErrPrecondition) || !strings.Contains(err.Error(), "token:alice") {
		t.Fatalf("second writer: %v, want FailedPrecondition naming the writer", err)
	}
	w2, err := h.Attach(ctx, "m1", Write, true, "token:bob")
	if err != nil {
		t.Fatal(err)
	}
	_, evs := collect(t, w1, "")
	for !containsEvent(evs, EventWriteTaken) {
		o := <-w1.Output()
		evs = append(evs, o.Event)
		if o.Event == EventWriteTaken && o.Detail != "token:bob" {
			t.Fatalf("WRITE_TAKEN detail %q", o.Detail)
		}
	}
	if w1.Mode() != ReadOnly {
		t.Fatal("taken writer is still a writer")
	}
	if err := w1.Input(ctx, []byte("y")); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("taken writer's input: %v", err)
	}
	if err := w2.Input(ctx, []byte("z")); err != nil {
		t.Fatal(err)
	}
	if got := <-link.keys; string(got) != "z" {
		t.Fatalf("machine got %q", got)
	}
	w2.Close()
	w2.Close()
	w1.Close()
	ro.Close()
	want := []string{"m1: console attach write", "m1: console attach read-only", "m1: console attach write", "m1: console take write",
		"m1: console detach", "m1: console detach", "m1: console detach"}
	if got := audit.list(); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("audit:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func containsEvent(evs []Event, e Event) bool {
	for _, x := range evs {
		if x == e {
			return true
		}
	}
	return false
}

func TestViewersBounded(t *testing.T) {
	h, _ := newHub(t, Config{MaxViewers: 2})
	ctx := context.Background()
	for range 2 {
		v, err := h.Attach(ctx, "m1", ReadOnly, false, "")
		if err != nil {
			t.Fatal(err)
		}
		defer v.Close()
	}
	if _, err := h.Attach(ctx, "m1", ReadOnly, false, ""); !errors.Is(err, apierr.ErrExhausted) {
		t.Fatalf("third viewer: %v, want ErrExhausted", err)
	}
	// Another machine has its own bound.
	v, err := h.Attach(ctx, "m2", ReadOnly, false, "")
	if err != nil {
		t.Fatal(err)
	}
	v.Close()
}

func TestLinkStartsOnFirstViewerAndStopsAfterLinger(t *testing.T) {
	h, link := newHub(t, Config{Linger: 50 * time.Millisecond, KeptScrollbacks: 1})
	ctx := context.Background()
	if n, _ := link.state("m1"); n != 0 {
		t.Fatal("link started before any viewer")
	}
	v, err := h.Attach(ctx, "m1", ReadOnly, false, "")
	if err != nil {
		t.Fatal(err)
	}
	link.print(t, "m1", "before it hung")
	collect(t, v, "before it hung")
	v.Close()
	waitFor(t, "link stops after the linger", func() bool { _, running := link.state("m1"); return !running })
	// The scrollback outlives the link.
	v, err = h.Attach(ctx, "m1", ReadOnly, false, "")
	if err != nil {
		t.Fatal(err)
	}
	collect(t, v, "before it hung")
	// A viewer back within the linger keeps the link.
	v.Close()
	v, err = h.Attach(ctx, "m1", ReadOnly, false, "")
	if err != nil {
		t.Fatal(err)
	}
	v.Close()
	waitFor(t, "link stops", func() bool { _, running := link.state("m1"); return !running })
	// KeptScrollbacks 1: a second idle machine drops the longest idle.
	v2, err := h.Attach(ctx, "m2", ReadOnly, false, "")
	if err != nil {
		t.Fatal(err)
	}
	v2.Close()
	waitFor(t, "m1's scrollback dropped", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		_, ok := h.sessions["m1"]
		return !ok && len(h.sessions) == 1
	})
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestSlowViewerIsCut(t *testing.T) {
	h, link := newHub(t, Config{ViewerBuffer: 4, Scrollback: 16})
	ctx := context.Background()
	slow, err := h.Attach(ctx, "m1", ReadOnly, false, "")
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	for i := range 20 {
		link.print(t, "m1", strings.Repeat("x", i+1))
	}
	select {
	case <-slow.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("slow viewer never cut")
	}
	if err := slow.Err(); !errors.Is(err, ErrSlow) || !errors.Is(err, apierr.ErrExhausted) {
		t.Fatalf("cut with %v", err)
	}
}

func TestCheckRefusesBeforeAttach(t *testing.T) {
	link := newFakeLink()
	link.check = apierr.Preconditionf("machine %q has no enrolled BMC", "m1")
	h, _ := newHub(t, Config{Link: link})
	if _, err := h.Attach(context.Background(), "m1", Write, false, ""); !errors.Is(err, apierr.ErrPrecondition) {
		t.Fatalf("attach: %v", err)
	}
	if n, _ := h.Viewers("m1"); n != 0 {
		t.Fatal("a refused attach left a viewer")
	}
}

func TestLinkDownIsToldAndRetried(t *testing.T) {
	link := newFakeLink()
	link.fail = errors.New("BMC unreachable")
	h, _ := newHub(t, Config{Link: link, Retry: 10 * time.Millisecond})
	v, err := h.Attach(context.Background(), "m1", ReadOnly, false, "")
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	for {
		o := <-v.Output()
		if o.Event == EventLinkDown {
			if !strings.Contains(o.Detail, "BMC unreachable") {
				t.Fatalf("LINK_DOWN detail %q", o.Detail)
			}
			break
		}
	}
	link.mu.Lock()
	link.fail = nil
	link.mu.Unlock()
	for o := range v.Output() {
		if o.Event == EventLinkUp {
			break
		}
	}
}

func TestInputBounded(t *testing.T) {
	h, _ := newHub(t, Config{})
	v, err := h.Attach(context.Background(), "m1", Write, false, "")
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if err := v.Input(context.Background(), bytes.Repeat([]byte("a"), MaxInput+1)); !errors.Is(err, apierr.ErrInvalid) {
		t.Fatalf("oversize input: %v", err)
	}
}
