package cli

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/corralhq/corral/api/clientconfig"
)

// computeArgs are valid reserve-compute arguments; tests replace one.
var computeArgs = []string{"node", "reserve-compute", "n1", "c1",
	"--request-cpu-milli-core", "1000", "--limit-cpu-milli-core", "1000",
	"--request-memory-bytes", "1GiB", "--limit-memory-bytes", "1GiB"}

func replaceArg(args []string, old, repl string) []string {
	out := append([]string(nil), args...)
	for i, a := range out {
		if a == old {
			out[i] = repl
		}
	}
	return out
}

// TestUsageErrors checks that bad command lines exit 2 with one line on
// stderr and send nothing.
func TestUsageErrors(t *testing.T) {
	tests := map[string]struct {
		args []string
		want string // substring of the error line
	}{
		"no verb":            {args: nil, want: "missing verb"},
		"unknown verb":       {args: []string{"frobnicate"}, want: `unknown verb "frobnicate"`},
		"unknown node verb":  {args: []string{"node", "reserve-cpu"}, want: `unknown node verb "reserve-cpu"`},
		"missing node verb":  {args: []string{"net"}, want: "missing network verb"},
		"unknown kind":       {args: []string{"get", "pods"}, want: `unknown kind "pods" (valid: node|nodes, network|networks|net, virtual_machine|vm|vms`},
		"unknown kind del":   {args: []string{"delete", "pod", "p"}, want: `unknown kind "pod"`},
		"describe no name":   {args: []string{"describe", "node"}, want: "usage: corral describe KIND NAME"},
		"get too many":       {args: []string{"get", "node", "a", "b"}, want: "wrong number of arguments"},
		"bad output":         {args: []string{"get", "node", "-o", "xml"}, want: `unknown output format "xml"`},
		"unknown flag":       {args: []string{"get", "node", "--colour"}, want: "unknown flag: --colour"},
		"bad timeout":        {args: []string{"--timeout", "soon", "get", "node"}, want: `invalid argument "soon"`},
		"zero timeout":       {args: []string{"--timeout", "0s", "get", "node"}, want: "--timeout must be positive"},
		"bad size unit":      {args: replaceArg(computeArgs, "1GiB", "1GiBs"), want: `unknown unit "GiBs"`},
		"negative size":      {args: replaceArg(computeArgs, "1GiB", "-1"), want: `size "-1"`},
		"fractional bytes":   {args: replaceArg(computeArgs, "1GiB", "1.5"), want: "not a whole number of bytes"},
		"size overflow":      {args: replaceArg(computeArgs, "1GiB", "16EiB"), want: "too large"},
		"bad cpu":            {args: replaceArg(computeArgs, "1000", "1core"), want: `invalid argument "1core" for "--request-cpu-milli-core"`},
		"missing flag":       {args: computeArgs[:len(computeArgs)-2], want: `required flag(s) "limit-memory-bytes" not set`},
		"bad annotation":     {args: append(append([]string(nil), computeArgs...), "--annotation", "novalue"), want: "want KEY=VALUE"},
		"bad storage size":   {args: []string{"node", "reserve-storage", "n1", "s", "--request-bytes", "lots", "--limit-bytes", "1"}, want: `size "lots"`},
		"bad mac":            {args: []string{"net", "reserve-interface", "lan", "i", "--hardware-address", "zz"}, want: "not a MAC address"},
		"ipv6 as ipv4":       {args: []string{"net", "reserve-interface", "lan", "i", "--ipv4-address", "fd00::1"}, want: "not an IPv4 address"},
		"release extra args": {args: []string{"node", "release-compute", "n1", "c1", "c2"}, want: "wrong number of arguments"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			s := newTestServer(t)
			seed(s)
			r := s.run(t, "", nil, tt.args...)
			if r.code != ExitUsage {
				t.Errorf("exit %d, want %d", r.code, ExitUsage)
			}
			if !strings.HasPrefix(r.stderr, "corral: ") || strings.Count(r.stderr, "\n") != 1 {
				t.Errorf("stderr %q is not one corral: line", r.stderr)
			}
			if !strings.Contains(r.stderr, tt.want) {
				t.Errorf("stderr %q lacks %q", r.stderr, tt.want)
			}
			if r.stdout != "" {
				t.Errorf("stdout %q, want nothing", r.stdout)
			}
			if got := s.received(); len(got) != 0 {
				t.Errorf("sent %v, want nothing", got)
			}
		})
	}
}

// TestServerErrors checks that API errors print "corral: <subject>:
// <message> (<Code>)" and exit 1.
func TestServerErrors(t *testing.T) {
	tests := map[string]struct {
		fail   map[string]error
		args   []string
		stderr string
	}{
		"get missing node": {
			args:   []string{"get", "node", "n9"},
			stderr: `corral: node "n9": not found (NotFound)` + "\n",
		},
		"describe missing network": {
			args:   []string{"describe", "net", "dmz"},
			stderr: `corral: network "dmz": not found (NotFound)` + "\n",
		},
		"delete missing node": {
			args:   []string{"delete", "nodes", "n9"},
			stderr: `corral: node "n9": not found (NotFound)` + "\n",
		},
		"reserve on missing node": {
			args:   replaceArg(computeArgs, "n1", "n9"),
			stderr: `corral: node "n9": reserve compute "c1": not found (NotFound)` + "\n",
		},
		"budget exhausted": {
			fail:   map[string]error{"ScheduleCompute": status.Error(codes.ResourceExhausted, "no READY node has 64000m CPU free\n(largest: 8000m)")},
			args:   []string{"node", "schedule-compute", "c1", "--request-cpu-milli-core", "64000", "--limit-cpu-milli-core", "64000", "--request-memory-bytes", "1G", "--limit-memory-bytes", "1G"},
			stderr: `corral: schedule compute "c1": no READY node has 64000m CPU free (largest: 8000m) (ResourceExhausted)` + "\n",
		},
		"permission": {
			fail:   map[string]error{"ListMachines": status.Error(codes.PermissionDenied, "role viewer may not call ListMachines")},
			args:   []string{"get", "machines"},
			stderr: `corral: list machines: role viewer may not call ListMachines (PermissionDenied)` + "\n",
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			s := newTestServer(t)
			seed(s)
			for k, v := range tt.fail {
				s.fail[k] = v
			}
			r := s.run(t, "", nil, tt.args...)
			if r.code != ExitError {
				t.Errorf("exit %d, want %d", r.code, ExitError)
			}
			if diff := cmp.Diff(tt.stderr, r.stderr); diff != "" {
				t.Errorf("stderr (-want +got):\n%s", diff)
			}
			if r.stdout != "" {
				t.Errorf("stdout %q, want nothing", r.stdout)
			}
		})
	}
}

// TestConnectionFailure dials, with the real TLS dialer, a port where
// nothing listens: the error names the endpoint and the reason.
func TestConnectionFailure(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := lis.Addr().String()
	lis.Close()

	var stdout, stderr strings.Builder
	app := &App{
		Stdout: &stdout,
		Stderr: &stderr,
		Getenv: func(k string) string { return map[string]string{"HOME": t.TempDir()}[k] },
	}
	code := app.Run(context.Background(), []string{"--endpoint", endpoint, "--timeout", "10s", "get", "nodes"})
	if code != ExitError {
		t.Errorf("exit %d, want %d", code, ExitError)
	}
	got := stderr.String()
	want := "corral: cannot reach corrald at " + endpoint + ": "
	if !strings.HasPrefix(got, want) || !strings.Contains(got, "refused") || strings.Count(got, "\n") != 1 {
		t.Errorf("stderr %q, want one line starting %q and saying refused", got, want)
	}
}

func TestClientConfig(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "corral.yaml")
	if err := os.WriteFile(file, []byte("endpoint: file.example:20180\ntoken: file-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(dir, "home")
	if err := os.MkdirAll(filepath.Join(home, ".config", "corral"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, ".config", "corral", "config.yaml"), []byte("endpoint: home.example:20180\ntoken: home-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	emptyHome := filepath.Join(dir, "empty")

	tests := map[string]struct {
		env      map[string]string
		flags    []string
		want     clientconfig.Config
		wantCode int
		wantErr  string
	}{
		"home default": {
			env:  map[string]string{"HOME": home},
			want: clientconfig.Config{Endpoint: "home.example:20180", Token: "home-token"},
		},
		"env config": {
			env:  map[string]string{"HOME": home, envConfig: file},
			want: clientconfig.Config{Endpoint: "file.example:20180", Token: "file-token"},
		},
		"flag config beats env": {
			env:   map[string]string{"HOME": emptyHome, envConfig: "/nonexistent"},
			flags: []string{"--config", file},
			want:  clientconfig.Config{Endpoint: "file.example:20180", Token: "file-token"},
		},
		"env overrides file": {
			env:  map[string]string{"HOME": home, envEndpoint: "env.example:1", envToken: "env-token"},
			want: clientconfig.Config{Endpoint: "env.example:1", Token: "env-token"},
		},
		"flags override env": {
			env:   map[string]string{"HOME": home, envEndpoint: "env.example:1", envToken: "env-token"},
			flags: []string{"--endpoint", "flag.example:2", "--token", "flag-token"},
			want:  clientconfig.Config{Endpoint: "flag.example:2", Token: "flag-token"},
		},
		"no file, flags only, default port": {
			env:   map[string]string{"HOME": emptyHome},
			flags: []string{"--endpoint", "corral.lab", "--token", "t"},
			want:  clientconfig.Config{Endpoint: "corral.lab:20180", Token: "t"},
		},
		"nothing configured": {
			env:      map[string]string{"HOME": emptyHome},
			wantCode: ExitUsage,
			wantErr:  "no endpoint",
		},
		"explicit config missing": {
			env:      map[string]string{"HOME": home},
			flags:    []string{"--config", filepath.Join(dir, "nope.yaml")},
			wantCode: ExitError,
			wantErr:  "nope.yaml",
		},
		"bad env timeout": {
			env:      map[string]string{"HOME": home, "CORRAL_TIMEOUT": "soon"},
			wantCode: ExitUsage,
			wantErr:  `CORRAL_TIMEOUT="soon" (--timeout)`,
		},
		"token with space": {
			env:      map[string]string{"HOME": home},
			flags:    []string{"--token", "a b"},
			wantCode: ExitUsage,
			wantErr:  "token contains whitespace",
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			s := newTestServer(t)
			env := tt.env
			if _, ok := env[envEndpoint]; !ok {
				env[envEndpoint] = "" // do not let run() supply one
			}
			r := s.run(t, "", env, append(tt.flags, "get", "nodes")...)
			if r.code != tt.wantCode {
				t.Fatalf("exit %d, want %d (stderr %q)", r.code, tt.wantCode, r.stderr)
			}
			if tt.wantCode != ExitOK {
				if !strings.Contains(r.stderr, tt.wantErr) {
					t.Errorf("stderr %q lacks %q", r.stderr, tt.wantErr)
				}
				return
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			if diff := cmp.Diff([]clientconfig.Config{tt.want}, s.dialed); diff != "" {
				t.Errorf("dialled config (-want +got):\n%s", diff)
			}
		})
	}
}

func TestVersion(t *testing.T) {
	s := newTestServer(t)
	r := s.run(t, "", map[string]string{envEndpoint: ""}, "version")
	if r.code != ExitOK || !strings.HasPrefix(r.stdout, "corral ") {
		t.Errorf("exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
}
