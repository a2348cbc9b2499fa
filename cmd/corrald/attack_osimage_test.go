package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"
)

// TestAttackOSImageRawPaths: the boot HTTP server's OS image routes on the
// built corrald, as a machine on the boot LAN sees them. A READY image's
// raw view is served whole to anyone (docs/security.md, "OS images on the
// boot LAN": keep secrets out of images); anything else is refused with a
// bare status: a malformed or unknown sum, a path that climbs out, a
// method other than GET and HEAD. Nothing but the image's own bytes leaves.
func TestAttackOSImageRawPaths(t *testing.T) {
	c := startCredCorrald(t)
	disk := uploadRawImage(t, c, "tiny")
	s := sha256.Sum256(disk)
	sum := hex.EncodeToString(s[:])
	code, body := httpDo(t, c.http, "127.0.9.3", http.MethodGet, "/os-images/"+sum+"/raw")
	// httpDo reads the first 4 KiB of an answer: they are the image's.
	if code != http.StatusOK || len(body) == 0 || !bytes.Equal([]byte(body), disk[:len(body)]) {
		t.Fatalf("the READY image's raw view: %d, %d bytes that are not the image's start", code, len(body))
	}
	unknown := strings.Repeat("0", 64)
	for _, tc := range []struct {
		what, method, path string
	}{
		{"an unknown sum", http.MethodGet, "/os-images/" + unknown + "/raw"},
		{"a short sum", http.MethodGet, "/os-images/" + sum[:40] + "/raw"},
		{"an upper-case sum", http.MethodGet, "/os-images/" + strings.ToUpper(sum) + "/raw"},
		{"a climb out", http.MethodGet, "/os-images/" + sum + "/raw/../../../etc/passwd"},
		{"an encoded climb out", http.MethodGet, "/os-images/%2e%2e%2f%2e%2e%2fetc%2fpasswd/raw"},
		{"a suffix after raw", http.MethodGet, "/os-images/" + sum + "/raw/x"},
		{"a POST", http.MethodPost, "/os-images/" + sum + "/raw"},
		{"a DELETE", http.MethodDelete, "/os-images/" + sum + "/raw"},
	} {
		code, body := httpDo(t, c.http, "127.0.9.3", tc.method, tc.path)
		if code < 400 || code >= 500 {
			t.Errorf("%s (%s %s): %d, want a 4xx refusal", tc.what, tc.method, tc.path, code)
		}
		if strings.Contains(body, "root:") || len(body) > 512 {
			t.Errorf("%s: the refusal carries %d bytes: %.80q", tc.what, len(body), body)
		}
	}
}
