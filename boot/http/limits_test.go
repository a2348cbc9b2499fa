package http

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corralhq/corral/testsupport/syncbuf"
)

// limitedServer serves a file of size bytes at /file (http.ServeContent,
// as artifact does) under lim on a loopback port. ctxErr receives the
// request context's error after each download.
type limitedServer struct {
	addr   string
	data   []byte
	logs   *syncbuf.Buffer
	ctxErr chan error
}

func startLimited(t *testing.T, lim Limits, size int) *limitedServer {
	t.Helper()
	s := &limitedServer{logs: &syncbuf.Buffer{}, ctxErr: make(chan error, 16)}
	s.data = bytes.Repeat([]byte("corral-initramfs"), size/16)
	p := filepath.Join(t.TempDir(), "initrd.img")
	if err := os.WriteFile(p, s.data, 0o644); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(s.logs, nil))
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, err := os.Open(p)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer f.Close()
		w.Header().Set("Content-Type", "application/octet-stream")
		http.ServeContent(w, r, "", time.Time{}, f)
		s.ctxErr <- r.Context().Err()
	})
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := lim.server(h, log)
	lis := lim.listener(raw, log)
	s.addr = lis.Addr().String()
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Close()
		<-done
		if t.Failed() {
			t.Logf("server logs:\n%s", s.logs)
		}
	})
	return s
}

func dialFrom(t *testing.T, addr, from string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedWithin reads c until the server closes it and says whether that
// happened within d, with what was read.
func closedWithin(c net.Conn, d time.Duration) (bool, string) {
	c.SetReadDeadline(time.Now().Add(d))
	b, err := io.ReadAll(c)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout()), string(b)
}

func waitLog(t *testing.T, logs *syncbuf.Buffer, want string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(logs.String(), want); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no log line %q in:\n%s", want, logs)
		}
	}
}

// TestSlowClientsAreCut: slowloris on the headers, a client that sends
// nothing and a client that stops reading a kernel are each cut, with a
// log line saying why.
func TestSlowClientsAreCut(t *testing.T) {
	lim := Limits{ReadHeaderTimeout: 300 * time.Millisecond, WriteStall: 300 * time.Millisecond}
	for name, tc := range map[string]struct {
		client func(c net.Conn)
		log    string
	}{
		"headers one byte at a time": {
			client: func(c net.Conn) {
				io.WriteString(c, "GET /file HTTP/1.1\r\nHost: x\r\n")
				for range 40 {
					if _, err := io.WriteString(c, "X"); err != nil {
						return
					}
					time.Sleep(50 * time.Millisecond)
				}
			},
			log: "request headers not received within the read-header timeout",
		},
		"connects and sends nothing": {
			client: func(net.Conn) {},
			log:    "request headers not received within the read-header timeout",
		},
		"stops reading the download": {
			client: func(c net.Conn) {
				io.WriteString(c, "GET /file HTTP/1.1\r\nHost: x\r\n\r\n")
			},
			log: "client stopped reading",
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := startLimited(t, lim, 64<<20)
			c := dialFrom(t, s.addr, "127.0.0.1")
			go tc.client(c)
			// Wait without reading: the server must give up on its own.
			time.Sleep(lim.ReadHeaderTimeout + lim.WriteStall)
			if closed, _ := closedWithin(c, 3*time.Second); !closed {
				t.Fatal("connection still open")
			}
			waitLog(t, s.logs, tc.log)
		})
	}
}

// TestLongDownloadIsNotCut: a download that keeps flowing is served whole
// however long it takes, past ReadTimeout and many times WriteStall, and
// its request context stays live.
func TestLongDownloadIsNotCut(t *testing.T) {
	lim := Limits{ReadHeaderTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, WriteStall: 300 * time.Millisecond}
	s := startLimited(t, lim, 24<<20)
	c := dialFrom(t, s.addr, "127.0.0.1")
	io.WriteString(c, "GET /file HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	// About 1.5 s at 16 MB/s: a slow link, shrunk.
	h := sha256.New()
	buf := make([]byte, 64<<10)
	start := time.Now()
	for {
		n, err := resp.Body.Read(buf)
		h.Write(buf[:n])
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("after %s: %v", time.Since(start), err)
		}
		time.Sleep(4 * time.Millisecond)
	}
	if [32]byte(h.Sum(nil)) != sha256.Sum256(s.data) {
		t.Fatal("download differs from the file")
	}
	t.Logf("downloaded %d bytes in %s", len(s.data), time.Since(start).Round(time.Millisecond))
	if err := <-s.ctxErr; err != nil {
		t.Errorf("request context ended during the download: %v", err)
	}
	// The keep-alive connection still serves the next request.
	io.WriteString(c, "HEAD /file HTTP/1.1\r\nHost: x\r\n\r\n")
}

// TestConnectionCaps: over the per-address cap a client reads a 503 naming
// the cap; other addresses are served; after the flood closes, the same
// address is served again.
func TestConnectionCaps(t *testing.T) {
	s := startLimited(t, Limits{MaxConns: 6, MaxConnsPerIP: 3}, 1<<10)
	var flood []net.Conn
	for range 3 {
		flood = append(flood, dialFrom(t, s.addr, "127.0.0.1"))
	}
	get := func(from string) (int, string) {
		c := dialFrom(t, s.addr, from)
		io.WriteString(c, "GET /file HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	waitFor := func(cond func() bool) {
		for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("condition not reached in 5s")
			}
		}
	}
	code, body := 0, ""
	waitFor(func() bool { code, body = get("127.0.0.1"); return code == http.StatusServiceUnavailable })
	if !strings.Contains(body, "too many connections from 127.0.0.1 (limit 3)") {
		t.Errorf("503 body %q does not name the cap", body)
	}
	if code, body := get("127.0.0.2"); code != http.StatusOK {
		t.Errorf("another address: %d %s", code, body)
	}
	for range 3 {
		flood = append(flood, dialFrom(t, s.addr, "127.0.0.3"))
	}
	waitFor(func() bool { code, body = get("127.0.0.4"); return code == http.StatusServiceUnavailable })
	if !strings.Contains(body, "too many connections (limit 6)") {
		t.Errorf("503 body %q does not name the total cap", body)
	}
	waitLog(t, s.logs, "connection refused: limit reached")
	for _, c := range flood {
		c.Close()
	}
	waitFor(func() bool { code, _ := get("127.0.0.1"); return code == http.StatusOK })
}

// TestHeaderTooLarge: net/http answers 431 past MaxHeaderBytes and the
// server logs it.
func TestHeaderTooLarge(t *testing.T) {
	s := startLimited(t, Limits{MaxHeaderBytes: 1 << 10}, 1<<10)
	c := dialFrom(t, s.addr, "127.0.0.1")
	io.WriteString(c, "GET /file HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", 16<<10)+"\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("status %d, want 431", resp.StatusCode)
	}
	waitLog(t, s.logs, "headers over the size limit")
}

func TestLimitsDefaultsAndValidate(t *testing.T) {
	d := DefaultLimits()
	if got := (Limits{MaxConns: 7, ReadTimeout: -1}).WithDefaults(); got.MaxConns != 7 || got.ReadTimeout != d.ReadTimeout || got.MaxConnsPerIP != d.MaxConnsPerIP {
		t.Errorf("WithDefaults = %+v", got)
	}
	for name, tc := range map[string]struct {
		lim  Limits
		want string
	}{
		"zero is the defaults": {lim: Limits{}},
		"defaults":             {lim: d},
		"negative timeout":     {lim: Limits{WriteStall: -time.Second}, want: "--http-write-stall-timeout -1s: want a positive duration"},
		"negative cap":         {lim: Limits{MaxConns: -1}, want: "--http-max-conns -1: want a positive number"},
		"per address above total": {lim: Limits{MaxConns: 4, MaxConnsPerIP: 5},
			want: "--http-max-conns-per-ip 5 is above --http-max-conns 4"},
	} {
		t.Run(name, func(t *testing.T) {
			got := ""
			if err := tc.lim.Validate(); err != nil {
				got = err.Error()
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Validate (-want +got):\n%s", diff)
			}
		})
	}
}

// TestGRUBConnectionsReset: a connection whose request came from GRUB
// (its User-Agent) ends with a reset once GRUB has read its file and
// closed its side, as GRUB does, so no LAST-ACK is left on the
// appliance for a rebooted GRUB's same source port to run into; any
// other client's ends with a FIN.
func TestGRUBConnectionsReset(t *testing.T) {
	s := startLimited(t, Limits{}, 64<<10)
	for ua, reset := range map[string]bool{"GRUB 2.06-13+deb12u1": true, "iPXE/1.21.1+ (g4bd064de)": false, "curl/7.88.1": false} {
		c := dialFrom(t, s.addr, "127.0.0.1")
		fmt.Fprintf(c, "GET /file HTTP/1.1\r\nHost: %s\r\nUser-Agent: %s\r\n\r\n", s.addr, ua)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || !bytes.Equal(body, s.data) {
			t.Fatalf("%s: read %d bytes (%v), want the whole file", ua, len(body), err)
		}
		c.(*net.TCPConn).CloseWrite()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = br.ReadByte()
		if got := errors.Is(err, syscall.ECONNRESET); got != reset {
			t.Errorf("%s: read after closing our side: %v, want a reset: %v", ua, err, reset)
		} else if !reset && err != io.EOF {
			t.Errorf("%s: read after closing our side: %v, want EOF", ua, err)
		}
	}
}
