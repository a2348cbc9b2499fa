package appliance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
	hypervisorv1 "github.com/corralhq/corral/api/hypervisor/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/internal/apierr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// nodeClient returns the HypervisorService client of a READY node.
func (s *Services) nodeClient(ctx context.Context, nodeName string) (hypervisorv1.HypervisorServiceClient, error) {
	n, err := s.cfg.Pool.GetNode(ctx, nodeName)
	if err != nil {
		return nil, err
	}
	if n.GetState() != poolv1.Node_READY {
		return nil, apierr.Preconditionf("node %q is %s, not READY", nodeName, n.GetState())
	}
	return s.dial(ctx, nodeName)
}

// dial reaches a node without checking its state.
func (s *Services) dial(ctx context.Context, nodeName string) (hypervisorv1.HypervisorServiceClient, error) {
	c, err := s.cfg.Nodes.Hypervisor(ctx, nodeName)
	if err != nil {
		if errors.Is(err, apierr.ErrNotFound) {
			return nil, err
		}
		return nil, apierr.Unavailablef("node %q: %v", nodeName, err)
	}
	return c, nil
}

// callContext bounds one short node call.
func (s *Services) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.cfg.NodeCallTimeout)
}

// nodeErr turns a node's gRPC error into a classified error that names the
// node and the operation and keeps the node's message.
func nodeErr(node, op string, err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		if errors.Is(err, context.DeadlineExceeded) {
			return apierr.Unavailablef("node %q: %s: timed out", node, op)
		}
		return fmt.Errorf("node %q: %s: %w", node, op, err)
	}
	msg := st.Message()
	switch st.Code() {
	case codes.InvalidArgument, codes.OutOfRange:
		return apierr.Invalidf("node %q: %s: %s", node, op, msg)
	case codes.NotFound:
		return apierr.NotFoundf("node %q: %s: %s", node, op, msg)
	case codes.AlreadyExists:
		return apierr.Existsf("node %q: %s: %s", node, op, msg)
	case codes.FailedPrecondition, codes.Aborted:
		return apierr.Preconditionf("node %q: %s: %s", node, op, msg)
	case codes.ResourceExhausted:
		return apierr.Exhaustedf("node %q: %s: %s", node, op, msg)
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return apierr.Unavailablef("node %q: %s: %s (%s)", node, op, msg, st.Code())
	default: // the rest: an error of no class that names the code
		return fmt.Errorf("node %q: %s: %s (%s)", node, op, msg, st.Code())
	}
}

// ignoreNotFound drops NotFound: compensations and roll-forwards are
// idempotent.
func ignoreNotFound(err error) error {
	if errors.Is(err, apierr.ErrNotFound) {
		return nil
	}
	return err
}

// compensation is one inverse step.
type compensation struct {
	name string
	fn   func(ctx context.Context) error
}

// txn is a LIFO compensation stack (n0stack's transaction, minus its bugs).
// It is used by one goroutine.
type txn struct {
	s     *Services
	kind  string
	name  string
	steps []compensation
}

func (s *Services) begin(kind, name string) *txn { return &txn{s: s, kind: kind, name: name} }

// push records the inverse of a step that has just succeeded.
func (t *txn) push(name string, fn func(ctx context.Context) error) {
	t.steps = append(t.steps, compensation{name: name, fn: fn})
}

// compensationAttempts and compensationBackoff bound the retries of one
// compensation.
var (
	compensationAttempts = 5
	compensationBackoff  = 50 * time.Millisecond
)

// rollback runs the stack LIFO, retrying each step with exponential
// backoff. Failures are logged at LevelCritical and returned joined; later
// steps still run.
func (t *txn) rollback(ctx context.Context, cause error) error {
	var failed []string
	var errs []error
	for i := len(t.steps) - 1; i >= 0; i-- {
		st := t.steps[i]
		var err error
		pause := backoff.ExponentialBackOff{InitialInterval: compensationBackoff, Multiplier: 2,
			MaxInterval: compensationBackoff << compensationAttempts}
		for attempt := 0; attempt < compensationAttempts; attempt++ {
			if err = st.fn(ctx); err == nil {
				break
			}
			if ctx.Err() != nil {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(pause.NextBackOff()):
			}
		}
		if err != nil {
			t.s.log.Log(ctx, LevelCritical, "compensation failed", "kind", t.kind, "name", t.name,
				"step", st.name, "cause", cause.Error(), "err", err.Error())
			failed = append(failed, st.name+": "+err.Error())
			errs = append(errs, fmt.Errorf("%s: %w", st.name, err))
		}
	}
	t.steps = nil
	if len(errs) == 0 {
		t.s.log.Info("rolled back", "kind", t.kind, "name", t.name, "cause", cause.Error())
		return nil
	}
	return fmt.Errorf("rollback of %s %q incomplete (%s): %w", t.kind, t.name, strings.Join(failed, "; "), errors.Join(errs...))
}

// logAttrs is a helper for machine-readable decommission logs.
func logAttrs(kind, name string, kv ...any) []any {
	return append([]any{slog.String("kind", kind), slog.String("name", name)}, kv...)
}
