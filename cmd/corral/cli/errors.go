package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
)

// Exit codes returned by Run: the one table of them, which
// docs/cli-exit-codes.md documents (TestExitCodesDocumented compares).
const (
	// ExitOK: the command did what it was asked.
	ExitOK = 0
	// ExitError: the attempt failed: corrald refused or failed the call,
	// corrald could not be reached, the client configuration could not
	// be used, or reading or writing failed part way.
	ExitError = 1
	// ExitUsage: nothing was attempted because of what was typed: an
	// unknown verb, kind or flag, a bad argument or setting (flag or
	// CORRAL_* variable), or a file named on the command line that is
	// missing or whose content is invalid (YAML, an unknown field, a
	// wrong type).
	ExitUsage = 2
)

// exitError is an error already phrased for the user, with its exit code.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// usageErrorf reports bad input on the command line or in a file it
// names (exit 2).
func usageErrorf(format string, args ...any) error {
	return &exitError{code: ExitUsage, msg: fmt.Sprintf(format, args...)}
}

// failf reports a failure that is not the command line's fault (exit 1).

// fileErrorf reports a file named by the command line (flag, e.g.
// "--bmc-password-file") that cannot be read: missing or unreadable is the
// command line's fault (exit 2), any other error exit 1.
func fileErrorf(flag string, err error) error {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
		return usageErrorf("%s: %v", flag, err)
	}
	return failf("%s: %v", flag, err)
}
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
	return failf("%s: %s (%s)", subject, withoutSubject(subject, st.Message(), st.Code()), st.Code())
}

// withoutSubject drops from msg what the subject already says: corrald's
// messages often start with the object they are about (`machine "nope"`),
// which the subject (`machine "nope"` or `enroll machine "nope"`) names
// too. A message that was nothing else becomes the code in words.
func withoutSubject(subject, msg string, code codes.Code) string {
	for i := 0; i < len(subject); i++ {
		if i > 0 && subject[i-1] != ' ' {
			continue
		}
		tail := subject[i:]
		if msg == tail {
			msg = ""
			break
		}
		if rest, ok := strings.CutPrefix(msg, tail+": "); ok {
			msg = rest
			break
		}
	}
	if msg != "" {
		return msg
	}
	switch code {
	case codes.NotFound:
		return "not found"
	case codes.AlreadyExists:
		return "already exists"
	default: // every other code by its own name
		return strings.ToLower(code.String())
	}
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
	default: // any other code came from a server that answered
		return false
	}
}

// oneLine folds a possibly multi-line message onto one line.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	return strings.Join(strings.Fields(s), " ")
}
