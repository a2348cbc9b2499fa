package inventory

import (
	"errors"
	"fmt"
)

// Sentinel errors; toStatus maps them to gRPC codes.
var (
	ErrInvalid       = errors.New("invalid argument")
	ErrNotFound      = errors.New("not found")
	ErrAlreadyExists = errors.New("already exists")
	ErrPrecondition  = errors.New("failed precondition")
	// ErrUnavailable: a dependency (a BMC, an agent) could not be reached.
	ErrUnavailable = errors.New("unavailable")
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

func preconditionf(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrPrecondition, fmt.Sprintf(format, a...))
}
