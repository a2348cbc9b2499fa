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
