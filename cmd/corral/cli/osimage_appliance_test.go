package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corralhq/corral/appliance"
	apptest "github.com/corralhq/corral/testsupport/appliance"
)

// TestOSImageAgainstAppliance runs the osimage verbs against a real
// corrald (network boot on loopback): add from a URL and wait, upload a
// file, list, describe, fetch the served bytes with a range, refuse a
// wrong hash and a missing format, delete.
func TestOSImageAgainstAppliance(t *testing.T) {
	a := apptest.Start(t, appliance.Config{Boot: appliance.BootConfig{Interface: "lo", DHCPMode: "off", TFTPListen: "off", HTTPListen: "127.0.0.1:0", NoRA: true}})
	home := t.TempDir()
	corral := func(args ...string) result {
		t.Helper()
		var stdout, stderr bytes.Buffer
		app := &App{Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string {
			if k == "HOME" {
				return home
			}
			return ""
		}}
		code := app.Run(context.Background(), append([]string{"--config", a.AdminConf}, args...))
		r := result{code: code, stdout: stdout.String(), stderr: stderr.String()}
		t.Logf("corral %s -> %d\n%s%s", strings.Join(args, " "), code, r.stdout, r.stderr)
		return r
	}
	hexOf := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

	disk := bytes.Repeat([]byte("a raw disk image."), 1<<16) // 1 MiB
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(disk) }))
	defer web.Close()
	file := filepath.Join(t.TempDir(), "up.img")
	up := bytes.Repeat([]byte("uploaded bytes.."), 40000) // 625 KiB: three chunks
	if err := os.WriteFile(file, up, 0o644); err != nil {
		t.Fatal(err)
	}

	if r := corral("get", "osimages"); r.code != ExitOK || r.stdout != "No os images.\n" {
		t.Errorf("empty list: exit %d %q", r.code, r.stdout)
	}
	r := corral("osimage", "add", "debian", "--url", web.URL+"/debian.raw", "--sha256", hexOf(disk), "--format", "raw", "--wait", "--label", "os=debian")
	if r.code != ExitOK || !strings.Contains(r.stdout, "READY") {
		t.Fatalf("add --wait: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	r = corral("osimage", "add", "liar", "--url", web.URL+"/liar.raw", "--sha256", hexOf([]byte("x")), "--format", "raw", "--wait")
	if r.code != ExitError || !strings.Contains(r.stdout, "FAILED") || !strings.Contains(r.stderr, "sha256 mismatch") {
		t.Errorf("add of a wrong hash: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := corral("osimage", "add", "x", "--url", web.URL, "--sha256", hexOf(disk)); r.code != ExitUsage || !strings.Contains(r.stderr, "never guessed") {
		t.Errorf("add without --format: exit %d %q", r.code, r.stderr)
	}
	if r := corral("osimage", "upload", "up", file, "--format", "raw"); r.code != ExitOK || !strings.Contains(r.stdout, "READY") {
		t.Fatalf("upload: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	r = corral("osimage", "upload", "bad", file, "--format", "raw", "--sha256", hexOf(disk))
	if r.code != ExitError || !strings.Contains(r.stderr, "sha256 mismatch") || !strings.Contains(r.stderr, "(InvalidArgument)") {
		t.Errorf("upload of a wrong hash: exit %d %q", r.code, r.stderr)
	}
	// Progress lines come first on stderr; the error is one last line.
	lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
	checkOneLine(t, lines[len(lines)-1]+"\n")
	if r := corral("osimage", "upload", "notqcow", file, "--format", "qcow2"); r.code != ExitError || !strings.Contains(r.stderr, "qcow2 magic") {
		t.Errorf("upload of raw bytes as qcow2: exit %d %q", r.code, r.stderr)
	}

	r = corral("get", "osimages", "-o", "wide")
	for _, want := range []string{"debian", "READY", "raw", "/os-images/" + hexOf(disk), "liar", "FAILED", "up", "(uploaded)"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("get osimages -o wide lacks %q:\n%s", want, r.stdout)
		}
	}
	if strings.Contains(r.stdout, "bad") || strings.Contains(r.stdout, "notqcow") {
		t.Errorf("a refused upload is listed:\n%s", r.stdout)
	}
	if r := corral("describe", "osimage", "up"); r.code != ExitOK || !strings.Contains(r.stdout, hexOf(up)) {
		t.Errorf("describe: exit %d %q", r.code, r.stdout)
	}

	req, _ := http.NewRequest(http.MethodGet, "http://"+a.Server.BootHTTPAddr().String()+"/os-images/"+hexOf(up), nil)
	req.Header.Set("Range", "bytes=262144-262159")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(got, up[262144:262160]) {
		t.Errorf("range GET of the upload: %d %q", resp.StatusCode, got)
	}

	if r := corral("delete", "osimage", "up"); r.code != ExitOK {
		t.Errorf("delete: exit %d %q", r.code, r.stderr)
	}
	if r := corral("get", "osimage", "up"); r.code == ExitOK {
		t.Errorf("get of a deleted image: exit %d", r.code)
	}
}
