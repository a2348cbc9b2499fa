package watchstream_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	watchv1 "github.com/corralhq/corral/api/watch/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/internal/watchstream"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/mem"
)

// obj is what the test watches: "name=value" records under "o/".
type obj struct{ Name, Value string }

func config(s store.Store, from int64, match func(obj) bool) watchstream.Config[obj] {
	return watchstream.Config[obj]{
		Name: "objects", Store: s, Prefix: "o/", FromRevision: from, Match: match,
		Limiter: watchstream.NewLimiter(10),
		Decode: func(kv store.KV) (obj, bool, error) {
			if strings.HasPrefix(kv.Key, "o/skip") {
				return obj{}, false, nil
			}
			if string(kv.Value) == "corrupt" {
				return obj{}, false, errors.New("corrupt")
			}
			return obj{strings.TrimPrefix(kv.Key, "o/"), string(kv.Value)}, true, nil
		},
		Deleted: func(key string) (obj, bool) { return obj{Name: strings.TrimPrefix(key, "o/")}, true },
	}
}

// stream runs a watch in the background and collects what it sends.
type stream struct {
	mu     sync.Mutex
	events []string
	revs   []int64
	done   chan error
	cancel context.CancelFunc
}

func start(t *testing.T, cfg watchstream.Config[obj]) *stream {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	st := &stream{done: make(chan error, 1), cancel: cancel}
	go func() {
		st.done <- watchstream.Run(ctx, cfg, func(ev watchstream.Event[obj]) error {
			st.mu.Lock()
			defer st.mu.Unlock()
			s := ev.Type.String()
			if ev.Type != watchv1.EventType_SYNCED {
				s += " " + ev.Object.Name + "=" + ev.Object.Value
			}
			st.events = append(st.events, s)
			st.revs = append(st.revs, ev.Revision)
			return nil
		})
	}()
	t.Cleanup(func() { cancel(); <-st.done })
	return st
}

// wait returns the first n events, failing after 10 s.
func (st *stream) wait(t *testing.T, n int) []string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		st.mu.Lock()
		if len(st.events) >= n {
			out := append([]string(nil), st.events[:n]...)
			st.mu.Unlock()
			return out
		}
		st.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	t.Fatalf("got %d of %d events: %v", len(st.events), n, st.events)
	return nil
}

func put(t *testing.T, s store.Store, key, value string) int64 {
	t.Helper()
	ctx := t.Context()
	var rev int64
	if kv, err := s.Get(ctx, key); err == nil {
		rev = kv.Revision
	}
	r, err := s.Put(ctx, key, []byte(value), rev)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func del(t *testing.T, s store.Store, key string) {
	t.Helper()
	kv, err := s.Get(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(t.Context(), key, kv.Revision); err != nil {
		t.Fatal(err)
	}
}

func TestListSyncedLive(t *testing.T) {
	s := mem.New()
	put(t, s, "o/a", "1")
	put(t, s, "o/b", "1")
	put(t, s, "o/skip", "x")
	put(t, s, "o/c", "corrupt")
	synced := put(t, s, "other", "x")
	st := start(t, config(s, 0, nil))
	got := st.wait(t, 3)
	want := []string{"ADDED a=1", "ADDED b=1", "SYNCED"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("initial events (-want +got):\n%s", diff)
	}
	st.mu.Lock()
	if st.revs[2] != synced {
		t.Errorf("SYNCED at %d, want the store's revision %d", st.revs[2], synced)
	}
	st.mu.Unlock()
	put(t, s, "o/a", "2")
	put(t, s, "o/d", "1")
	del(t, s, "o/b")
	got = st.wait(t, 6)[3:]
	want = []string{"MODIFIED a=2", "ADDED d=1", "DELETED b="}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("live events (-want +got):\n%s", diff)
	}
}

func TestFilter(t *testing.T) {
	s := mem.New()
	put(t, s, "o/a", "up")
	put(t, s, "o/b", "down")
	st := start(t, config(s, 0, func(o obj) bool { return o.Value == "up" }))
	st.wait(t, 2)
	put(t, s, "o/a", "down") // leaves the filter
	put(t, s, "o/b", "up")   // enters it
	put(t, s, "o/b", "up")   // stays
	put(t, s, "o/a", "down") // stays out: nothing
	del(t, s, "o/a")         // out already: nothing
	del(t, s, "o/b")
	got := st.wait(t, 6)[2:]
	want := []string{"DELETED a=down", "ADDED b=up", "MODIFIED b=up", "DELETED b="}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
}

func TestResume(t *testing.T) {
	s := mem.New()
	put(t, s, "o/a", "1")
	from := put(t, s, "o/b", "1")
	put(t, s, "o/a", "2")
	del(t, s, "o/b")
	st := start(t, config(s, from, nil))
	put(t, s, "o/c", "1")
	got := st.wait(t, 3)
	// No list, no SYNCED; unknown keys come as MODIFIED (the client may
	// hold them).
	want := []string{"MODIFIED a=2", "DELETED b=", "MODIFIED c=1"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
}

func TestErrors(t *testing.T) {
	s := mem.NewWithHistory(8, 0)
	old := put(t, s, "o/a", "1")
	for i := range 10 {
		put(t, s, fmt.Sprintf("o/n%d", i), "1")
	}
	cur := put(t, s, "o/z", "1")
	cases := map[string]struct {
		from  int64
		class error
		text  string
	}{
		"compacted": {old, apierr.ErrOutOfRange, "re-list with from_revision 0"},
		"future":    {cur + 100, apierr.ErrOutOfRange, "re-list with from_revision 0"},
		"negative":  {-1, apierr.ErrInvalid, "negative"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			sent := 0
			err := watchstream.Run(t.Context(), config(s, tc.from, nil), func(watchstream.Event[obj]) error { sent++; return nil })
			if !errors.Is(err, tc.class) || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("Run = %v, want class %v saying %q", err, tc.class, tc.text)
			}
			if sent != 0 {
				t.Fatalf("%d events sent before the error", sent)
			}
			if tc.class == apierr.ErrOutOfRange && !errors.Is(err, store.ErrCompacted) {
				t.Errorf("%v does not wrap store.ErrCompacted", err)
			}
		})
	}
}

// TestSlowWatcherCut: a client that does not read is cut with
// ErrExhausted naming the revision to resume from, writers never wait for
// it, and resuming from that revision delivers the rest.
func TestSlowWatcherCut(t *testing.T) {
	s := mem.New()
	put(t, s, "o/a", "0")
	cfg := config(s, 0, nil)
	cfg.Buffer = 16
	release := make(chan struct{})
	var lastRev int64
	var sent int
	done := make(chan error, 1)
	go func() {
		done <- watchstream.Run(t.Context(), cfg, func(ev watchstream.Event[obj]) error {
			if ev.Type == watchv1.EventType_SYNCED {
				<-release // the client stops reading after SYNCED
			}
			sent++
			lastRev = ev.Revision
			return nil
		})
	}()
	time.Sleep(50 * time.Millisecond)
	begin := time.Now()
	for i := range 5000 {
		put(t, s, fmt.Sprintf("o/k%d", i%50), fmt.Sprint(i))
	}
	t.Logf("5000 writes with a stalled watcher: %v", time.Since(begin))
	close(release)
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("stalled watcher not cut")
	}
	if !errors.Is(err, apierr.ErrExhausted) || !strings.Contains(err.Error(), fmt.Sprintf("resume with from_revision %d", lastRev)) {
		t.Fatalf("Run = %v, want ErrExhausted naming revision %d", err, lastRev)
	}
	if sent != 2 {
		t.Errorf("sent %d events, want ADDED and SYNCED only (the cut comes before the buffered ones)", sent)
	}
	// Resume: the stream continues from the named revision.
	st := start(t, config(s, lastRev, nil))
	if got := st.wait(t, 1)[0]; got != "MODIFIED k0=0" {
		t.Fatalf("first resumed event %q, want the first write after the cut", got)
	}
}

func TestLimiterAndCancel(t *testing.T) {
	s := mem.New()
	lim := watchstream.NewLimiter(2)
	var streams []*stream
	for range 2 {
		cfg := config(s, 0, nil)
		cfg.Limiter = lim
		st := start(t, cfg)
		st.wait(t, 1)
		streams = append(streams, st)
	}
	if lim.Active() != 2 {
		t.Fatalf("active %d, want 2", lim.Active())
	}
	cfg := config(s, 0, nil)
	cfg.Limiter = lim
	err := watchstream.Run(t.Context(), cfg, func(watchstream.Event[obj]) error { return nil })
	if !errors.Is(err, apierr.ErrExhausted) || !strings.Contains(err.Error(), "2 watchers") {
		t.Fatalf("third watcher: %v, want ErrExhausted at the limit of 2", err)
	}
	for _, st := range streams {
		st.cancel()
		if err := <-st.done; !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled watch returned %v", err)
		}
		st.done <- nil // for the cleanup
	}
	if lim.Active() != 0 {
		t.Fatalf("active %d after cancel, want 0", lim.Active())
	}
}
