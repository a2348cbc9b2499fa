package cli

import (
	"strings"
	"testing"
)

// A machine whose facts carry terminal control sequences prints them
// escaped in every format: no ESC, C1 or bidi byte reaches stdout.
func TestPrintersEscapeControlCharacters(t *testing.T) {
	const evil = "\x1b]0;owned\x07\x1b[2J\x1b]52;c;ZXZpbA==\x07\x1b]8;;http://x/\x1b\\l\u009b31m\u202eexe.txt"
	for _, args := range [][]string{
		{"get", "machines"},
		{"get", "machines", "-o", "wide"},
		{"get", "machines", "-o", "json"},
		{"get", "machines", "-o", "yaml"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			s := newTestServer(t)
			seed(s)
			s.mu.Lock()
			m1 := s.machines["m1"]
			m1.StateReason = evil
			m1.Serial = "SN" + evil
			m1.Facts.System.Vendor = evil
			m1.Facts.System.Product = evil
			s.mu.Unlock()
			r := s.run(t, "", nil, args...)
			if r.code != ExitOK {
				t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
			}
			for _, bad := range []string{"\x1b", "\x07", "\x9b", "\u009b", "\u202e"} {
				if strings.Contains(r.stdout, bad) {
					t.Errorf("stdout holds %q:\n%q", bad, r.stdout)
				}
			}
			if !strings.Contains(r.stdout, `\x1b]0;owned`) && !strings.Contains(r.stdout, `\u001b]0;owned`) && !strings.Contains(r.stdout, `\e]0;owned`) {
				t.Errorf("the escaped sequence is not shown:\n%s", r.stdout)
			}
		})
	}
}
