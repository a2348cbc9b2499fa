package pool

import "github.com/corralhq/corral/internal/apierr"

// Every error the pool returns wraps one of internal/apierr's classes (or a
// store error); toStatus maps them to gRPC codes at the API edge. These
// short names are the pool's constructors for those classes.
var (
	invalidf      = apierr.Invalidf
	notFoundf     = apierr.NotFoundf
	existsf       = apierr.Existsf
	exhaustedf    = apierr.Exhaustedf
	preconditionf = apierr.Preconditionf
	toStatus      = apierr.ToStatus
)
