package inventory

import "github.com/corralhq/corral/internal/apierr"

// Sentinel errors (the shared classes of internal/apierr); toStatus maps
// them to gRPC codes.
var (
	ErrInvalid       = apierr.ErrInvalid
	ErrNotFound      = apierr.ErrNotFound
	ErrAlreadyExists = apierr.ErrAlreadyExists
	ErrPrecondition  = apierr.ErrPrecondition
	// ErrUnavailable: a dependency (a BMC, an agent) could not be reached.
	ErrUnavailable = apierr.ErrUnavailable
)

var (
	invalidf      = apierr.Invalidf
	notFoundf     = apierr.NotFoundf
	existsf       = apierr.Existsf
	preconditionf = apierr.Preconditionf
	toStatus      = apierr.ToStatus
)
