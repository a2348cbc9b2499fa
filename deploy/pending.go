package deploy

import (
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Corral's services answer a call that meets a record PENDING under
// another operation with FailedPrecondition and one of these message
// shapes (hypervisor/appliance pendingErr); there is no structured detail
// on the wire, so the message is the contract:
//
//	<kind> "<name>" is PENDING (<op> by <owner> until <RFC 3339>): retry later
//	<kind> "<name>" is PENDING (<op> by <owner>) past its deadline <RFC 3339>: the reconciler will resolve it
//
// Any other FailedPrecondition (wrong state, node not READY, ...) is a
// real failure.
const (
	pendingMark      = " is PENDING ("
	retryLaterSuffix = "): retry later"
	reconcilerSuffix = ": the reconciler will resolve it"
	untilMark        = " until "
)

// retryPending reports whether err is worth sending again because a
// record the call needs is PENDING, and until when the record is PENDING
// when the answer says (zero otherwise).
func retryPending(err error) (deadline time.Time, ok bool) {
	st, isStatus := status.FromError(err)
	if !isStatus || st.Code() != codes.FailedPrecondition {
		return time.Time{}, false
	}
	msg := st.Message()
	if !strings.Contains(msg, pendingMark) {
		return time.Time{}, false
	}
	switch {
	case strings.HasSuffix(msg, retryLaterSuffix):
		body := strings.TrimSuffix(msg, retryLaterSuffix)
		if i := strings.LastIndex(body, untilMark); i >= 0 {
			if t, err := time.Parse(time.RFC3339Nano, body[i+len(untilMark):]); err == nil {
				return t, true
			}
		}
		return time.Time{}, true
	case strings.HasSuffix(msg, reconcilerSuffix):
		return time.Time{}, true
	}
	return time.Time{}, false
}

// pendingBackoff returns the pauses between the attempts of one task:
// 200 ms doubling to 5 s, without jitter.
func pendingBackoff() *backoff.ExponentialBackOff {
	return &backoff.ExponentialBackOff{InitialInterval: 200 * time.Millisecond, Multiplier: 2, MaxInterval: 5 * time.Second}
}

// maxNotFoundRetries bounds how often one task answered NotFound is sent
// again after its in-flight siblings ended.
const maxNotFoundRetries = 3

// parkedTask is a task answered NotFound, waiting for the tasks that were
// in flight then (one of them may create what it needs).
type parkedTask struct {
	d       done
	waitFor map[int]bool
}

// park returns the parked form of d when its task should be sent again
// after its in-flight siblings: its answer was NotFound, others are in
// flight, it may still fail for real (not IgnoreError) and has retries
// left; nil otherwise. stopping means nothing more will start.
func park(d done, t *Task, inFlight map[int]bool, tries []int, stopping bool) *parkedTask {
	if d.err == nil || status.Code(d.err) != codes.NotFound || t.IgnoreError || stopping ||
		len(inFlight) == 0 || tries[d.index] >= maxNotFoundRetries {
		return nil
	}
	tries[d.index]++
	w := make(map[int]bool, len(inFlight))
	for j := range inFlight {
		w[j] = true
	}
	return &parkedTask{d: d, waitFor: w}
}

// unpark drops ended from every parked task's wait and returns those left
// waiting and the ones now free to be sent again.
func unpark(parked []*parkedTask, ended int) (waiting []*parkedTask, free []done) {
	for _, p := range parked {
		delete(p.waitFor, ended)
		if len(p.waitFor) == 0 {
			free = append(free, p.d)
			continue
		}
		waiting = append(waiting, p)
	}
	return waiting, free
}
