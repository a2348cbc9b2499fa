package apierr_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
	"github.com/corralhq/corral/testsupport/require"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestToStatus(t *testing.T) {
	cases := map[string]struct {
		err   error
		class error // nil: none
		want  codes.Code
	}{
		"invalid":           {apierr.Invalidf("bad %s", "x"), apierr.ErrInvalid, codes.InvalidArgument},
		"not found":         {apierr.NotFoundf("x"), apierr.ErrNotFound, codes.NotFound},
		"exists":            {apierr.Existsf("x"), apierr.ErrAlreadyExists, codes.AlreadyExists},
		"conflict":          {apierr.Conflictf("x"), apierr.ErrConflict, codes.Internal},
		"precondition":      {apierr.Preconditionf("x"), apierr.ErrPrecondition, codes.FailedPrecondition},
		"exhausted":         {apierr.Exhaustedf("x"), apierr.ErrExhausted, codes.ResourceExhausted},
		"unavailable":       {apierr.Unavailablef("x"), apierr.ErrUnavailable, codes.Unavailable},
		"permission denied": {apierr.PermissionDeniedf("x"), apierr.ErrPermissionDenied, codes.PermissionDenied},
		"data loss":         {apierr.DataLossf("x"), apierr.ErrDataLoss, codes.DataLoss},
		"out of range":      {apierr.OutOfRangef("x"), apierr.ErrOutOfRange, codes.OutOfRange},
		"wrapped":           {fmt.Errorf("schedule: %w", apierr.Exhaustedf("x")), apierr.ErrExhausted, codes.ResourceExhausted},
		"bare class":        {apierr.ErrInvalid, apierr.ErrInvalid, codes.InvalidArgument},
		"new sentinel":      {fmt.Errorf("op: %w", apierr.New(apierr.ErrPrecondition, "in use")), apierr.ErrPrecondition, codes.FailedPrecondition},

		"store not found": {fmt.Errorf("get: %w", store.ErrNotFound), apierr.ErrNotFound, codes.NotFound},
		"store conflict":  {fmt.Errorf("put: %w", store.ErrConflict), apierr.ErrConflict, codes.Internal},
		"store closed":    {store.ErrClosed, apierr.ErrUnavailable, codes.Unavailable},
		"store corrupt":   {fmt.Errorf("x: %w", store.ErrCorrupt), apierr.ErrDataLoss, codes.DataLoss},
		"store compacted": {fmt.Errorf("x: %w", store.ErrCompacted), apierr.ErrOutOfRange, codes.OutOfRange},
		"record schema":   {fmt.Errorf("x: %w", record.ErrSchema), apierr.ErrDataLoss, codes.DataLoss},

		"deadline": {context.DeadlineExceeded, nil, codes.DeadlineExceeded},
		"canceled": {fmt.Errorf("x: %w", context.Canceled), nil, codes.Canceled},
		"other":    {errors.New("boom"), nil, codes.Internal},
		"status":   {status.Error(codes.Aborted, "x"), nil, codes.Aborted},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := apierr.ToStatus(tc.err)
			if status.Code(got) != tc.want {
				t.Fatalf("code %v, want %v", status.Code(got), tc.want)
			}
			// The message is the error's text (a status keeps its own).
			if got, want := status.Convert(got).Message(), status.Convert(tc.err).Message(); got != want {
				t.Errorf("message %q, want %q", got, want)
			}
			if tc.class != nil && !errors.Is(tc.err, tc.class) {
				t.Errorf("%v is not of class %v", tc.err, tc.class)
			}
		})
	}
	if apierr.ToStatus(nil) != nil {
		t.Fatal("nil error mapped to a status")
	}
}

// TestStoreSentinels: the store's sentinels keep their own identity and
// text while belonging to a class.
func TestStoreSentinels(t *testing.T) {
	cases := map[string]struct {
		sentinel error
		text     string
	}{
		"not found": {store.ErrNotFound, "store: key not found"},
		"conflict":  {store.ErrConflict, "store: revision conflict"},
		"closed":    {store.ErrClosed, "store: closed"},
		"corrupt":   {store.ErrCorrupt, "store: corrupt data"},
		"compacted": {store.ErrCompacted, "store: revision compacted"},
		"schema":    {record.ErrSchema, "record: unsupported schema version"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := fmt.Errorf("k: %w", tc.sentinel)
			if !errors.Is(err, tc.sentinel) {
				t.Errorf("errors.Is(wrapped, sentinel) = false")
			}
			if tc.sentinel.Error() != tc.text {
				t.Errorf("text %q, want %q", tc.sentinel.Error(), tc.text)
			}
			for other, oc := range cases {
				if other != name && errors.Is(err, oc.sentinel) {
					t.Errorf("%v is also %v", tc.sentinel, oc.sentinel)
				}
			}
		})
	}
	// A class is not one of its members.
	if errors.Is(apierr.NotFoundf("x"), store.ErrNotFound) {
		t.Error("apierr.NotFoundf is store.ErrNotFound")
	}
}

func TestMessageDoesNotRepeatClass(t *testing.T) {
	err := apierr.Invalidf("node %q: bad", "n1")
	if err.Error() != `node "n1": bad` || !errors.Is(err, apierr.ErrInvalid) {
		t.Fatalf("%q", err)
	}
	if st := status.Convert(apierr.ToStatus(fmt.Errorf("apply: %w", err))); st.Message() != `apply: node "n1": bad` {
		t.Fatalf("status message %q", st.Message())
	}
}

// TestLeaf: the vocabulary is on the ground floor, so that the store
// contract and the node agent can both import it.
func TestLeaf(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/corralhq/corral/internal/apierr").Output()
	if err != nil {
		require.Missing(t, "go list: %v", err)
	}
	var corral []string
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "github.com/corralhq/corral/") && dep != "github.com/corralhq/corral/internal/apierr" {
			corral = append(corral, dep)
		}
	}
	if diff := cmp.Diff([]string(nil), corral); diff != "" {
		t.Errorf("internal/apierr imports Corral packages (-want +got):\n%s", diff)
	}
}
