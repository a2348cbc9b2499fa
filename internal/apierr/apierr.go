// Package apierr owns Corral's error vocabulary: the error classes every
// service shares and the one mapping from them to gRPC status codes.
//
// Domain packages use the classes by these names (apierr.ErrInvalid, never a
// re-exported alias), declare their own sentinels as members of a class
// (New: store.ErrNotFound is of class ErrNotFound), wrap them with %w, and
// their gRPC edges call ToStatus. It sits on the ground floor: it imports nothing of
// Corral's (only the standard library and gRPC's codes and status), so the
// store contract and the node agent may both use it.
package apierr

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Error classes. Test them with errors.Is; never compare their text.
var (
	// ErrInvalid: the request is malformed or names something impossible.
	ErrInvalid = errors.New("invalid argument")
	// ErrNotFound: the named object does not exist.
	ErrNotFound = errors.New("not found")
	// ErrAlreadyExists: the object to create exists already.
	ErrAlreadyExists = errors.New("already exists")
	// ErrConflict: a concurrent change won a compare-and-swap; the caller
	// may re-read and retry.
	ErrConflict = errors.New("conflict")
	// ErrPrecondition: the system is not in the state the operation needs
	// (the object is in use, in the wrong state, ...).
	ErrPrecondition = errors.New("failed precondition")
	// ErrExhausted: no capacity (or a size limit) is left for the request.
	ErrExhausted = errors.New("resource exhausted")
	// ErrUnavailable: a dependency (a BMC, an agent, a node, the store)
	// could not be reached.
	ErrUnavailable = errors.New("unavailable")
	// ErrPermissionDenied: the caller is known but may not do this.
	ErrPermissionDenied = errors.New("permission denied")
	// ErrDataLoss: stored data is corrupt or cannot be decoded.
	ErrDataLoss = errors.New("data loss")
	// ErrOutOfRange: the request names a position (a store revision) past
	// what is kept or not yet reached; the client must start over (a watch
	// re-lists with from_revision 0).
	ErrOutOfRange = errors.New("out of range")
)

// classCodes maps the classes (and the context errors) to gRPC codes, first
// match wins. ErrConflict stays Internal, the code a store conflict has
// always had at the API edges: a conflict that escapes a CAS retry loop
// is a server bug, not something the client can fix by retrying.
var classCodes = []struct {
	class error
	code  codes.Code
}{
	{ErrInvalid, codes.InvalidArgument},
	{ErrNotFound, codes.NotFound},
	{ErrAlreadyExists, codes.AlreadyExists},
	{ErrExhausted, codes.ResourceExhausted},
	{ErrPrecondition, codes.FailedPrecondition},
	{ErrUnavailable, codes.Unavailable},
	{context.DeadlineExceeded, codes.DeadlineExceeded},
	{context.Canceled, codes.Canceled},
	{ErrDataLoss, codes.DataLoss},
	{ErrPermissionDenied, codes.PermissionDenied},
	{ErrOutOfRange, codes.OutOfRange},
	{ErrConflict, codes.Internal},
}

// classed is an error of a class whose text does not repeat the class
// (the gRPC code already says it): "node \"n1\": cpu request ..." rather
// than "resource exhausted: node \"n1\": ...".
type classed struct {
	class error
	msg   string
}

func (e *classed) Error() string { return e.msg }
func (e *classed) Unwrap() error { return e.class }

// New returns a sentinel error of class class with text msg, for packages
// that own sentinels of their own: errors.Is(err, class) and
// errors.Is(err, sentinel) both hold for an error wrapping it. Like
// errors.New, each call returns a distinct error.
func New(class error, msg string) error { return &classed{class: class, msg: msg} }

func wrapf(class error, format string, a []any) error {
	return &classed{class: class, msg: fmt.Sprintf(format, a...)}
}

// Invalidf returns an error of class ErrInvalid.
func Invalidf(format string, a ...any) error { return wrapf(ErrInvalid, format, a) }

// NotFoundf returns an error of class ErrNotFound.
func NotFoundf(format string, a ...any) error { return wrapf(ErrNotFound, format, a) }

// Existsf returns an error of class ErrAlreadyExists.
func Existsf(format string, a ...any) error { return wrapf(ErrAlreadyExists, format, a) }

// Conflictf returns an error of class ErrConflict.
func Conflictf(format string, a ...any) error { return wrapf(ErrConflict, format, a) }

// Preconditionf returns an error of class ErrPrecondition.
func Preconditionf(format string, a ...any) error { return wrapf(ErrPrecondition, format, a) }

// Exhaustedf returns an error of class ErrExhausted.
func Exhaustedf(format string, a ...any) error { return wrapf(ErrExhausted, format, a) }

// Unavailablef returns an error of class ErrUnavailable.
func Unavailablef(format string, a ...any) error { return wrapf(ErrUnavailable, format, a) }

// PermissionDeniedf returns an error of class ErrPermissionDenied.
func PermissionDeniedf(format string, a ...any) error {
	return wrapf(ErrPermissionDenied, format, a)
}

// OutOfRangef returns an error of class ErrOutOfRange.
func OutOfRangef(format string, a ...any) error { return wrapf(ErrOutOfRange, format, a) }

// DataLossf returns an error of class ErrDataLoss.
func DataLossf(format string, a ...any) error { return wrapf(ErrDataLoss, format, a) }

// ToStatus maps an error to a gRPC status error whose message is
// err.Error() (nil stays nil; an error that already carries a status is
// returned as is). Context errors become DeadlineExceeded and Canceled;
// unclassified errors are Internal.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := codes.Internal
	for _, c := range classCodes {
		if errors.Is(err, c.class) {
			code = c.code
			break
		}
	}
	return status.Error(code, err.Error())
}
