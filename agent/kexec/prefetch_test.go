package kexec

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"

	nodev1 "github.com/corralhq/corral/api/node/v1"
)

// countingServer is server's /kernel and /initrd, counting the requests.
func countingServer(t *testing.T) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var n atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("/kernel", func(w http.ResponseWriter, r *http.Request) { n.Add(1); w.Write(kernelBytes) })
	mux.HandleFunc("/initrd", func(w http.ResponseWriter, r *http.Request) { n.Add(1); w.Write(initrdBytes) })
	s := httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s, &n
}

// TestPrefetch: a plan prefetched while its install runs is fetched,
// verified and loaded once; the Kexec of the same plan after the install
// only reboots (no second fetch, no second load); a prefetch that failed
// its checks leaves nothing loaded and the Kexec fetches again (and
// fails the same way); a Kexec of another plan drops the prefetched one
// first; Discard unloads a prefetch whose install failed.
func TestPrefetch(t *testing.T) {
	type want struct {
		kexecFetched            bool // the Kexec (or Discard) fetched anything
		loads, unloads, reboots int
		kexecErr                string // substring; "" = success
	}
	tests := map[string]struct {
		prefetch func(p *nodev1.KexecPlan) // the plan prefetched
		kexec    func(p *nodev1.KexecPlan) // the plan the Kexec after the install carries
		discard  bool                      // the install failed: Discard instead of Kexec
		want     want
	}{
		"the same plan: loaded ahead, only rebooted after": {
			want: want{loads: 1, reboots: 1}},
		"prefetch refused (hash): nothing loaded, the kexec fetches again and fails": {
			prefetch: func(p *nodev1.KexecPlan) { p.InitrdSha256 = sum(kernelBytes) },
			kexec:    func(p *nodev1.KexecPlan) { p.InitrdSha256 = sum(kernelBytes) },
			want:     want{kexecFetched: true, kexecErr: "does not match the plan"}},
		"another plan after the install: the prefetched one is dropped": {
			kexec: func(p *nodev1.KexecPlan) { p.Cmdline += " quiet" },
			want:  want{kexecFetched: true, loads: 2, unloads: 1, reboots: 1}},
		"the install failed: discarded": {
			discard: true, want: want{loads: 1, unloads: 1}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s, fetches := countingServer(t)
			r := &rec{}
			cfg := r.config(s.Client())
			var loads int
			load := cfg.Load
			cfg.Load = func(k, i *os.File, cmdline string) error { loads++; return load(k, i, cmdline) }
			console := &bytes.Buffer{}
			cfg.Console = console
			b := NewBooter(cfg)

			pre, post := goodPlan(s.URL), goodPlan(s.URL)
			if tc.prefetch != nil {
				tc.prefetch(pre)
			}
			if tc.kexec != nil {
				tc.kexec(post)
			}
			perr := b.Prefetch(context.Background(), pre)
			if (perr == nil) != (tc.prefetch == nil) {
				t.Fatalf("Prefetch: %v", perr)
			}
			if r.reboots != 0 {
				t.Fatal("Prefetch rebooted")
			}
			prefetched := fetches.Load()
			var err error
			if tc.discard {
				b.Discard(pre.GetInstallId())
				b.Discard(pre.GetInstallId()) // twice: nothing left to unload
			} else {
				err = b.Kexec(context.Background(), post)
			}
			switch {
			case tc.want.kexecErr == "" && err != nil:
				t.Fatalf("Kexec: %v", err)
			case tc.want.kexecErr != "" && (err == nil || !strings.Contains(err.Error(), tc.want.kexecErr)):
				t.Fatalf("Kexec: %v, want an error with %q", err, tc.want.kexecErr)
			}
			got := want{kexecFetched: fetches.Load() > prefetched, loads: loads, unloads: r.unloads, reboots: r.reboots, kexecErr: tc.want.kexecErr}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(want{})); diff != "" {
				t.Errorf("(-want +got):\n%s\nconsole:\n%s", diff, console)
			}
			if tc.want.loads > 0 && (len(r.loaded) != 2 || !bytes.Equal(r.loaded[1], initrdBytes) || r.cmdline != post.GetCmdline()) {
				t.Errorf("the last load is not the plan's files and command line (%q)", r.cmdline)
			}
		})
	}
}

// TestPrefetchBusy: a second Prefetch while one is loaded is refused and
// leaves the first in place; Discard of another install leaves it too.
func TestPrefetchBusy(t *testing.T) {
	s, _ := countingServer(t)
	r := &rec{}
	b := NewBooter(r.config(s.Client()))
	first := goodPlan(s.URL)
	if err := b.Prefetch(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	second := goodPlan(s.URL)
	second.InstallId = "def"
	if err := b.Prefetch(context.Background(), second); err == nil || !strings.Contains(err.Error(), "busy") {
		t.Fatalf("second Prefetch: %v, want busy", err)
	}
	b.Discard("def")
	if r.unloads != 0 {
		t.Fatal("Discard of another install unloaded the prefetched image")
	}
	if err := b.Kexec(context.Background(), first); err != nil || r.reboots != 1 {
		t.Fatalf("Kexec of the prefetched plan: %v, %d reboots", err, r.reboots)
	}
}

// TestKexecWaitsForPrefetch: a Kexec of the plan a Prefetch is still
// loading waits for it and reboots into what it loaded; a cancelled
// context ends the wait.
func TestKexecWaitsForPrefetch(t *testing.T) {
	s, fetches := countingServer(t)
	r := &rec{}
	cfg := r.config(s.Client())
	release := make(chan struct{})
	load := cfg.Load
	cfg.Load = func(k, i *os.File, cmdline string) error { <-release; return load(k, i, cmdline) }
	b := NewBooter(cfg)
	plan := goodPlan(s.URL)
	pdone := make(chan error, 1)
	go func() { pdone <- b.Prefetch(context.Background(), plan) }()
	for {
		b.mu.Lock()
		started := b.pre != nil
		b.mu.Unlock()
		if started {
			break
		}
		runtime.Gosched()
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.Kexec(ctx, plan); !errors.Is(err, context.Canceled) {
		t.Fatalf("Kexec with a cancelled context while the prefetch loads: %v", err)
	}
	kdone := make(chan error, 1)
	go func() { kdone <- b.Kexec(context.Background(), plan) }()
	close(release)
	if err := <-pdone; err != nil {
		t.Fatal(err)
	}
	if err := <-kdone; err != nil {
		t.Fatal(err)
	}
	if r.reboots != 1 || fetches.Load() != 2 {
		t.Errorf("%d reboots, %d fetches: want 1 and 2", r.reboots, fetches.Load())
	}
}
