package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/corralhq/corral/api/clientconfig"
)

func TestConfigContexts(t *testing.T) {
	s := newTestServer(t)
	home := t.TempDir()
	dir := t.TempDir()
	tokB := filepath.Join(dir, "tok-b")
	if err := os.WriteFile(tokB, []byte("secret-b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// An old single-context file, as corrald writes admin.conf.
	path := filepath.Join(home, ".config", "corral", "config.yaml")
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := (&clientconfig.Config{Endpoint: "site-a:20180", Token: "secret-a"}).Write(path); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"HOME": home, envEndpoint: ""}
	steps := []struct {
		args       []string
		code       int
		stdout     string
		stderrHas  string
		dialed     string // endpoint of the last dial after the step, when set
		dialedTok  string
		noStdoutOf string // a string stdout must not contain
	}{
		{args: []string{"config", "current-context"}, stdout: "default\n"},
		{args: []string{"get", "nodes"}, dialed: "site-a:20180", dialedTok: "secret-a"},
		{args: []string{"config", "set-context", "site-b", "--token-file", tokB}, code: ExitUsage, stderrHas: "--endpoint is required"},
		{args: []string{"config", "set-context", "site-b", "--endpoint", "site-b", "--token-file", tokB}, stdout: `context "site-b" set in ` + path + "\n"},
		{args: []string{"config", "get-contexts"}, stdout: "CURRENT   NAME     ENDPOINT       CA       TOKEN\n*         default  site-a:20180   system   set\n          site-b   site-b:20180   system   set\n", noStdoutOf: "secret"},
		{args: []string{"--context", "site-b", "get", "nodes"}, dialed: "site-b:20180", dialedTok: "secret-b"},
		{args: []string{"config", "use-context", "site-b"}, stdout: "switched to context \"site-b\"\n"},
		{args: []string{"config", "current-context"}, stdout: "site-b\n"},
		{args: []string{"get", "nodes"}, dialed: "site-b:20180", dialedTok: "secret-b"},
		{args: []string{"--context", "default", "get", "nodes"}, dialed: "site-a:20180", dialedTok: "secret-a"},
		{args: []string{"config", "use-context", "site-x"}, code: ExitUsage, stderrHas: `unknown context "site-x" (known: "default", "site-b")`},
		{args: []string{"--context", "site-x", "get", "nodes"}, code: ExitUsage, stderrHas: `unknown context "site-x" (known: "default", "site-b")`},
		{args: []string{"config", "current-context"}, stdout: "site-b\n"},
	}
	for i, st := range steps {
		r := s.run(t, "", env, st.args...)
		if r.code != st.code {
			t.Fatalf("step %d %v: exit %d, want %d (stderr %q)", i, st.args, r.code, st.code, r.stderr)
		}
		if st.stdout != "" {
			// get-contexts aligns with three spaces: compare fields.
			if diff := cmp.Diff(strings.Fields(st.stdout), strings.Fields(r.stdout)); diff != "" {
				t.Errorf("step %d %v stdout (-want +got):\n%s", i, st.args, diff)
			}
		}
		if st.stderrHas != "" && !strings.Contains(r.stderr, st.stderrHas) {
			t.Errorf("step %d %v: stderr %q lacks %q", i, st.args, r.stderr, st.stderrHas)
		}
		if st.noStdoutOf != "" && strings.Contains(r.stdout, st.noStdoutOf) {
			t.Errorf("step %d %v: stdout shows %q:\n%s", i, st.args, st.noStdoutOf, r.stdout)
		}
		if st.dialed != "" {
			s.mu.Lock()
			last := s.dialed[len(s.dialed)-1]
			s.mu.Unlock()
			if last.Endpoint != st.dialed || last.Token != st.dialedTok {
				t.Errorf("step %d %v dialled %s with token %q, want %s %q", i, st.args, last.Endpoint, last.Token, st.dialed, st.dialedTok)
			}
		}
	}
	// corrald's reader still loads the file, following its current context.
	cc, err := clientconfig.Load(path)
	if err != nil || cc.Endpoint != "site-b:20180" {
		t.Fatalf("Load = %+v, %v", cc, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("config mode: %v %v", fi, err)
	}
}

func TestConfigContextsNoFile(t *testing.T) {
	s := newTestServer(t)
	home := t.TempDir()
	env := map[string]string{"HOME": home}
	if r := s.run(t, "", env, "config", "get-contexts"); r.code != ExitError || !strings.Contains(r.stderr, "no configuration file") {
		t.Errorf("get-contexts without a file: exit %d %q", r.code, r.stderr)
	}
	if r := s.run(t, "", env, "--context", "x", "get", "nodes"); r.code != ExitUsage || !strings.Contains(r.stderr, "no configuration file") {
		t.Errorf("--context without a file: exit %d %q", r.code, r.stderr)
	}
	// set-context creates the file and its directory.
	if r := s.run(t, "", env, "config", "set-context", "lab", "--endpoint", "10.0.0.1:20180", "--use"); r.code != ExitOK {
		t.Fatalf("set-context: exit %d %q", r.code, r.stderr)
	}
	r := s.run(t, "", env, "config", "current-context")
	if r.code != ExitOK || r.stdout != "lab\n" {
		t.Errorf("current-context: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
}
