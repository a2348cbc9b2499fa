package connlimit

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// server accepts on a limited loopback listener and keeps every accepted
// connection until the test ends (or release is called).
type server struct {
	l     *Listener
	mu    sync.Mutex
	conns []net.Conn
	got   chan net.Conn
}

func listen(t *testing.T, cfg Config) *server {
	t.Helper()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{l: New(raw, cfg), got: make(chan net.Conn, 64)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := s.l.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			s.got <- c
		}
	}()
	t.Cleanup(func() {
		s.l.Close()
		<-done
		s.release()
	})
	return s
}

func (s *server) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		c.Close()
	}
	s.conns = nil
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

// refused says whether the server closed c instead of handing it out:
// the accept loop either passes it on (s.got) or the client sees EOF or a
// reset (after whatever Refuse wrote). It returns what the client read.
func (s *server) refused(t *testing.T, c net.Conn) (bool, string) {
	t.Helper()
	type result struct {
		b   []byte
		err error
	}
	read := make(chan result, 1)
	go func() {
		b, err := io.ReadAll(c)
		read <- result{b, err}
	}()
	select {
	case <-s.got:
		return false, ""
	case r := <-read:
		return true, string(r.b)
	case <-time.After(5 * time.Second):
		t.Fatal("connection neither handed out nor closed in 5s")
		return false, ""
	}
}

func TestCaps(t *testing.T) {
	for name, tc := range map[string]struct {
		cfg   Config
		from  []string // one connection per entry, in order
		want  []bool   // refused?
		after string   // a connection from here after the others closed is kept
	}{
		"total cap": {
			cfg:  Config{MaxConns: 3},
			from: []string{"127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.1"},
			want: []bool{false, false, false, true, true}, after: "127.0.0.4",
		},
		"per address cap": {
			cfg:  Config{MaxConnsPerIP: 2},
			from: []string{"127.0.0.1", "127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.2", "127.0.0.2"},
			want: []bool{false, false, true, false, false, true}, after: "127.0.0.1",
		},
		"both": {
			cfg:  Config{MaxConns: 4, MaxConnsPerIP: 2},
			from: []string{"127.0.0.1", "127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.2", "127.0.0.3"},
			want: []bool{false, false, true, false, false, true}, after: "127.0.0.3",
		},
		"no caps": {
			from: []string{"127.0.0.1", "127.0.0.1", "127.0.0.1"},
			want: []bool{false, false, false}, after: "127.0.0.1",
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := listen(t, tc.cfg)
			addr := s.l.Addr().String()
			var got []bool
			for _, from := range tc.from {
				c := dialFrom(t, addr, from)
				r, _ := s.refused(t, c)
				got = append(got, r)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Fatalf("refused (-want +got):\n%s", diff)
			}
			s.release()
			waitFor(t, func() bool { return s.l.Open() == 0 })
			if r, _ := s.refused(t, dialFrom(t, addr, tc.after)); r {
				t.Fatalf("a connection from %s after the others closed was refused", tc.after)
			}
			if n := s.l.OpenFrom(netip.MustParseAddr(tc.after)); n != 1 {
				t.Fatalf("OpenFrom(%s) = %d, want 1", tc.after, n)
			}
		})
	}
}

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !ok(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 5s")
		}
	}
}

func TestRefuseWritesReason(t *testing.T) {
	s := listen(t, Config{MaxConnsPerIP: 1, Refuse: func(c net.Conn, reason string) {
		io.WriteString(c, "busy: "+reason+"\n")
	}})
	dialFrom(t, s.l.Addr().String(), "127.0.0.1")
	<-s.got
	r, msg := s.refused(t, dialFrom(t, s.l.Addr().String(), "127.0.0.1"))
	if !r || msg != "busy: too many connections from 127.0.0.1 (limit 1)\n" {
		t.Fatalf("refused %v, message %q", r, msg)
	}
}

func TestCloseReleasesOnce(t *testing.T) {
	s := listen(t, Config{MaxConns: 2})
	dialFrom(t, s.l.Addr().String(), "127.0.0.1")
	c := <-s.got
	for range 3 {
		c.Close()
	}
	if n := s.l.Open(); n != 0 {
		t.Fatalf("Open = %d after closing the only connection three times", n)
	}
}

// pair returns a limited server-side conn and the client's end.
func pair(t *testing.T, cfg Config) (*Conn, net.Conn) {
	t.Helper()
	s := listen(t, cfg)
	client := dialFrom(t, s.l.Addr().String(), "127.0.0.1")
	return (<-s.got).(*Conn), client
}

func bigFile(t *testing.T, size int) (*os.File, []byte) {
	t.Helper()
	b := bytes.Repeat([]byte("corral-sendfile-"), size/16)
	p := filepath.Join(t.TempDir(), "big")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, b
}

// TestWriteStall: a client that reads nothing is cut after WriteStall,
// through Write and through ReadFrom (sendfile); a client that keeps
// reading gets everything, however long it takes in total.
func TestWriteStall(t *testing.T) {
	const size = 32 << 20
	stall := 300 * time.Millisecond
	for name, send := range map[string]func(c *Conn, f *os.File, b []byte) (int64, error){
		"write": func(c *Conn, _ *os.File, b []byte) (int64, error) { n, err := c.Write(b); return int64(n), err },
		"sendfile": func(c *Conn, f *os.File, _ []byte) (int64, error) {
			return c.ReadFrom(&io.LimitedReader{R: f, N: size})
		},
	} {
		t.Run(name+"/stopped reader is cut", func(t *testing.T) {
			f, b := bigFile(t, size)
			srv, _ := pair(t, Config{WriteStall: stall, Name: "test"})
			start := time.Now()
			n, err := send(srv, f, b)
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("sent %d bytes, err %v: want a deadline error", n, err)
			}
			if n >= size {
				t.Fatalf("sent everything (%d bytes) to a client that reads nothing", n)
			}
			t.Logf("cut after %d bytes in %s", n, time.Since(start).Round(time.Millisecond))
		})
		t.Run(name+"/steady reader completes", func(t *testing.T) {
			f, b := bigFile(t, size)
			srv, client := pair(t, Config{WriteStall: stall})
			sum := make(chan [32]byte, 1)
			go func() {
				h := sha256.New()
				// Read slowly but steadily: 256 KiB every 20 ms.
				buf := make([]byte, 256<<10)
				for total := 0; total < size; {
					n, err := io.ReadFull(client, buf[:min(len(buf), size-total)])
					h.Write(buf[:n])
					total += n
					if err != nil {
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
				sum <- [32]byte(h.Sum(nil))
			}()
			n, err := send(srv, f, b)
			if err != nil || n != size {
				t.Fatalf("sent %d of %d bytes: %v", n, size, err)
			}
			if got := <-sum; got != sha256.Sum256(b) {
				t.Fatal("the client received different bytes")
			}
		})
	}
}

// TestReadFromKeepsLimitedReaderContract: the LimitedReader http.ServeContent
// passes ends with N reduced by what was sent.
func TestReadFromKeepsLimitedReaderContract(t *testing.T) {
	f, b := bigFile(t, 1<<20)
	srv, client := pair(t, Config{WriteStall: time.Second})
	got := make(chan []byte, 1)
	go func() { r, _ := io.ReadAll(io.LimitReader(client, 700_000)); got <- r }()
	lr := &io.LimitedReader{R: f, N: 700_000}
	n, err := srv.ReadFrom(lr)
	if err != nil || n != 700_000 || lr.N != 0 {
		t.Fatalf("ReadFrom = %d, %v; N left %d", n, err, lr.N)
	}
	if r := <-got; !bytes.Equal(r, b[:700_000]) {
		t.Fatal("wrong bytes")
	}
	// Without a LimitedReader the source is read to its end.
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	go func() { r, _ := io.ReadAll(io.LimitReader(client, int64(len(b)))); got <- r }()
	if n, err := srv.ReadFrom(strings.NewReader(string(b))); err != nil || n != int64(len(b)) {
		t.Fatalf("ReadFrom(reader) = %d, %v", n, err)
	}
	if r := <-got; !bytes.Equal(r, b) {
		t.Fatal("wrong bytes from a plain reader")
	}
}

// TestResetOnClose: a marked connection whose writes were all
// acknowledged ends with a reset (the client reads ECONNRESET, and no
// socket of its 4-tuple is left on the server's side), an unmarked one
// with a FIN (EOF); a marked one that half-closed first, or whose peer
// has not acknowledged everything, ends with a FIN too, and the client
// then reads every byte written before EOF.
func TestResetOnClose(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("SIOCOUTQ is Linux's")
	}
	end := func(c net.Conn) (int, error) {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, err := io.ReadAll(c)
		return len(b), err
	}
	for _, tc := range []struct {
		name             string
		mark, closeWrite bool
		reset            bool
	}{
		{"marked", true, false, true},
		{"unmarked", false, false, false},
		{"marked, half-closed first", true, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, client := pair(t, Config{})
			if _, err := srv.Write([]byte("answer")); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 6)
			if _, err := io.ReadFull(client, buf); err != nil {
				t.Fatal(err)
			}
			// The client's kernel acknowledges what it received.
			waitFor(t, func() bool { n, err := unacked(srv.Conn.(*net.TCPConn)); return err == nil && n == 0 })
			if tc.mark {
				srv.ResetOnClose()
			}
			if tc.closeWrite {
				srv.CloseWrite()
			}
			local, remote := srv.LocalAddr().String(), srv.RemoteAddr().String()
			srv.Close()
			_, err := end(client)
			if got := errors.Is(err, syscall.ECONNRESET); got != tc.reset {
				t.Fatalf("client's read after the server's close: %v, want a reset: %v", err, tc.reset)
			}
			if tc.reset && serverSocketLeft(t, local, remote) {
				t.Errorf("a socket %s-%s is left on the server's side after the reset", local, remote)
			}
		})
	}
	t.Run("marked, unacknowledged data", func(t *testing.T) {
		s := listen(t, Config{})
		d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
			return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		}}
		client, err := d.Dial("tcp", s.l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		srv := (<-s.got).(*Conn)
		srv.Conn.(*net.TCPConn).SetWriteBuffer(64 << 10)
		// The client reads nothing: the write fills its window and stops.
		srv.SetWriteDeadline(time.Now().Add(300 * time.Millisecond))
		n, _ := srv.Write(bytes.Repeat([]byte("x"), 8<<20))
		if q, err := unacked(srv.Conn.(*net.TCPConn)); err != nil || q == 0 {
			t.Fatalf("unacknowledged bytes %d (%v): the test needs some", q, err)
		}
		srv.ResetOnClose()
		srv.Close()
		got, err := end(client)
		if err != nil || got != n {
			t.Errorf("client read %d bytes then %v, want all %d then EOF", got, err, n)
		}
	})
}

// serverSocketLeft says whether /proc/net/tcp still lists a socket with
// local address local and peer remote (both "127.0.0.1:port").
func serverSocketLeft(t *testing.T, local, remote string) bool {
	t.Helper()
	hex := func(a string) string {
		ap := netip.MustParseAddrPort(a)
		b := ap.Addr().As4()
		return fmt.Sprintf("%02X%02X%02X%02X:%04X", b[3], b[2], b[1], b[0], ap.Port())
	}
	want := hex(local) + " " + hex(remote)
	raw, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) > 3 && f[1]+" "+f[2] == want {
			return true
		}
	}
	return false
}
