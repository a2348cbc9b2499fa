package cli

import (
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
)

// exitError is an error already phrased for the user, with its exit code.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// usageErrorf reports bad input on the command line (exit 2).
func usageErrorf(format string, args ...any) error {
	return &exitError{code: ExitUsage, msg: fmt.Sprintf(format, args...)}
}

// failf reports a failure that is not the command line's fault (exit 1).
func failf(format string, args ...any) error {
	return &exitError{code: ExitError, msg: fmt.Sprintf(format, args...)}
}

// callError phrases the error of an RPC about subject (for example
// `node "n1"`) as "subject: message (Code)". When the call failed because
// corrald could not be reached, it names the endpoint instead, since the
// subject is then irrelevant.
func (inv *invocation) callError(subject string, err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return failf("%s: %v", subject, err)
	}
	if inv.unreachable(st.Code()) {
		return failf("cannot reach corrald at %s: %s (%s)", inv.connTarget, st.Message(), st.Code())
	}
	return failf("%s: %s (%s)", subject, st.Message(), st.Code())
}

// unreachable reports whether an RPC that ended with code failed because
// no connection to corrald was ever established (refused, TLS failure,
// unresolvable name, or a deadline hit while still connecting).
func (inv *invocation) unreachable(code codes.Code) bool {
	if inv.conn == nil {
		return false
	}
	switch code {
	case codes.Unavailable, codes.DeadlineExceeded:
		return inv.conn.GetState() != connectivity.Ready
	}
	return false
}

// oneLine folds a possibly multi-line message onto one line.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	return strings.Join(strings.Fields(s), " ")
}
