package pool

import "github.com/corralhq/corral/internal/apierr"

// Sentinel errors; every error the pool returns wraps one of them (or a
// store error). toStatus maps them to gRPC codes at the API edge.
var (
	ErrInvalid       = apierr.ErrInvalid
	ErrNotFound      = apierr.ErrNotFound
	ErrAlreadyExists = apierr.ErrAlreadyExists
	ErrExhausted     = apierr.ErrExhausted
	ErrPrecondition  = apierr.ErrPrecondition
)

var (
	invalidf      = apierr.Invalidf
	notFoundf     = apierr.NotFoundf
	existsf       = apierr.Existsf
	exhaustedf    = apierr.Exhaustedf
	preconditionf = apierr.Preconditionf
	toStatus      = apierr.ToStatus
)
