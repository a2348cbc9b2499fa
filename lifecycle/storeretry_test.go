package lifecycle

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/corralhq/corral/internal/apierr"
)

// TestRetryStore: a store that times out or is saturated is tried again
// until it answers; any other error is returned at once.
func TestRetryStore(t *testing.T) {
	l := &Lifecycle{log: slog.New(slog.DiscardHandler)}
	calls := 0
	err := l.retryStore(context.Background(), "m", func() error {
		calls++
		switch calls {
		case 1:
			return apierr.Unavailablef("store/etcd: put x: the etcd cluster did not answer within 5s")
		case 2:
			return apierr.Exhaustedf("store/etcd: put x: the appliance's store is saturated")
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("transient failures: %d calls, %v; want 3 calls and nil", calls, err)
	}
	calls = 0
	refused := apierr.Preconditionf("machine is not INSTALLING")
	if err := l.retryStore(context.Background(), "m", func() error { calls++; return refused }); !errors.Is(err, refused) || calls != 1 {
		t.Fatalf("a refusal: %d calls, %v; want 1 call and the refusal", calls, err)
	}
}
