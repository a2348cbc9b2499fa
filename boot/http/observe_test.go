package http

import (
	"bytes"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

type seenRequest struct {
	route string
	code  int
	bytes int64
}

type fakeObserver struct {
	mu   sync.Mutex
	seen []seenRequest
}

func (o *fakeObserver) Request(route string, code int, n int64, took time.Duration) {
	o.mu.Lock()
	o.seen = append(o.seen, seenRequest{route, code, n})
	o.mu.Unlock()
}

// TestObserver: every request is reported once answered, by route class,
// status and body bytes (an image through sendfile included), never by
// path or MAC.
func TestObserver(t *testing.T) {
	o := &fakeObserver{}
	f := newFixture(t, func(c *Config) { c.Observer = o })
	if resp, body := get(t, f.srv.URL+"/images/initrd.img?mac=52:54:00:00:00:01", nil); resp.StatusCode != http.StatusOK || !bytes.Equal(body, f.initrd) {
		t.Fatalf("image: %d, %d bytes", resp.StatusCode, len(body))
	}
	get(t, f.srv.URL+"/images/initrd.img", map[string]string{"Range": "bytes=10-19"})
	resp, script := get(t, f.srv.URL+"/boot.ipxe?mac=52:54:00:00:00:01", nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("script: %d", resp.StatusCode)
	}
	get(t, f.srv.URL+"/boot.ipxe?mac=not-a-mac", nil)
	get(t, f.srv.URL+"/etc/passwd", nil)
	want := []seenRequest{
		{RouteImage, http.StatusOK, int64(len(f.initrd))},
		{RouteImage, http.StatusPartialContent, 10},
		{RouteScript, http.StatusOK, int64(len(script))},
		{RouteScript, http.StatusBadRequest, -1},
		{RouteOther, http.StatusNotFound, -1},
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.seen) != len(want) {
		t.Fatalf("observed %d requests, want %d: %v", len(o.seen), len(want), o.seen)
	}
	for i := range want {
		if want[i].bytes < 0 { // an error body: its size is net/http's
			want[i].bytes = o.seen[i].bytes
		}
	}
	if diff := cmp.Diff(want, o.seen, cmp.AllowUnexported(seenRequest{})); diff != "" {
		t.Errorf("observed (-want +got):\n%s", diff)
	}
}
