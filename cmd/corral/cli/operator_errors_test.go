package cli

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestErrorSaidOnce: corrald's message repeats the object the subject
// names; the line says it once.
func TestErrorSaidOnce(t *testing.T) {
	for name, tc := range map[string]struct {
		fail   map[string]error
		args   []string
		stderr string
	}{
		"not found": {
			fail:   map[string]error{"GetNode": status.Error(codes.NotFound, `node "nope"`)},
			args:   []string{"get", "node", "nope"},
			stderr: `corral: node "nope": not found (NotFound)` + "\n",
		},
		"prefix": {
			fail:   map[string]error{"DeleteNode": status.Error(codes.FailedPrecondition, `node "n1": has reservations`)},
			args:   []string{"delete", "node", "n1"},
			stderr: `corral: node "n1": has reservations (FailedPrecondition)` + "\n",
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := newTestServer(t)
			seed(s)
			for k, v := range tc.fail {
				s.fail[k] = v
			}
			r := s.run(t, "", nil, tc.args...)
			if r.code != ExitError || r.stderr != tc.stderr {
				t.Errorf("exit %d stderr %q, want %d %q", r.code, r.stderr, ExitError, tc.stderr)
			}
		})
	}
}

// TestUnknownVerbSuggests: a mistyped verb is answered with cobra's
// suggestion, at the top and in a verb group.
func TestUnknownVerbSuggests(t *testing.T) {
	for args, want := range map[string]string{
		"gte machines":    `unknown verb "gte"; did you mean "get"?`,
		"machine acept":   `unknown machine verb "acept"; did you mean "accept" or "adopt"?`,
		"frobnicate":      `unknown verb "frobnicate" (valid: `,
		"descirbe node n": `did you mean "describe"?`, //nolint:misspell // the misspelt verb is the input under test
	} {
		s := newTestServer(t)
		r := s.run(t, "", nil, strings.Fields(args)...)
		if r.code != ExitUsage || !strings.Contains(r.stderr, want) {
			t.Errorf("corral %s: exit %d stderr %q, want %d and %q", args, r.code, r.stderr, ExitUsage, want)
		}
	}
}

// TestEmptyListSays: an empty list says so in words instead of printing a
// header alone; json stays an empty array.
func TestEmptyListSays(t *testing.T) {
	s := newTestServer(t)
	for args, want := range map[string]string{
		"get machines":         "No machines.\n",
		"get networks":         "No networks.\n",
		"get machines -o wide": "No machines.\n",
		"get machines -o json": "[]\n",
	} {
		r := s.run(t, "", nil, strings.Fields(args)...)
		if r.code != ExitOK || r.stdout != want {
			t.Errorf("corral %s: exit %d stdout %q, want %q", args, r.code, r.stdout, want)
		}
	}
}

// TestApplyWrongType: a value of the wrong type names the file, the
// document, the object, the field and the type the field takes.
func TestApplyWrongType(t *testing.T) {
	s := newTestServer(t)
	path := writeFile(t, "kind: network\nname: lan\nipv4_cidr: [10.0.0.0/24]\n")
	r := s.run(t, "", nil, "apply", "-f", path)
	want := path + `: document 1 (line 1): network "lan" (ApplyNetworkRequest): field "ipv4_cidr": want a string, got a list`
	if r.code != ExitUsage || !strings.Contains(r.stderr, want) {
		t.Errorf("exit %d stderr %q, want %d and %q", r.code, r.stderr, ExitUsage, want)
	}
}

// TestExitCodesDocumented: docs/cli-exit-codes.md lists the exit codes
// errors.go defines, with the same numbers.
func TestExitCodesDocumented(t *testing.T) {
	b, err := os.ReadFile("../../../docs/cli-exit-codes.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := regexp.MustCompile(`(?m)^\| (\d+) \| (\w+) \|`).FindAllStringSubmatch(string(b), -1)
	got := map[string]int{}
	for _, r := range rows {
		n, _ := strconv.Atoi(r[1])
		got[r[2]] = n
	}
	want := map[string]int{"ExitOK": ExitOK, "ExitError": ExitError, "ExitUsage": ExitUsage}
	if len(got) != len(want) {
		t.Errorf("documented %v, want %v", got, want)
	}
	for name, n := range want {
		if got[name] != n {
			t.Errorf("%s: documented %d, defined %d", name, got[name], n)
		}
	}
}
