package deploy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func pendingStatus(until time.Time) error {
	return status.Errorf(codes.FailedPrecondition, "block storage %q is PENDING (fetch by appliance-1 until %s): retry later", "disk", until.UTC().Format(time.RFC3339Nano))
}

func TestRetryPending(t *testing.T) {
	until := time.Date(2030, 1, 2, 3, 4, 5, 600, time.UTC)
	for name, tc := range map[string]struct {
		err      error
		ok       bool
		deadline time.Time
	}{
		"retry later":         {err: pendingStatus(until), ok: true, deadline: until},
		"RFC 3339 seconds":    {err: status.Error(codes.FailedPrecondition, `virtual machine "vm1" is PENDING (create by a1 until 2030-01-02T03:04:05Z): retry later`), ok: true, deadline: until.Truncate(time.Second)},
		"past the deadline":   {err: status.Error(codes.FailedPrecondition, `block storage "d" is PENDING (fetch by a1) past its deadline 2030-01-02T03:04:05Z: the reconciler will resolve it`), ok: true},
		"unparsable deadline": {err: status.Error(codes.FailedPrecondition, `block storage "d" is PENDING (fetch by a1 until soon): retry later`), ok: true},
		"not READY":           {err: status.Error(codes.FailedPrecondition, "node n1 is not READY")},
		"lost its claim":      {err: status.Error(codes.FailedPrecondition, `block storage "d": this operation lost its PENDING claim (deadline passed, the reconciler took over)`)},
		"other code":          {err: status.Error(codes.Unavailable, `block storage "d" is PENDING (fetch by a1 until 2030-01-02T03:04:05Z): retry later`)},
		"not a status":        {err: errors.New(`x is PENDING (y by z until 2030-01-02T03:04:05Z): retry later`)},
	} {
		t.Run(name, func(t *testing.T) {
			deadline, ok := retryPending(tc.err)
			if ok != tc.ok || !deadline.Equal(tc.deadline) {
				t.Errorf("retryPending = %v %v, want %v %v", deadline, ok, tc.deadline, tc.ok)
			}
		})
	}
}

func TestPendingBackoff(t *testing.T) {
	var got []time.Duration
	b := pendingBackoff()
	for a := 1; a <= 7; a++ {
		got = append(got, b.NextBackOff())
	}
	want := []time.Duration{200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, 1600 * time.Millisecond, 3200 * time.Millisecond, 5 * time.Second, 5 * time.Second}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("backoff (-want +got):\n%s", diff)
	}
}

// TestRunRetriesPending: a task that meets a PENDING record is sent again
// (its dependents wait for it) and succeeds; a real FailedPrecondition
// is not retried; PendingWait bounds the retries, and negative turns them
// off.
func TestRunRetriesPending(t *testing.T) {
	soon := time.Now().Add(300 * time.Millisecond)
	for name, tc := range map[string]struct {
		behave      behaviour
		wait        time.Duration
		want        map[string]string
		attempts    int
		retryEvents int
	}{
		"pending twice": {behave: behaviour{err: pendingStatus(soon), times: 2},
			want: map[string]string{"reg": "succeeded", "after": "succeeded"}, attempts: 3, retryEvents: 2},
		"past its deadline, then done": {behave: behaviour{err: status.Error(codes.FailedPrecondition, `block storage "d" is PENDING (fetch by a1) past its deadline 2020-01-02T03:04:05Z: the reconciler will resolve it`), times: 1},
			want: map[string]string{"reg": "succeeded", "after": "succeeded"}, attempts: 2, retryEvents: 1},
		"a real precondition": {behave: behaviour{err: status.Error(codes.FailedPrecondition, "node n1 is not READY")},
			want: map[string]string{"reg": "failed", "after": `skipped: dependency "reg" failed`}, attempts: 1},
		"bounded by PendingWait": {behave: behaviour{err: pendingStatus(time.Now().Add(time.Hour))}, wait: 700 * time.Millisecond,
			want: map[string]string{"reg": "failed", "after": `skipped: dependency "reg" failed`}, attempts: 3, retryEvents: 2},
		"retries off": {behave: behaviour{err: pendingStatus(soon), times: 1}, wait: -1,
			want: map[string]string{"reg": "failed", "after": `skipped: dependency "reg" failed`}, attempts: 1},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakePool(map[string]behaviour{"reg": tc.behave})
			p := dag(t, []string{"reg", "other", "after"}, map[string][]string{"after": {"reg"}})
			var retries []string
			r := &Runner{Conn: serve(t, f), PendingWait: tc.wait, Progress: func(e Event) {
				if e.Kind == Retrying {
					retries = append(retries, fmt.Sprintf("%s attempt %d: %s", e.Task.Name, e.Attempt, status.Code(e.Err)))
					if e.Wait <= 0 || e.GiveUp.IsZero() {
						t.Errorf("retry event %+v", e)
					}
				}
			}}
			s, err := r.Run(context.Background(), p)
			if failed := strings.HasPrefix(tc.want["reg"], "failed"); failed != errors.Is(err, ErrTaskFailed) {
				t.Errorf("Run: %v", err)
			}
			got := outcomes(s)
			delete(got, "other")
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("outcomes (-want +got):\n%s", diff)
			}
			if a := s.Results[0].Attempts; a != tc.attempts {
				t.Errorf("attempts %d, want %d", a, tc.attempts)
			}
			if len(retries) != tc.retryEvents {
				t.Errorf("retry events %v, want %d", retries, tc.retryEvents)
			}
			if s.Results[1].Attempts != 1 {
				t.Errorf("other: %d attempts", s.Results[1].Attempts)
			}
		})
	}
}

// TestRunRetriesNotFoundAfterSiblings: n0stack's register-image file
// leaves out RegisterBlockStorage's dependency on FetchBlockStorage. A task
// answered NotFound while siblings are in flight is sent again once they
// have ended (the Retrying event names them); with nothing in flight, or
// past maxNotFoundRetries, or when ignored, NotFound is the task's end.
func TestRunRetriesNotFoundAfterSiblings(t *testing.T) {
	notFound := status.Error(codes.NotFound, `block storage "cloudimage-ubuntu-1804"`)
	for name, tc := range map[string]struct {
		behave   map[string]behaviour
		tasks    []string
		want     map[string]string
		attempts int
		after    []string
	}{
		"created by a sibling in flight": {
			behave:   map[string]behaviour{"fetch": {delay: 300 * time.Millisecond}, "reg": {err: notFound, times: 1}},
			tasks:    []string{"fetch", "reg"},
			want:     map[string]string{"fetch": "succeeded", "reg": "succeeded"},
			attempts: 2, after: []string{"fetch"},
		},
		"nothing in flight": {
			behave:   map[string]behaviour{"reg": {err: notFound}},
			tasks:    []string{"reg"},
			want:     map[string]string{"reg": "failed"},
			attempts: 1,
		},
		"still missing after the siblings": {
			behave:   map[string]behaviour{"fetch": {delay: 200 * time.Millisecond}, "reg": {err: notFound}},
			tasks:    []string{"fetch", "reg"},
			want:     map[string]string{"fetch": "succeeded", "reg": "failed"},
			attempts: 2, after: []string{"fetch"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakePool(tc.behave)
			p := dag(t, tc.tasks, nil)
			var after [][]string
			r := &Runner{Conn: serve(t, f), Progress: func(e Event) {
				if e.Kind == Retrying {
					after = append(after, e.After)
				}
			}}
			s, err := r.Run(context.Background(), p)
			if failed := tc.want["reg"] == "failed"; failed != errors.Is(err, ErrTaskFailed) {
				t.Errorf("Run: %v", err)
			}
			if diff := cmp.Diff(tc.want, outcomes(s)); diff != "" {
				t.Errorf("outcomes (-want +got):\n%s", diff)
			}
			reg := s.Results[len(tc.tasks)-1]
			if reg.Attempts != tc.attempts {
				t.Errorf("reg: %d attempts, want %d", reg.Attempts, tc.attempts)
			}
			var wantAfter [][]string
			if tc.after != nil {
				wantAfter = [][]string{tc.after}
			}
			if diff := cmp.Diff(wantAfter, after); diff != "" {
				t.Errorf("retry events' After (-want +got):\n%s", diff)
			}
		})
	}
}
