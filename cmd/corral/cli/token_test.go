package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/corralhq/corral/appliance"
	apptest "github.com/corralhq/corral/testsupport/appliance"
)

// TestTokenVerbs drives `corral token create|list|revoke` against the real
// appliance: a created token works, list shows no secret and hides agent
// tokens without --all, revoke makes the token's next call fail.
func TestTokenVerbs(t *testing.T) {
	conf := apptest.Start(t, appliance.Config{}).AdminConf
	home := t.TempDir()
	run := func(token string, args ...string) result {
		t.Helper()
		var stdout, stderr bytes.Buffer
		app := &App{Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string {
			switch k {
			case "HOME":
				return home
			case "CORRAL_TOKEN":
				return token
			}
			return ""
		}}
		code := app.Run(context.Background(), append([]string{"--config", conf}, args...))
		return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
	}
	corral := func(args ...string) result { t.Helper(); return run("", args...) }

	r := corral("token", "create", "--role", "viewer", "--description", "ci reader", "--ttl", "1h")
	if r.code != ExitOK || !strings.HasPrefix(r.stdout, "crl_") || strings.Count(r.stdout, "\n") != 1 {
		t.Fatalf("create: exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	viewer := strings.TrimSpace(r.stdout)
	id := viewer[4:20]
	if r := run(viewer, "get", "nodes"); r.code != ExitOK {
		t.Fatalf("the new viewer token does not work: %d %s", r.code, r.stderr)
	}

	r = corral("token", "create", "--role", "node", "--node", "n7", "-o", "json")
	var created struct {
		Token string `json:"token"`
		Info  struct {
			Node      string `json:"node"`
			SingleUse bool   `json:"single_use"`
			Sha256    string `json:"sha256"`
		} `json:"info"`
	}
	if r.code != ExitOK || json.Unmarshal([]byte(r.stdout), &created) != nil {
		t.Fatalf("create node -o json: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	if !strings.HasPrefix(created.Token, "crl_") || created.Info.Node != "n7" || !created.Info.SingleUse || created.Info.Sha256 != "" {
		t.Errorf("created node token %+v", created)
	}

	r = corral("token", "list")
	if r.code != ExitOK || !strings.Contains(r.stdout, id) || !strings.Contains(r.stdout, "ci reader") || !strings.Contains(r.stdout, "node n7") {
		t.Fatalf("list: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, secret := range []string{viewer[21:], created.Token[21:]} {
		if strings.Contains(r.stdout, secret) {
			t.Errorf("list shows a secret:\n%s", r.stdout)
		}
	}
	for _, format := range []string{"json", "yaml"} {
		r := corral("token", "list", "--all", "-o", format)
		if r.code != ExitOK || strings.Contains(r.stdout, viewer[21:]) || strings.Contains(r.stdout, "sha256") {
			t.Errorf("list -o %s: exit %d, or a secret or hash in\n%s", format, r.code, r.stdout)
		}
	}

	for name, args := range map[string][]string{
		"agent role":         {"token", "create", "--role", "agent"},
		"no role":            {"token", "create"},
		"node on a viewer":   {"token", "create", "--role", "viewer", "--node", "n1"},
		"negative ttl":       {"token", "create", "--role", "viewer", "--ttl", "-1h"},
		"revoke without id":  {"token", "revoke"},
		"unknown token verb": {"token", "rotate"},
	} {
		if r := corral(args...); r.code != ExitUsage {
			t.Errorf("%s: exit %d (%s), want %d", name, r.code, r.stderr, ExitUsage)
		}
	}
	if r := corral("token", "create", "--role", "node", "--node", "10.0.0.1"); r.code != ExitError || !strings.Contains(r.stderr, "(InvalidArgument)") {
		t.Errorf("node token for an IP name: exit %d %q", r.code, r.stderr)
	}
	if r := run(viewer, "token", "list"); r.code != ExitError || !strings.Contains(r.stderr, "(PermissionDenied)") {
		t.Errorf("a viewer listing tokens: exit %d %q", r.code, r.stderr)
	}

	if r := corral("token", "revoke", id); r.code != ExitOK || !strings.Contains(r.stdout, id+" revoked") {
		t.Fatalf("revoke: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := run(viewer, "get", "nodes"); r.code != ExitError || !strings.Contains(r.stderr, "(Unauthenticated)") {
		t.Errorf("the revoked token's next call: exit %d %q, want Unauthenticated", r.code, r.stderr)
	}
	if r := corral("token", "revoke", id); r.code != ExitError || !strings.Contains(r.stderr, "(NotFound)") {
		t.Errorf("revoking twice: exit %d %q", r.code, r.stderr)
	}
	if r := corral("token", "revoke", "not-an-id"); r.code != ExitError || !strings.Contains(r.stderr, "(InvalidArgument)") {
		t.Errorf("revoking a malformed id: exit %d %q", r.code, r.stderr)
	}
}
