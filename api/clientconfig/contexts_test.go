package clientconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func writeFile(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestOldFileLoads: a file corrald's Config.Write produced is a File with
// one context, "default", and Load returns it unchanged.
func TestOldFileLoads(t *testing.T) {
	ca, err := newTestCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Endpoint: "appliance:20180", CACert: string(ca.CertPEM()), Token: testToken}
	path := filepath.Join(t.TempDir(), "admin.conf")
	if err := want.Write(path); err != nil {
		t.Fatal(err)
	}
	got, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, *got); diff != "" {
		t.Errorf("Load (-want +got):\n%s", diff)
	}
	f, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"default"}, f.Names()); diff != "" {
		t.Errorf("Names (-want +got):\n%s", diff)
	}
	// Writing the File back keeps exactly the old keys.
	if err := f.Write(path); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	for _, key := range []string{"contexts", "current_context"} {
		if strings.Contains(string(raw), key) {
			t.Errorf("a one-context file gained %s:\n%s", key, raw)
		}
	}
}

func TestContexts(t *testing.T) {
	const body = `endpoint: a:20180
token: tok-a
current_context: site-b
contexts:
- name: site-b
  endpoint: b:20180
  token: tok-b
- name: site-c
  endpoint: c:20180
`
	tests := map[string]struct {
		use     string // UseContext before reading; "" keeps the file's
		ctx     string // Context argument
		want    Config
		wantErr string
	}{
		"current from file":   {want: Config{Endpoint: "b:20180", Token: "tok-b"}},
		"default by name":     {ctx: "default", want: Config{Endpoint: "a:20180", Token: "tok-a"}},
		"named":               {ctx: "site-c", want: Config{Endpoint: "c:20180"}},
		"use switches":        {use: "site-c", want: Config{Endpoint: "c:20180"}},
		"use default":         {use: "default", want: Config{Endpoint: "a:20180", Token: "tok-a"}},
		"unknown":             {ctx: "site-x", wantErr: `unknown context "site-x" (known: "default", "site-b", "site-c")`},
		"use unknown refused": {use: "nope", wantErr: `unknown context "nope" (known: "default", "site-b", "site-c")`},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			path := writeFile(t, body)
			f, err := LoadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if tt.use != "" {
				if err := f.UseContext(tt.use); err != nil {
					if tt.wantErr == "" || err.Error() != tt.wantErr {
						t.Fatalf("UseContext: %v, want %q", err, tt.wantErr)
					}
					if f.CurrentContext != "site-b" {
						t.Errorf("a refused UseContext changed the current context to %q", f.CurrentContext)
					}
					return
				}
				if err := f.Write(path); err != nil {
					t.Fatal(err)
				}
				if f, err = LoadFile(path); err != nil {
					t.Fatal(err)
				}
			}
			got, err := f.Context(tt.ctx)
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("Context: %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, *got); diff != "" {
				t.Errorf("Context (-want +got):\n%s", diff)
			}
			if tt.ctx == "" {
				loaded, err := Load(path)
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(tt.want, *loaded); diff != "" {
					t.Errorf("Load follows the current context (-want +got):\n%s", diff)
				}
			}
		})
	}
}

func TestContextsRejected(t *testing.T) {
	for name, body := range map[string]string{
		"unknown current":        "endpoint: a:1\ncurrent_context: b\n",
		"duplicate name":         "contexts:\n- name: b\n  endpoint: b:1\n- name: b\n  endpoint: c:1\n",
		"reserved name":          "endpoint: a:1\ncontexts:\n- name: default\n  endpoint: b:1\n",
		"empty name":             "contexts:\n- endpoint: b:1\n",
		"context no endpoint":    "contexts:\n- name: b\n  token: t\n",
		"context bad token":      "contexts:\n- name: b\n  endpoint: b:1\n  token: a b\n",
		"context unknown key":    "contexts:\n- name: b\n  endpoint: b:1\n  server: x\n",
		"token without endpoint": "token: t\ncontexts:\n- name: b\n  endpoint: b:1\n",
	} {
		t.Run(name, func(t *testing.T) {
			path := writeFile(t, body)
			if _, err := LoadFile(path); err == nil || !strings.Contains(err.Error(), path) {
				t.Fatalf("LoadFile = %v, want an error naming %s", err, path)
			}
		})
	}
}

func TestOnlyNamedContexts(t *testing.T) {
	f := &File{}
	if err := f.SetContext("lab", Config{Endpoint: "lab:1", Token: "secret-tok"}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := f.Write(path); err != nil {
		t.Fatal(err)
	}
	got, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Endpoint != "lab:1" {
		t.Errorf("the only context is not current: %+v", got)
	}
	if err := f.SetContext("two", Config{Endpoint: "two:1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Context(""); err == nil || !strings.Contains(err.Error(), `"lab", "two"`) {
		t.Errorf("two contexts and none current: %v", err)
	}
	want := []ContextInfo{{Name: "lab", Endpoint: "lab:1", HasToken: true}, {Name: "two", Endpoint: "two:1"}}
	if diff := cmp.Diff(want, f.List()); diff != "" {
		t.Errorf("List (-want +got):\n%s", diff)
	}
	if err := f.SetContext("bad name", Config{Endpoint: "x:1"}); err == nil {
		t.Error("a name with a space was accepted")
	}
}
