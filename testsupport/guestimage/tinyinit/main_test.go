package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/corralhq/corral/testsupport/require"
)

// TestFATLabel: the CIDATA label is found in FAT16 and FAT32 boot sectors
// (mkfs.vfat's), another label and a non-FAT file are not.
func TestFATLabel(t *testing.T) {
	require.Tool(t, "mkfs.vfat")
	dir := t.TempDir()
	for _, c := range []struct {
		name, label string
		args        []string
		want        bool
	}{
		{"fat16", "CIDATA", []string{"-F", "16"}, true},
		{"fat32", "cidata", []string{"-F", "32"}, true},
		{"esp", "ESP", []string{"-F", "16"}, false},
	} {
		p := filepath.Join(dir, c.name)
		args := append(append([]string{"-n", c.label}, c.args...), "-C", p, "40960")
		if out, err := exec.Command("mkfs.vfat", args...).CombinedOutput(); err != nil {
			t.Fatalf("mkfs.vfat %v: %v\n%s", args, err, out)
		}
		if got := fatLabelled(p); got != c.want {
			t.Errorf("%s labelled %s: fatLabelled = %v, want %v", c.name, c.label, got, c.want)
		}
	}
	junk := filepath.Join(dir, "junk")
	if err := os.WriteFile(junk, make([]byte, 1024), 0o644); err != nil {
		t.Fatal(err)
	}
	if fatLabelled(junk) || fatLabelled(filepath.Join(dir, "none")) {
		t.Error("a zero file or a missing one is labelled")
	}
}

// TestPhoneHome: a form POST of instance_id, hostname and fqdn to the URL
// ($INSTANCE_ID replaced), tried again after a refusal, stopping at 2xx.
func TestPhoneHome(t *testing.T) {
	var mu sync.Mutex
	var paths []string
	var form map[string][]string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		paths = append(paths, r.Method+" "+r.URL.Path)
		if len(paths) == 1 {
			http.Error(w, "not yet", http.StatusServiceUnavailable)
			return
		}
		r.ParseForm()
		form = r.PostForm
	}))
	defer srv.Close()
	phoneHome(map[string]any{"url": srv.URL + "/phone-home/$INSTANCE_ID/tok", "tries": float64(3)}, "abc123", "host-1")
	mu.Lock()
	defer mu.Unlock()
	if len(paths) != 2 || paths[1] != "POST /phone-home/abc123/tok" {
		t.Fatalf("requests %v, want two POSTs to /phone-home/abc123/tok", paths)
	}
	for k, v := range map[string]string{"instance_id": "abc123", "hostname": "host-1", "fqdn": "host-1"} {
		if len(form[k]) != 1 || form[k][0] != v {
			t.Errorf("form %s = %v, want %s", k, form[k], v)
		}
	}
}

// TestWriteFiles: plain content at absolute paths with the permissions
// given; relative paths and encoded content are skipped.
func TestWriteFiles(t *testing.T) {
	dir := t.TempDir()
	a, b, rel := filepath.Join(dir, "etc", "a"), filepath.Join(dir, "b"), "relative"
	writeFiles([]any{
		map[string]any{"path": a, "content": "hello\n"},
		map[string]any{"path": b, "content": "x", "permissions": "0600"},
		map[string]any{"path": rel, "content": "no"},
		map[string]any{"path": filepath.Join(dir, "enc"), "content": "aGk=", "encoding": "b64"},
	})
	if got, err := os.ReadFile(a); err != nil || string(got) != "hello\n" {
		t.Errorf("%s: %q %v", a, got, err)
	}
	if st, err := os.Stat(b); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("%s: %v %v, want mode 0600", b, st, err)
	}
	for _, p := range []string{rel, filepath.Join(dir, "enc")} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s written", p)
		}
	}
}
