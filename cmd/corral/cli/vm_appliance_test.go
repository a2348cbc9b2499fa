package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/corralhq/corral/appliance"
	"github.com/corralhq/corral/deploy"
	apptest "github.com/corralhq/corral/testsupport/appliance"
)

// TestVerbsAgainstAppliance runs the vm, bs and image verbs against the
// real appliance services: an in-process corrald with a fresh data
// directory, reached over TLS with the admin.conf it writes.
func TestVerbsAgainstAppliance(t *testing.T) {
	conf := apptest.Start(t, appliance.Config{}).AdminConf
	home := t.TempDir()
	corral := func(args ...string) result {
		t.Helper()
		var stdout, stderr bytes.Buffer
		app := &App{
			Stdout: &stdout,
			Stderr: &stderr,
			Getenv: func(k string) string {
				if k == "HOME" {
					return home
				}
				return ""
			},
		}
		code := app.Run(context.Background(), append([]string{"--config", conf}, args...))
		r := result{code: code, stdout: stdout.String(), stderr: stderr.String()}
		t.Logf("corral %s -> %d\n%s%s", strings.Join(args, " "), code, r.stdout, r.stderr)
		return r
	}

	t.Run("empty appliance prints headers only", func(t *testing.T) {
		for _, k := range []*kind{virtualMachineKind, blockStorageKind, imageKind} {
			rk, ok := deploy.DefaultRegistry().Kind(k.name)
			if !ok || len(rk.Aliases) == 0 {
				t.Fatalf("kind %s: not in the registry, or no alias", k.name)
			}
			alias := rk.Aliases[0]
			r := corral("get", alias)
			want := strings.Join(k.columns, "   ") + "\n"
			if r.code != ExitOK || r.stderr != "" || r.stdout != want {
				t.Errorf("get %s: exit %d stdout %q stderr %q; want headers only %q", alias, r.code, r.stdout, r.stderr, want)
			}
		}
	})

	t.Run("memory request != limit is refused in one line", func(t *testing.T) {
		r := corral("vm", "create", "vm1", "--limit-cpu-milli-core", "1000",
			"--limit-memory-bytes", "1GiB", "--request-memory-bytes", "512MiB", "--nic", "lan=192.168.0.10")
		if r.code != ExitError || r.stdout != "" {
			t.Fatalf("exit %d stdout %q, want exit 1 and nothing on stdout", r.code, r.stdout)
		}
		checkOneLine(t, r.stderr)
		for _, want := range []string{`create virtual_machine "vm1": `, "request_memory_bytes 536870912 must equal limit_memory_bytes 1073741824", "(InvalidArgument)"} {
			if !strings.Contains(r.stderr, want) {
				t.Errorf("stderr %q lacks %q", r.stderr, want)
			}
		}
		if r := corral("get", "vm"); r.code != ExitOK || strings.Count(r.stdout, "\n") != 1 {
			t.Errorf("a refused VM left a record: %q", r.stdout)
		}
	})

	t.Run("cpu limit not a multiple of 1000", func(t *testing.T) {
		r := corral("vm", "create", "vm1", "--limit-cpu-milli-core", "1500", "--limit-memory-bytes", "1GiB")
		if r.code != ExitError || !strings.Contains(r.stderr, "multiple of 1000") || !strings.Contains(r.stderr, "(InvalidArgument)") {
			t.Fatalf("exit %d stderr %q", r.code, r.stderr)
		}
		checkOneLine(t, r.stderr)
	})

	t.Run("image apply and get", func(t *testing.T) {
		if r := corral("image", "apply", "debian", "--label", "os=linux"); r.code != ExitOK {
			t.Fatalf("image apply: exit %d: %s", r.code, r.stderr)
		}
		r := corral("get", "images")
		want := "NAME     TAGS   REGISTERED\ndebian   -      -\n"
		if r.code != ExitOK || r.stdout != want {
			t.Errorf("get images: exit %d stdout %q, want %q", r.code, r.stdout, want)
		}
		if r := corral("image", "generate", "debian", "latest", "web1-root"); r.code != ExitError || !strings.Contains(r.stderr, `no tag "latest"`) {
			t.Errorf("generate from a missing tag: exit %d stderr %q", r.code, r.stderr)
		} else {
			checkOneLine(t, r.stderr)
		}
		if r := corral("image", "delete", "debian"); r.code != ExitOK || r.stdout != "image/debian deleted\n" {
			t.Errorf("image delete: exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
		}
	})

	t.Run("bs on an appliance without nodes", func(t *testing.T) {
		r := corral("bs", "create", "data1", "--limit-bytes", "1GiB")
		if r.code != ExitError || r.stdout != "" {
			t.Fatalf("exit %d stdout %q", r.code, r.stdout)
		}
		checkOneLine(t, r.stderr)
		if r := corral("get", "bs"); r.code != ExitOK || r.stdout != strings.Join(blockStorageKind.columns, "   ")+"\n" {
			t.Errorf("a failed create left a record: %q", r.stdout)
		}
	})
}
