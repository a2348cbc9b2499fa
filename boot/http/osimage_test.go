package http

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corralhq/corral/images"
	"github.com/corralhq/corral/images/blockmap"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/testsupport/require"
)

// fakeOSImages serves one file by its SHA-256, as images/osimage does,
// and its raw view through images/blockmap as format (raw by default).
type fakeOSImages struct{ sum, path, format string }

func (f fakeOSImages) OpenRaw(sum string) (io.ReadSeekCloser, int64, error) {
	if images.CheckSHA256(sum) != nil {
		return nil, 0, apierr.Invalidf("malformed")
	}
	if sum != f.sum {
		return nil, 0, apierr.NotFoundf("no such image")
	}
	im, err := blockmap.Open(f.path, blockmap.Format(cmp.Or(f.format, "raw")))
	if err != nil {
		return nil, 0, err
	}
	return struct {
		*io.SectionReader
		io.Closer
	}{io.NewSectionReader(im, 0, im.Size()), im}, im.Size(), nil
}

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

// TestOSImagesRaw: /os-images/<sha256>/raw serves a qcow2 image's raw
// view, converted as it is read: whole, by ranges and HEAD, byte for byte
// what qemu-img convert -O raw writes; malformed and unknown sums are
// refused as for the file itself.
func TestOSImagesRaw(t *testing.T) {
	require.Tool(t, "qemu-img")
	dir := t.TempDir()
	rawPath, qcPath, convPath := filepath.Join(dir, "src.raw"), filepath.Join(dir, "img.qcow2"), filepath.Join(dir, "conv.raw")
	src := make([]byte, 9<<20+512)
	for i, off := range []int{0, 3<<20 + 7, 9 << 20} {
		copy(src[off:], bytes.Repeat([]byte{byte('a' + i)}, 70000)[:min(70000, len(src)-off)])
	}
	if err := os.WriteFile(rawPath, src, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"convert", "-f", "raw", "-O", "qcow2", "-c", rawPath, qcPath},
		{"convert", "-f", "qcow2", "-O", "raw", qcPath, convPath},
	} {
		if out, err := exec.Command("qemu-img", args...).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img %v: %v\n%s", args, err, out)
		}
	}
	want, err := os.ReadFile(convPath)
	if err != nil {
		t.Fatal(err)
	}
	qc, err := os.ReadFile(qcPath)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(qc)
	sum := hex.EncodeToString(h[:])
	o := &fakeObserver{}
	f := newFixture(t, func(c *Config) { c.OSImages = fakeOSImages{sum: sum, path: qcPath, format: "qcow2"}; c.Observer = o })
	url := f.srv.URL + "/os-images/" + sum + "/raw"

	resp, body := get(t, url+"?mac=52:54:00:00:00:07", nil)
	if resp.StatusCode != http.StatusOK || !bytes.Equal(body, want) || resp.Header.Get("ETag") != `"`+sum+`-raw"` || resp.Header.Get("Accept-Ranges") != "bytes" {
		t.Fatalf("GET: %d, %d bytes (want %d, equal %v), headers %v", resp.StatusCode, len(body), len(want), bytes.Equal(body, want), resp.Header)
	}
	for _, rg := range []struct{ from, to int }{{0, 0}, {3<<20 + 1, 3<<20 + 70010}, {len(want) - 600, len(want) - 1}} {
		resp, body = get(t, url, map[string]string{"Range": fmt.Sprintf("bytes=%d-%d", rg.from, rg.to)})
		if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(body, want[rg.from:rg.to+1]) {
			t.Errorf("range %v: %d, %d bytes", rg, resp.StatusCode, len(body))
		}
	}
	req, _ := http.NewRequest(http.MethodHead, url, nil)
	hr, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	hr.Body.Close()
	if hr.StatusCode != http.StatusOK || hr.ContentLength != int64(len(want)) {
		t.Errorf("HEAD: %d, length %d, want %d", hr.StatusCode, hr.ContentLength, len(want))
	}
	if !strings.Contains(f.rec.all(), "52:54:00:00:00:07 http artifact file="+sum+"/raw") {
		t.Errorf("timeline lacks the raw view:\n%s", f.rec.all())
	}
	for path, code := range map[string]int{
		"/os-images/" + strings.Repeat("0", 64) + "/raw": http.StatusNotFound,
		"/os-images/" + strings.ToUpper(sum) + "/raw":    http.StatusBadRequest,
		"/os-images/xyz/raw":                             http.StatusBadRequest,
		"/os-images/" + sum + "/raw/raw":                 http.StatusBadRequest,
		"/os-images//raw":                                http.StatusBadRequest,
	} {
		if resp, _ := get(t, f.srv.URL+path, nil); resp.StatusCode != code {
			t.Errorf("%s: %d, want %d", path, resp.StatusCode, code)
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, seen := range o.seen {
		if seen.route != RouteOSImage {
			t.Errorf("observed route %q, want %q", seen.route, RouteOSImage)
		}
	}
}
