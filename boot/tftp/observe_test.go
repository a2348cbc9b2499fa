package tftp

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/images"
	"github.com/google/go-cmp/cmp"
	"github.com/pin/tftp/v3"
)

type fakeObserver struct {
	mu    sync.Mutex
	seen  map[[2]string]int
	bytes int64
}

func (o *fakeObserver) Transfer(file, outcome string, n int64) {
	o.mu.Lock()
	o.seen[[2]string{file, outcome}]++
	o.bytes += n
	o.mu.Unlock()
}

// TestObserver: a download is reported by catalog name and its bytes; a
// refused name and a write request as "other", never by the name asked.
func TestObserver(t *testing.T) {
	cat, efi := testCatalog(t)
	o := &fakeObserver{seen: map[[2]string]int{}}
	s, err := New(Config{Listen: "127.0.0.1:0", Catalog: cat, Limits: Limits{Timeout: 500 * time.Millisecond, Retries: 2}, Observer: o})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	addr := s.Addr().String()
	if b, _, err := fetch(t, addr, images.IPXEEFI, 0, false); err != nil || len(b) != len(efi) {
		t.Fatalf("download: %d bytes, %v", len(b), err)
	}
	if _, _, err := fetch(t, addr, "../../etc/passwd", 0, false); err == nil {
		t.Fatal("a traversal was served")
	}
	c, _ := tftp.NewClient(addr)
	c.SetTimeout(time.Second)
	c.SetRetries(1)
	if rf, err := c.Send(images.IPXEEFI, "octet"); err == nil {
		rf.ReadFrom(strings.NewReader("evil"))
	}
	want := map[[2]string]int{{images.IPXEEFI, OutcomeServed}: 1, {"other", OutcomeRefused}: 2}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		o.mu.Lock()
		ok := cmp.Equal(want, o.seen) && o.bytes == int64(len(efi))
		got, n := o.seen, o.bytes
		o.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("observed %d bytes, want %d; (-want +got):\n%s", n, len(efi), cmp.Diff(want, got))
		}
	}
}
