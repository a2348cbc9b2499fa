package cli

import (
	"errors"
	"strings"
	"testing"
)

// TestConsoleInputEscape: ~. at the start of a line detaches, ~~ sends one
// ~, a ~ elsewhere is sent as it is.
func TestConsoleInputEscape(t *testing.T) {
	for name, tc := range map[string]struct {
		in       string
		sent     string
		detached bool
	}{
		"plain":                  {"ls -l\r", "ls -l\r", false},
		"detach at start":        {"~.", "", true},
		"detach after newline":   {"echo hi\r~.rm", "echo hi\r", true},
		"detach after lf":        {"a\n~.", "a\n", true},
		"tilde mid-line":         {"cd ~/x~.\r", "cd ~/x~.\r", false},
		"double tilde":           {"~~.\r", "~.\r", false},
		"tilde then other":       {"~a", "~a", false},
		"tilde at start, no dot": {"\r~/bin\r", "\r~/bin\r", false},
	} {
		t.Run(name, func(t *testing.T) {
			var sent strings.Builder
			err := consoleInput(strings.NewReader(tc.in), func(p []byte) error { sent.Write(p); return nil })
			if errors.Is(err, errDetached) != tc.detached || (err != nil && !errors.Is(err, errDetached)) {
				t.Fatalf("err %v, detached want %v", err, tc.detached)
			}
			if sent.String() != tc.sent {
				t.Fatalf("sent %q, want %q", sent.String(), tc.sent)
			}
		})
	}
}
