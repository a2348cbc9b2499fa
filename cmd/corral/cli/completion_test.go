package cli

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestCompletionScripts(t *testing.T) {
	for shell, marker := range map[string]string{
		"bash": "__start_corral",
		"zsh":  "#compdef corral",
		"fish": "complete -c corral",
	} {
		t.Run(shell, func(t *testing.T) {
			s := newTestServer(t)
			r := s.run(t, "", nil, "completion", shell)
			if r.code != ExitOK || !strings.Contains(r.stdout, marker) {
				t.Errorf("exit %d, stderr %q, script lacks %q", r.code, r.stderr, marker)
			}
			if len(s.received()) != 0 {
				t.Error("printing a script called the API")
			}
		})
	}
}

// complete runs cobra's hidden __complete and returns the candidates
// (without the trailing ":directive" line and flags).
func complete(t *testing.T, s *testServer, args ...string) []string {
	t.Helper()
	r := s.run(t, "", nil, append([]string{"__complete"}, args...)...)
	if r.code != ExitOK {
		t.Fatalf("__complete %v: exit %d, stderr %q", args, r.code, r.stderr)
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		// cobra also offers a verb's required flags.
		if !strings.HasPrefix(l, ":") && !strings.HasPrefix(l, "--") {
			out = append(out, strings.SplitN(l, "\t", 2)[0])
		}
	}
	return out
}

func TestCompletionNames(t *testing.T) {
	tests := map[string]struct {
		args []string
		fail string // a List method that fails
		want []string
	}{
		"get machine names":        {args: []string{"get", "machines", ""}, want: []string{"m1", "m2"}},
		"describe node names":      {args: []string{"describe", "node", "n"}, want: []string{"n1", "n2"}},
		"delete vm names":          {args: []string{"delete", "vm", ""}, want: []string{"vm1"}},
		"machine accept":           {args: []string{"machine", "accept", ""}, want: []string{"m1", "m2"}},
		"machine timeline":         {args: []string{"machine", "timeline", ""}, want: []string{"m1", "m2"}},
		"machine power choice":     {args: []string{"machine", "power", ""}, want: []string{"on", "off", "soft", "cycle", "reset", "status"}},
		"machine power name":       {args: []string{"machine", "power", "on", ""}, want: []string{"m1", "m2"}},
		"bs delete":                {args: []string{"bs", "delete", ""}, want: []string{"disk1"}},
		"node reserve-compute":     {args: []string{"node", "reserve-compute", ""}, want: []string{"n1", "n2"}},
		"a second name is not one": {args: []string{"machine", "accept", "m1", ""}, want: nil},
		"api failure is quiet":     {args: []string{"get", "machines", ""}, fail: "ListMachines", want: nil},
		"kinds":                    {args: []string{"get", "mach"}, want: nil}, // checked below
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			s := newTestServer(t)
			seed(s)
			if tt.fail != "" {
				s.fail[tt.fail] = status.Error(codes.PermissionDenied, "no")
			}
			got := complete(t, s, tt.args...)
			if name == "kinds" {
				for _, k := range []string{"machine", "machines", "node", "vm", "bs", "events", "appliances"} {
					if !strings.Contains(strings.Join(got, " ")+" ", k+" ") {
						t.Errorf("kind %q not offered: %v", k, got)
					}
				}
				return
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("candidates (-want +got):\n%s", diff)
			}
		})
	}
}
