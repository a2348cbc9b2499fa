// Package hverr holds the error classes the node-side hypervisor packages
// share (invalid argument, not found, already exists, in use, unavailable)
// so that the HypervisorService edge can map them to gRPC codes in one
// place. It imports only the standard library: internal/apierr is not
// usable here because it reaches the store contract, which the node agent
// must not import.
package hverr

import (
	"errors"
	"fmt"
	"regexp"
)

// Error classes. Sub-packages re-export them (volume.ErrNotFound is
// hverr.ErrNotFound) and wrap them with %w.
var (
	ErrInvalid     = errors.New("invalid argument")
	ErrNotFound    = errors.New("not found")
	ErrExists      = errors.New("already exists")
	ErrInUse       = errors.New("in use")
	ErrUnavailable = errors.New("unavailable")
)

// Wrap returns an error of class class with a formatted message.
func Wrap(class error, format string, a ...any) error {
	return fmt.Errorf("%w: %s", class, fmt.Sprintf(format, a...))
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// CheckName refuses names that could escape a directory or hide a file:
// a name is 1-128 characters of letters, digits, '_', '.', '-', starting
// with a letter or digit and never containing "..".
func CheckName(kind, name string) error {
	if !nameRE.MatchString(name) || containsDotDot(name) {
		return Wrap(ErrInvalid, "%s name %q: want 1-128 of [A-Za-z0-9_.-] starting with a letter or digit", kind, name)
	}
	return nil
}

func containsDotDot(s string) bool {
	for i := 0; i+1 < len(s); i++ {
		if s[i] == '.' && s[i+1] == '.' {
			return true
		}
	}
	return false
}

// IsNotFound reports whether err is of class ErrNotFound.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }
