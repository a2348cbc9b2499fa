package apierr

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/corralhq/corral/store"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestToStatus(t *testing.T) {
	cases := map[string]struct {
		err  error
		want codes.Code
	}{
		"invalid":      {Invalidf("bad %s", "x"), codes.InvalidArgument},
		"not found":    {NotFoundf("x"), codes.NotFound},
		"store miss":   {fmt.Errorf("get: %w", store.ErrNotFound), codes.NotFound},
		"exists":       {Existsf("x"), codes.AlreadyExists},
		"exhausted":    {Exhaustedf("x"), codes.ResourceExhausted},
		"precondition": {Preconditionf("x"), codes.FailedPrecondition},
		"unavailable":  {Unavailablef("x"), codes.Unavailable},
		"closed":       {store.ErrClosed, codes.Unavailable},
		"deadline":     {context.DeadlineExceeded, codes.DeadlineExceeded},
		"corrupt":      {fmt.Errorf("x: %w", store.ErrCorrupt), codes.DataLoss},
		"other":        {errors.New("boom"), codes.Internal},
		"status":       {status.Error(codes.Aborted, "x"), codes.Aborted},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := status.Code(ToStatus(tc.err)); got != tc.want {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
	if ToStatus(nil) != nil {
		t.Fatal("nil error mapped to a status")
	}
}

func TestMessageDoesNotRepeatClass(t *testing.T) {
	err := Invalidf("node %q: bad", "n1")
	if err.Error() != `node "n1": bad` || !errors.Is(err, ErrInvalid) {
		t.Fatalf("%q", err)
	}
	if st := status.Convert(ToStatus(fmt.Errorf("apply: %w", err))); st.Message() != `apply: node "n1": bad` {
		t.Fatalf("status message %q", st.Message())
	}
}
