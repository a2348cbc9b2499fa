package kexec

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	nodev1 "github.com/corralhq/corral/api/node/v1"
)

func sum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// files is what the test boot server holds.
var (
	kernelBytes = bytes.Repeat([]byte("K"), 64<<10)
	initrdBytes = bytes.Repeat([]byte("initrd"), 100<<10)
)

// server serves /kernel and /initrd, with /short (the kernel's first
// half, Content-Length saying so), /cut (a Content-Length of the whole
// kernel, the connection closed after half) and /long (the kernel and
// more) for the refusals.
func server(t *testing.T) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/kernel", func(w http.ResponseWriter, r *http.Request) { w.Write(kernelBytes) })
	mux.HandleFunc("/initrd", func(w http.ResponseWriter, r *http.Request) { w.Write(initrdBytes) })
	mux.HandleFunc("/short", func(w http.ResponseWriter, r *http.Request) { w.Write(kernelBytes[:len(kernelBytes)/2]) })
	mux.HandleFunc("/long", func(w http.ResponseWriter, r *http.Request) {
		w.Write(append(append([]byte{}, kernelBytes...), "tail"...))
	})
	mux.HandleFunc("/cut", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(kernelBytes)))
		w.WriteHeader(http.StatusOK)
		w.Write(kernelBytes[:len(kernelBytes)/2])
		w.(http.Flusher).Flush()
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.(*net.TCPConn).SetLinger(0)
			conn.Close()
		}
	})
	s := httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

func goodPlan(base string) *nodev1.KexecPlan {
	return &nodev1.KexecPlan{
		InstallId: "abc",
		KernelUrl: base + "/kernel", KernelSha256: sum(kernelBytes), KernelSize: int64(len(kernelBytes)),
		InitrdUrl: base + "/initrd", InitrdSha256: sum(initrdBytes), InitrdSize: int64(len(initrdBytes)),
		Cmdline: "initrd=hv.img corral.mode=hypervisor console=ttyS0",
	}
}

// rec records what Boot asked of the kernel.
type rec struct {
	loaded            [][]byte // kernel, initrd as loaded
	cmdline           string
	unloads, reboots  int
	loadErr, rebootEr error
}

func (r *rec) config(c *http.Client) Config {
	return Config{
		Client: c,
		Load: func(k, i *os.File, cmdline string) error {
			if r.loadErr != nil {
				return r.loadErr
			}
			kb, _ := io.ReadAll(k)
			ib, _ := io.ReadAll(i)
			r.loaded, r.cmdline = [][]byte{kb, ib}, cmdline
			return nil
		},
		Unload: func() error { r.unloads++; return nil },
		Reboot: func() error { r.reboots++; return r.rebootEr },
	}
}

func TestBoot(t *testing.T) {
	s := server(t)
	tests := map[string]struct {
		plan      func(p *nodev1.KexecPlan)
		loadErr   error
		rebootErr error
		wantErr   string // substring; "" = success
		wantHash  bool   // errors.Is(err, ErrHash)
		loaded    bool
		reboots   int
		unloads   int
	}{
		"good": {plan: func(*nodev1.KexecPlan) {}, loaded: true, reboots: 1},
		"wrong kernel hash": {plan: func(p *nodev1.KexecPlan) { p.KernelSha256 = sum([]byte("another kernel")) },
			wantErr: "kernel", wantHash: true},
		"wrong initrd hash (upper-case hex of another file)": {plan: func(p *nodev1.KexecPlan) { p.InitrdSha256 = strings.ToUpper(sum(kernelBytes)) },
			wantErr: "initrd", wantHash: true},
		"truncated download (short body)": {plan: func(p *nodev1.KexecPlan) { p.KernelUrl = s.URL + "/short" },
			wantErr: "got 32768 bytes, the plan says 65536", wantHash: true},
		"truncated download (connection cut)": {plan: func(p *nodev1.KexecPlan) { p.KernelUrl = s.URL + "/cut" },
			wantErr: "fetch kernel"},
		"longer than the plan": {plan: func(p *nodev1.KexecPlan) { p.KernelUrl = s.URL + "/long" },
			wantErr: "got 65537 bytes", wantHash: true},
		"not found":    {plan: func(p *nodev1.KexecPlan) { p.InitrdUrl = s.URL + "/nothing" }, wantErr: "404"},
		"no install":   {plan: func(p *nodev1.KexecPlan) { p.InstallId = "" }, wantErr: "no install id"},
		"file url":     {plan: func(p *nodev1.KexecPlan) { p.KernelUrl = "file:///boot/vmlinuz" }, wantErr: "want an http(s) URL"},
		"short hash":   {plan: func(p *nodev1.KexecPlan) { p.InitrdSha256 = "abcd" }, wantErr: "want 64 hex digits"},
		"zero size":    {plan: func(p *nodev1.KexecPlan) { p.KernelSize = 0 }, wantErr: "want 1 to"},
		"huge size":    {plan: func(p *nodev1.KexecPlan) { p.InitrdSize = MaxFileSize + 1 }, wantErr: "want 1 to"},
		"newline":      {plan: func(p *nodev1.KexecPlan) { p.Cmdline += "\ninit=/bin/sh" }, wantErr: "printable"},
		"long cmdline": {plan: func(p *nodev1.KexecPlan) { p.Cmdline = strings.Repeat("a", MaxCmdline) }, wantErr: "printable"},
		"load fails":   {plan: func(*nodev1.KexecPlan) {}, loadErr: errors.New("EPERM"), wantErr: "kexec load: EPERM"},
		"reboot fails: unloaded again": {plan: func(*nodev1.KexecPlan) {}, rebootErr: errors.New("EINVAL"),
			wantErr: "kexec reboot: EINVAL", loaded: true, reboots: 1, unloads: 1},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := goodPlan(s.URL)
			tc.plan(p)
			r := &rec{loadErr: tc.loadErr, rebootEr: tc.rebootErr}
			err := Boot(context.Background(), r.config(s.Client()), p)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Boot: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Boot: %v, want an error with %q", err, tc.wantErr)
			}
			if got := errors.Is(err, ErrHash); got != tc.wantHash {
				t.Errorf("errors.Is(%v, ErrHash) = %v, want %v", err, got, tc.wantHash)
			}
			if tc.loaded {
				if len(r.loaded) != 2 || !bytes.Equal(r.loaded[0], kernelBytes) || !bytes.Equal(r.loaded[1], initrdBytes) {
					t.Errorf("loaded files are not the served kernel and initrd")
				}
				if r.cmdline != p.GetCmdline() {
					t.Errorf("cmdline %q, want %q", r.cmdline, p.GetCmdline())
				}
			} else if r.loaded != nil {
				t.Errorf("something was loaded after a refusal: nothing half-booted must remain")
			}
			if r.reboots != tc.reboots || r.unloads != tc.unloads {
				t.Errorf("reboots %d unloads %d, want %d and %d", r.reboots, r.unloads, tc.reboots, tc.unloads)
			}
		})
	}
}

func TestBootCancelled(t *testing.T) {
	s := server(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := &rec{}
	if err := Boot(ctx, r.config(s.Client()), goodPlan(s.URL)); err == nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("Boot with a cancelled context: %v, want context.Canceled", err)
	}
	if r.loaded != nil || r.reboots != 0 {
		t.Errorf("loaded or rebooted after cancellation")
	}
}

// TestFetchTimes: a fetch says where its time went: the network (a body
// that trickles in), the hash and the memfd.
func TestFetchTimes(t *testing.T) {
	body := bytes.Repeat([]byte("x"), 256<<10)
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		for i := 0; i < len(body); i += 64 << 10 {
			w.Write(body[i : i+64<<10])
			w.(http.Flusher).Flush()
			// 150 ms of pauses before the last chunk, against the 50 ms
			// asserted: the time the client spends outside Read (hashing,
			// handing chunks on) may take the rest on a loaded machine
			// (20 ms pauses once measured 49 ms in CI).
			time.Sleep(50 * time.Millisecond)
		}
	}))
	defer s.Close()
	f, ft, err := fetch(context.Background(), s.Client(), "initrd", s.URL, int64(len(body)), sum(body))
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if ft.read < 50*time.Millisecond || ft.hash <= 0 || ft.write <= 0 {
		t.Errorf("times = %+v: want the network's wait (>= 50 ms), the hash and the write counted", ft)
	}
	if s := ft.String(); !strings.Contains(s, "network ") || !strings.Contains(s, "sha256 ") || !strings.Contains(s, "memfd ") {
		t.Errorf("String() = %q", s)
	}
}

// chunkReader returns one chunk per Read.
type chunkReader struct{ chunks [][]byte }

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.chunks[0])
	r.chunks = r.chunks[1:]
	return n, nil
}

// countingHash counts its writes and signals once it has seen three.
type countingHash struct {
	buf   bytes.Buffer
	n     int
	three chan struct{}
}

func (h *countingHash) Write(p []byte) (int, error) {
	h.n++
	if h.n == 3 {
		close(h.three)
	}
	return h.buf.Write(p)
}

// blockedFile holds its first Write until the hash has gone ahead.
type blockedFile struct {
	buf     bytes.Buffer
	wait    chan struct{}
	waited  bool
	timeout bool
	fail    error
}

func (f *blockedFile) Write(p []byte) (int, error) {
	if !f.waited {
		f.waited = true
		select {
		case <-f.wait:
		case <-time.After(5 * time.Second):
			f.timeout = true
		}
	}
	if f.fail != nil {
		return 0, f.fail
	}
	return f.buf.Write(p)
}

// TestHashAndStore: the memfd is written beside the hash, not after each
// chunk of it (the hash goes three chunks ahead of a writer still busy
// with the first), in order and whole; a failed write is the result.
func TestHashAndStore(t *testing.T) {
	var chunks [][]byte
	var all []byte
	for i := range 8 {
		c := bytes.Repeat([]byte{byte('a' + i)}, 1000+i)
		chunks = append(chunks, c)
		all = append(all, c...)
	}
	h := &countingHash{three: make(chan struct{})}
	f := &blockedFile{wait: h.three}
	var took time.Duration
	n, err := hashAndStore(&chunkReader{chunks: chunks}, h, f, &took)
	if err != nil || n != int64(len(all)) {
		t.Fatalf("hashAndStore = %d, %v; want %d, nil", n, err, len(all))
	}
	if f.timeout {
		t.Error("the hash waited for the memfd's write")
	}
	if !bytes.Equal(h.buf.Bytes(), all) || !bytes.Equal(f.buf.Bytes(), all) {
		t.Error("hash or file got other bytes than the body")
	}
	if took <= 0 {
		t.Error("write time not counted")
	}
	broken := errors.New("no space")
	h = &countingHash{three: make(chan struct{})}
	f = &blockedFile{wait: h.three, fail: broken}
	if _, err := hashAndStore(&chunkReader{chunks: chunks}, h, f, &took); !errors.Is(err, broken) {
		t.Errorf("hashAndStore with a failing file = %v, want %v", err, broken)
	}
}
