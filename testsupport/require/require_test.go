package require

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// childEnv selects what TestChild does when this test binary runs itself.
const childEnv = "CORRAL_REQUIRE_CHILD"

// TestChild is the body TestSkipOrFail runs in a child process, one helper
// with a precondition that cannot hold. Run directly, it does nothing.
func TestChild(t *testing.T) {
	switch os.Getenv(childEnv) {
	case "tool":
		Tool(t, "corral-no-such-tool")
	case "file":
		File(t, "/nonexistent/corral-require", "the corral test file")
	case "missing":
		Missing(t, "no frobnicator in this kernel")
	case "kernel":
		KernelLacks(t, "802.1Q VLANs")
	case "root":
		Root(t, "network namespaces")
	case "degraded":
		Degraded(t, "no test kernel: asserting less")
		t.Log("went on")
		return
	case "present":
		Tool(t, "sh")
		File(t, "/", "the root directory")
		t.Log("went on")
		return
	default:
		return
	}
	t.Error("the helper returned")
}

type childCase struct {
	child    string
	ci       bool
	wantFail bool
	want     []string // in the child's output
}

func TestSkipOrFail(t *testing.T) {
	tests := map[string]childCase{
		"tool skips":           {child: "tool", want: []string{"--- SKIP: TestChild", "corral-no-such-tool not installed (apt-get install corral-no-such-tool)"}},
		"tool fails in CI":     {child: "tool", ci: true, wantFail: true, want: []string{"--- FAIL: TestChild", "corral-no-such-tool not installed", "CI=true"}},
		"file skips":           {child: "file", want: []string{"--- SKIP: TestChild", "the corral test file not found at /nonexistent/corral-require"}},
		"file fails in CI":     {child: "file", ci: true, wantFail: true, want: []string{"--- FAIL: TestChild", "the corral test file not found"}},
		"missing skips":        {child: "missing", want: []string{"--- SKIP: TestChild", "no frobnicator in this kernel"}},
		"missing fails in CI":  {child: "missing", ci: true, wantFail: true, want: []string{"--- FAIL: TestChild", "no frobnicator in this kernel"}},
		"kernel skips":         {child: "kernel", want: []string{"--- SKIP: TestChild", "kernel lacks: 802.1Q VLANs"}},
		"kernel skips in CI":   {child: "kernel", ci: true, want: []string{"--- SKIP: TestChild", "kernel lacks: 802.1Q VLANs", "listed in the run's summary"}},
		"degraded goes on":     {child: "degraded", want: []string{"--- PASS: TestChild", "no test kernel: asserting less", "went on"}},
		"degraded fails in CI": {child: "degraded", ci: true, wantFail: true, want: []string{"--- FAIL: TestChild", "no test kernel: asserting less"}},
		"present passes in CI": {child: "present", ci: true, want: []string{"--- PASS: TestChild", "went on"}},
	}
	if os.Geteuid() != 0 {
		tests["root skips"] = childCase{child: "root", want: []string{"--- SKIP: TestChild", "needs root (network namespaces)"}}
		tests["root fails in CI"] = childCase{child: "root", ci: true, wantFail: true, want: []string{"--- FAIL: TestChild", "needs root (network namespaces)"}}
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestChild$", "-test.v", "-test.count=1")
			ci := "false"
			if tc.ci {
				ci = "true"
			}
			cmd.Env = append(os.Environ(), childEnv+"="+tc.child, "CI="+ci)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			switch {
			case tc.wantFail && !errors.As(err, &exit):
				t.Errorf("child passed, want it to fail (err %v):\n%s", err, out)
			case !tc.wantFail && err != nil:
				t.Errorf("child failed: %v\n%s", err, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("child output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}

func TestCI(t *testing.T) {
	tests := map[string]struct {
		env  string
		want bool
	}{
		"unset": {"", false},
		"true":  {"true", true},
		"1":     {"1", true},
		"false": {"false", false},
		"other": {"yes please", false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Setenv("CI", tc.env)
			if got := CI(); got != tc.want {
				t.Errorf("CI=%q: CI() = %v, want %v", tc.env, got, tc.want)
			}
		})
	}
}
