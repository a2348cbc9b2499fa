package http

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corralhq/corral/images"
	"github.com/corralhq/corral/internal/apierr"
)

// fakeOSImages serves one file by its SHA-256, as images/osimage does.
type fakeOSImages struct{ sum, path string }

func (f fakeOSImages) Open(sum string) (*os.File, images.Artifact, error) {
	if images.CheckSHA256(sum) != nil {
		return nil, images.Artifact{}, apierr.Invalidf("malformed")
	}
	if sum != f.sum {
		return nil, images.Artifact{}, apierr.NotFoundf("no such image")
	}
	fl, err := os.Open(f.path)
	if err != nil {
		return nil, images.Artifact{}, err
	}
	st, _ := fl.Stat()
	return fl, images.Artifact{Name: sum, Path: f.path, Size: st.Size(), SHA256: sum}, nil
}

// TestOSImagesRange: /os-images/<sha256> serves a READY OS image whole or
// by ranges (a resumed or parallel deploy), puts it on the machine's
// timeline, and refuses other content, malformed sums and writes.
func TestOSImagesRange(t *testing.T) {
	disk := bytes.Repeat([]byte("os-image-bytes.."), 1<<16)
	h := sha256.Sum256(disk)
	sum := hex.EncodeToString(h[:])
	p := filepath.Join(t.TempDir(), sum)
	if err := os.WriteFile(p, disk, 0o644); err != nil {
		t.Fatal(err)
	}
	o := &fakeObserver{}
	f := newFixture(t, func(c *Config) { c.OSImages = fakeOSImages{sum: sum, path: p}; c.Observer = o })
	url := f.srv.URL + "/os-images/" + sum
	resp, body := get(t, url+"?mac=52:54:00:00:00:01", nil)
	if resp.StatusCode != http.StatusOK || !bytes.Equal(body, disk) || resp.Header.Get("Accept-Ranges") != "bytes" || resp.Header.Get("ETag") != `"`+sum+`"` {
		t.Fatalf("GET: %d, %d bytes, headers %v", resp.StatusCode, len(body), resp.Header)
	}
	resp, body = get(t, url+"?mac=52:54:00:00:00:01", map[string]string{"Range": "bytes=1048560-"})
	if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(body, disk[1048560:]) {
		t.Fatalf("range GET: %d, %d bytes", resp.StatusCode, len(body))
	}
	resp, _ = get(t, url, map[string]string{"Range": "bytes=0-3,16-19"})
	if resp.StatusCode != http.StatusPartialContent || !strings.HasPrefix(resp.Header.Get("Content-Type"), "multipart/byteranges") {
		t.Errorf("two ranges: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if !strings.Contains(f.rec.all(), "52:54:00:00:00:01 http artifact file="+sum+" bytes=16 status=206") {
		t.Errorf("timeline lacks the ranged OS image:\n%s", f.rec.all())
	}
	for path, code := range map[string]int{
		"/os-images/" + strings.Repeat("0", 64): http.StatusNotFound,
		"/os-images/../images/initrd.img":       http.StatusBadRequest, // not a sum: no traversal
		"/os-images/" + strings.ToUpper(sum):    http.StatusBadRequest,
		"/os-images/":                           http.StatusBadRequest,
	} {
		if resp, _ := get(t, f.srv.URL+path, nil); resp.StatusCode != code {
			t.Errorf("%s: %d, want %d", path, resp.StatusCode, code)
		}
	}
	req, _ := http.NewRequest(http.MethodPut, url, strings.NewReader("x"))
	r2, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r2.Body.Close()
	if r2.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("PUT: %d", r2.StatusCode)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.seen) == 0 || o.seen[0].route != RouteOSImage {
		t.Errorf("observed %v; want the os-image route first", o.seen)
	}
}

// TestOSImagesOff: without an OS image store the path is 404.
func TestOSImagesOff(t *testing.T) {
	f := newFixture(t, nil)
	if resp, _ := get(t, f.srv.URL+"/os-images/"+strings.Repeat("0", 64), nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("status %d, want 404", resp.StatusCode)
	}
}
