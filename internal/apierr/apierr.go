// Package apierr holds the error classes Corral's services share and the
// one mapping from them to gRPC status codes. Domain packages re-export the
// sentinels they return (pool.ErrInvalid is apierr.ErrInvalid) and wrap
// them with %w; their gRPC edges call ToStatus. It imports only the store
// contract, the store codec and gRPC's status package.
package apierr

import (
	"context"
	"errors"
	"fmt"

	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Error classes.
var (
	ErrInvalid       = errors.New("invalid argument")
	ErrNotFound      = errors.New("not found")
	ErrAlreadyExists = errors.New("already exists")
	ErrExhausted     = errors.New("resource exhausted")
	ErrPrecondition  = errors.New("failed precondition")
	// ErrUnavailable: a dependency (a BMC, an agent, a node) could not be
	// reached.
	ErrUnavailable = errors.New("unavailable")
)

// classed is an error of a class whose text does not repeat the class
// (the gRPC code already says it): "node \"n1\": cpu request ..." rather
// than "resource exhausted: node \"n1\": ...".
type classed struct {
	class error
	msg   string
}

func (e *classed) Error() string { return e.msg }
func (e *classed) Unwrap() error { return e.class }

func wrapf(class error, format string, a []any) error {
	return &classed{class: class, msg: fmt.Sprintf(format, a...)}
}

// Invalidf returns an error of class ErrInvalid.
func Invalidf(format string, a ...any) error { return wrapf(ErrInvalid, format, a) }

// NotFoundf returns an error of class ErrNotFound.
func NotFoundf(format string, a ...any) error { return wrapf(ErrNotFound, format, a) }

// Existsf returns an error of class ErrAlreadyExists.
func Existsf(format string, a ...any) error { return wrapf(ErrAlreadyExists, format, a) }

// Exhaustedf returns an error of class ErrExhausted.
func Exhaustedf(format string, a ...any) error { return wrapf(ErrExhausted, format, a) }

// Preconditionf returns an error of class ErrPrecondition.
func Preconditionf(format string, a ...any) error { return wrapf(ErrPrecondition, format, a) }

// Unavailablef returns an error of class ErrUnavailable.
func Unavailablef(format string, a ...any) error { return wrapf(ErrUnavailable, format, a) }

// ToStatus maps an error to a gRPC status error (nil stays nil; an error
// that already carries a status is returned as is). Unclassified errors
// are Internal.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := codes.Internal
	switch {
	case errors.Is(err, ErrInvalid):
		code = codes.InvalidArgument
	case errors.Is(err, ErrNotFound), errors.Is(err, store.ErrNotFound):
		code = codes.NotFound
	case errors.Is(err, ErrAlreadyExists):
		code = codes.AlreadyExists
	case errors.Is(err, ErrExhausted):
		code = codes.ResourceExhausted
	case errors.Is(err, ErrPrecondition):
		code = codes.FailedPrecondition
	case errors.Is(err, ErrUnavailable), errors.Is(err, store.ErrClosed):
		code = codes.Unavailable
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, store.ErrCorrupt), errors.Is(err, record.ErrSchema):
		code = codes.DataLoss
	}
	return status.Error(code, err.Error())
}
