package deploy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// DefaultParallel is how many tasks run at once when Runner.Parallel is 0.
const DefaultParallel = 4

// ErrTaskFailed is wrapped by Run's error when a task without
// ignore_error failed.
var ErrTaskFailed = errors.New("task failed")

// Invoker makes one unary RPC. *grpc.ClientConn implements it.
type Invoker interface {
	Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error
}

// Outcome is how a task ended.
type Outcome int

const (
	// NotRun is the zero value: the task has no result yet.
	NotRun Outcome = iota
	// Succeeded means the RPC returned without error.
	Succeeded
	// Failed means the RPC failed and the task has no ignore_error; the run
	// stops starting tasks.
	Failed
	// IgnoredFailure means the RPC failed and the task has ignore_error: true;
	// it counts as done, so its dependents run.
	IgnoredFailure
	// Skipped means the task was never started, because a dependency failed or
	// the run stopped (fail-fast or interrupt) before its turn.
	Skipped
)

func (o Outcome) String() string {
	switch o {
	case Succeeded:
		return "succeeded"
	case Failed:
		return "failed"
	case IgnoredFailure:
		return "ignored failure"
	case Skipped:
		return "skipped"
	default: // NotRun and values out of range
		return "not run"
	}
}

// EventKind says what an Event reports.
type EventKind int

const (
	// Started means the task's RPC is being sent.
	Started EventKind = iota + 1
	// Finished means the task ended; Event.Result says how.
	Finished
	// Retrying means the task's RPC found a record PENDING under another
	// operation (a retryable FailedPrecondition); it is sent again after
	// Event.Wait. Event.Err is the answer, Event.Attempt the attempts
	// made so far, Event.GiveUp when the task stops retrying. Or: the
	// task's RPC found an object NotFound while other tasks of the run
	// were in flight, one of which may be creating it; it is sent again
	// once those (Event.After) have ended.
	Retrying
)

// Event is one progress report of Run.
type Event struct {
	Kind EventKind
	Task *Task
	// Result is the task's result for Finished events.
	Result *Result
	// Done counts the tasks ended so far, this one included; Total is the
	// number of tasks in the plan.
	Done, Total int
	// Err, Wait, Attempt and GiveUp describe a Retrying event.
	Err     error
	Wait    time.Duration
	Attempt int
	GiveUp  time.Time
	// After names the in-flight tasks a NotFound retry waits for.
	After []string
}

// Result is how one task ended.
type Result struct {
	Task    *Task
	Outcome Outcome
	// Err is the RPC error of Failed and IgnoredFailure.
	Err error
	// Reason says why a task was Skipped.
	Reason string
	// Elapsed is the RPC's duration, retries included (zero when
	// Skipped).
	Elapsed time.Duration
	// Attempts counts the RPCs sent (more than one when PENDING answers
	// were retried; zero when Skipped).
	Attempts int
	// Response is the RPC's answer when Succeeded.
	Response proto.Message
}

// Summary is the result of a Run.
type Summary struct {
	// Results has one entry per task, in plan order.
	Results []*Result
	// Counts by outcome.
	Succeeded, Failed, Ignored, Skipped int
	Elapsed                             time.Duration
}

// Runner executes Plans. Its fields must not change while Run runs; one
// Runner may run several plans, concurrently too.
type Runner struct {
	// Conn sends the RPCs.
	Conn Invoker
	// Parallel bounds the tasks in flight; 0 means DefaultParallel.
	Parallel int
	// TaskTimeout is the deadline of each task's RPC; 0 means none
	// beyond ctx.
	TaskTimeout time.Duration
	// PendingWait bounds how long one task keeps sending its RPC again
	// while the answer is that a record it needs is PENDING under another
	// operation (FailedPrecondition "... is PENDING (... until DEADLINE):
	// retry later", or past that deadline until the reconciler resolves
	// it); 0 means DefaultPendingWait, negative never retries. Retries
	// back off from 200 ms to 5 s and are sent again right after the
	// record's deadline. Other FailedPreconditions are not retried.
	PendingWait time.Duration
	// Progress, when set, receives every event in order, from the
	// goroutine that called Run (never concurrently). It must not block
	// for long: no task is started while it runs.
	Progress func(Event)
}

// DefaultPendingWait is Runner.PendingWait's default.
const DefaultPendingWait = 5 * time.Minute

// done is what a task's goroutine hands back to Run.
type done struct {
	index    int
	err      error
	elapsed  time.Duration
	attempts int
	resp     proto.Message
}

// Run executes p and blocks until every started task has ended. A task
// starts once all its depends_on ended as Succeeded or IgnoredFailure;
// independent tasks run concurrently, at most Parallel at a time, taken in
// plan order.
//
// Fail-fast: after the first Failed task no task is started; tasks already
// in flight are not cancelled and are waited for (drained), and the rest
// are Skipped. When ctx is cancelled no task is started either, and the
// in-flight RPCs see the cancellation through their context.
//
// Run returns the summary, and an error wrapping ErrTaskFailed when a task
// Failed, or ctx's error when the run was interrupted. A bad Runner
// configuration is an error before anything is sent.
func (r *Runner) Run(ctx context.Context, p *Plan) (*Summary, error) {
	if r.Conn == nil {
		return nil, errors.New("deploy: Runner.Conn is nil")
	}
	if p == nil {
		return nil, errors.New("deploy: nil plan")
	}
	parallel := r.Parallel
	if parallel == 0 {
		parallel = DefaultParallel
	}
	if parallel < 0 {
		return nil, fmt.Errorf("deploy: parallel must be positive, got %d", r.Parallel)
	}
	if r.TaskTimeout < 0 {
		return nil, fmt.Errorf("deploy: task timeout must not be negative, got %v", r.TaskTimeout)
	}
	emit := r.Progress
	if emit == nil {
		emit = func(Event) {}
	}

	began := time.Now()
	n := len(p.Tasks)
	index := make(map[string]int, n)
	for i, t := range p.Tasks {
		index[t.Name] = i
	}
	waiting := make([]int, n)     // dependencies not yet ended well
	children := make([][]int, n)  // dependents, by index
	results := make([]*Result, n) // nil until the task ends
	for i, t := range p.Tasks {
		waiting[i] = len(t.DependsOn)
		for _, d := range t.DependsOn {
			children[index[d]] = append(children[index[d]], i)
		}
	}
	var ready []int // indexes, kept sorted: plan order
	for i := range p.Tasks {
		if waiting[i] == 0 {
			ready = append(ready, i)
		}
	}

	// Every goroutine sends exactly one value, and the buffer holds one
	// per task, so a send never blocks and the channel is never closed.
	finished := make(chan done, n)
	// Retrying events come from the task goroutines through notes, so
	// that Progress is still called from this goroutine only; a task waits
	// for its note to be taken, so at most Parallel are pending.
	notes := make(chan Event)
	running, ended := 0, 0
	var firstFailure string
	// A task answered NotFound while siblings were in flight is parked
	// until they end, then sent again (at most maxNotFoundRetries times):
	// n0stack's files leave out dependencies on the task creating an
	// object (RegisterBlockStorage on FetchBlockStorage), which work only
	// when tasks run in file order.
	inFlight := make(map[int]bool, parallel)
	var parked []*parkedTask
	notFoundTries := make([]int, n)
	// priorAttempts and priorElapsed carry a re-sent task's earlier sends.
	priorAttempts := make([]int, n)
	priorElapsed := make([]time.Duration, n)

	// finish records how the task of d ended and readies its dependents.
	finish := func(d done) {
		ended++
		t := p.Tasks[d.index]
		res := &Result{Task: t, Elapsed: d.elapsed + priorElapsed[d.index], Attempts: d.attempts + priorAttempts[d.index]}
		switch {
		case d.err == nil:
			res.Outcome, res.Response = Succeeded, d.resp
		case t.IgnoreError:
			res.Outcome, res.Err = IgnoredFailure, d.err
		default:
			res.Outcome, res.Err = Failed, d.err
			if firstFailure == "" {
				firstFailure = t.Name
			}
		}
		results[d.index] = res
		if res.Outcome != Failed {
			for _, c := range children[d.index] {
				waiting[c]--
				if waiting[c] == 0 {
					ready = insertSorted(ready, c)
				}
			}
		}
		emit(Event{Kind: Finished, Task: t, Result: res, Done: ended, Total: n})
	}

	for {
		for firstFailure == "" && ctx.Err() == nil && running < parallel && len(ready) > 0 {
			i := ready[0]
			ready = ready[1:]
			running++
			inFlight[i] = true
			emit(Event{Kind: Started, Task: p.Tasks[i], Done: ended, Total: n})
			go func(i int, t *Task) {
				finished <- r.call(ctx, i, t, notes)
			}(i, p.Tasks[i])
		}
		if running == 0 {
			break
		}
		var d done
		select {
		case d = <-finished:
		case e := <-notes:
			e.Done, e.Total = ended, n
			emit(e)
			continue
		}
		running--
		delete(inFlight, d.index)
		var unparked []done
		parked, unparked = unpark(parked, d.index)
		for _, u := range unparked {
			if firstFailure != "" || ctx.Err() != nil {
				// Nothing more starts: the NotFound stands.
				priorAttempts[u.index] -= u.attempts
				priorElapsed[u.index] -= u.elapsed
				finish(u)
				continue
			}
			ready = insertSorted(ready, u.index)
		}
		if pk := park(d, p.Tasks[d.index], inFlight, notFoundTries, ctx.Err() != nil || firstFailure != ""); pk != nil {
			parked = append(parked, pk)
			priorAttempts[d.index] += d.attempts
			priorElapsed[d.index] += d.elapsed
			var after []string
			for j := range pk.waitFor {
				after = append(after, p.Tasks[j].Name)
			}
			slices.Sort(after)
			emit(Event{Kind: Retrying, Task: p.Tasks[d.index], Err: d.err, Attempt: d.attempts, After: after, Done: ended, Total: n})
			continue
		}
		finish(d)
	}

	interrupted := ctx.Err() != nil
	s := &Summary{Results: results}
	for i, t := range p.Tasks {
		if results[i] == nil {
			ended++
			results[i] = &Result{Task: t, Outcome: Skipped, Reason: skipReason(t, results, index, firstFailure, interrupted)}
			emit(Event{Kind: Finished, Task: t, Result: results[i], Done: ended, Total: n})
		}
		switch results[i].Outcome {
		case Succeeded:
			s.Succeeded++
		case Failed:
			s.Failed++
		case IgnoredFailure:
			s.Ignored++
		case Skipped:
			s.Skipped++
		case NotRun: // not reached: every task without a result was given Skipped above
		}
	}
	s.Elapsed = time.Since(began)

	var failed error
	if s.Failed > 0 {
		var names []string
		for _, res := range results {
			if res.Outcome == Failed {
				names = append(names, fmt.Sprintf("%q", res.Task.Name))
			}
		}
		failed = fmt.Errorf("%w: %s", ErrTaskFailed, strings.Join(names, ", "))
	}
	switch err := ctx.Err(); {
	case err != nil && failed != nil:
		return s, fmt.Errorf("%w; run interrupted: %w", failed, err)
	case err != nil && s.Skipped > 0:
		return s, fmt.Errorf("run interrupted: %w", err)
	}
	return s, failed
}

// call sends t's RPC, each attempt under the task deadline, again while
// the answer is a PENDING record (retryPending), within PendingWait.
func (r *Runner) call(ctx context.Context, i int, t *Task, notes chan<- Event) done {
	pendingWait := r.PendingWait
	if pendingWait == 0 {
		pendingWait = DefaultPendingWait
	}
	start := time.Now()
	giveUp := start.Add(pendingWait)
	pause := pendingBackoff()
	for attempt := 1; ; attempt++ {
		resp, err := r.invoke(ctx, t)
		d := done{index: i, err: err, elapsed: time.Since(start), attempts: attempt, resp: resp}
		if err == nil || pendingWait < 0 || ctx.Err() != nil {
			return d
		}
		deadline, ok := retryPending(err)
		if !ok {
			return d
		}
		wait := pause.NextBackOff()
		if left := time.Until(deadline); left > 0 && left < wait {
			wait = left + 50*time.Millisecond // just after the deadline
		}
		if time.Now().Add(wait).After(giveUp) {
			return d
		}
		select {
		case notes <- Event{Kind: Retrying, Task: t, Err: err, Wait: wait, Attempt: attempt, GiveUp: giveUp}:
		case <-ctx.Done():
			return d
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return d
		}
	}
}

// invoke sends t's RPC once under the task deadline.
func (r *Runner) invoke(ctx context.Context, t *Task) (proto.Message, error) {
	if r.TaskTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.TaskTimeout)
		defer cancel()
	}
	resp := t.Method.Output.New().Interface()
	if err := r.Conn.Invoke(ctx, t.Method.Path, t.Request, resp); err != nil {
		return nil, err
	}
	return resp, nil
}

// skipReason explains why t never started. Dependencies come first in
// plan order, so their results are already set.
func skipReason(t *Task, results []*Result, index map[string]int, firstFailure string, interrupted bool) string {
	for _, d := range t.DependsOn {
		if res := results[index[d]]; res.Outcome == Failed {
			return fmt.Sprintf("dependency %q failed", d)
		}
	}
	for _, d := range t.DependsOn {
		if res := results[index[d]]; res.Outcome == Skipped {
			return fmt.Sprintf("dependency %q was skipped", d)
		}
	}
	if interrupted {
		return "run interrupted"
	}
	if firstFailure != "" {
		return fmt.Sprintf("run stopped after %q failed", firstFailure)
	}
	return "not started"
}

func insertSorted(s []int, v int) []int {
	i := 0
	for i < len(s) && s[i] < v {
		i++
	}
	s = append(s, 0)
	copy(s[i+1:], s[i:])
	s[i] = v
	return s
}
