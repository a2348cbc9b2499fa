package pool

import (
	"errors"
	"fmt"
)

// Sentinel errors; every error the pool returns wraps one of them (or a
// store error). toStatus maps them to gRPC codes at the API edge.
var (
	ErrInvalid       = errors.New("invalid argument")
	ErrNotFound      = errors.New("not found")
	ErrAlreadyExists = errors.New("already exists")
	ErrExhausted     = errors.New("resource exhausted")
	ErrPrecondition  = errors.New("failed precondition")
)

func invalidf(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
}

func notFoundf(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrNotFound, fmt.Sprintf(format, a...))
}

func existsf(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrAlreadyExists, fmt.Sprintf(format, a...))
}

func exhaustedf(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrExhausted, fmt.Sprintf(format, a...))
}

func preconditionf(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrPrecondition, fmt.Sprintf(format, a...))
}
