package main

// Attack tests for the resource limits (docs/security.md, "Every resource bounded"): the built
// corrald with its boot servers on loopback (--boot-interface lo,
// --dhcp-mode off) and small limits, attacked with raw TCP, HTTP, TFTP
// packets and a real gRPC client over TLS. Each attack is refused with a
// clear answer and a log line, and a legitimate client is served after.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/corralhq/corral/api/clientconfig"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/testsupport/require"
	"github.com/corralhq/corral/testsupport/syncbuf"
)

// limitedCorrald is corrald serving the API, boot HTTP and TFTP on
// loopback with the attack tests' small limits.
type limitedCorrald struct {
	api, http, tftp string
	dataDir         string
	logs            *syncbuf.Buffer
}

// The limits the attacks run against: small, so that each attack takes
// seconds.
var attackLimitFlags = []string{
	"--http-read-header-timeout", "2s", "--http-write-stall-timeout", "1s",
	"--http-max-conns", "8", "--http-max-conns-per-ip", "4",
	"--tftp-timeout", "1s", "--tftp-retries", "3", "--tftp-max-transfers-per-ip", "2",
	"--grpc-max-recv-bytes", "65536", "--grpc-max-conns-per-ip", "4", "--grpc-handshake-timeout", "2s",
}

func freeUDPPort(t *testing.T) string {
	t.Helper()
	c, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().String()
}

func startLimitedCorrald(t *testing.T) *limitedCorrald {
	t.Helper()
	needE2E(t)
	require.File(t, "/usr/lib/ipxe/ipxe.efi", "iPXE binaries (Debian package ipxe)")
	c := &limitedCorrald{api: freePort(t), http: freePort(t), tftp: freeUDPPort(t), dataDir: t.TempDir(), logs: &syncbuf.Buffer{}}
	// An initramfs larger than loopback's socket buffers, so that a client
	// that stops reading blocks the server.
	initrd := filepath.Join(t.TempDir(), "initrd.img")
	if err := os.WriteFile(initrd, bytes.Repeat([]byte("corral-initramfs"), (64<<20)/16), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"serve", "--data-dir", c.dataDir, "--api-listen", c.api, "--boot-interface", "lo", "--dhcp-mode", "off", "--no-ra",
		"--http-listen", c.http, "--tftp-listen", c.tftp, "--boot-initrd", initrd, "--allow-test-images"}, attackLimitFlags...)
	cmd := exec.Command(filepath.Join(binDir, "corrald"), args...)
	cmd.Stdout, cmd.Stderr = c.logs, c.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("corrald logs:\n%s", c.logs)
		}
	})
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		l := c.logs.String()
		if strings.Contains(l, "serving gRPC API") && strings.Contains(l, "serving boot HTTP") && strings.Contains(l, "serving TFTP") {
			return c
		}
		select {
		case err := <-exited:
			exited <- err // for the cleanup, which waits for it
			t.Fatalf("corrald exited early: %v\n%s", err, c.logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("corrald did not start in 60s\n%s", c.logs)
		}
	}
}

func (c *limitedCorrald) waitLog(t *testing.T, want string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(c.logs.String(), want); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("corrald logged no %q", want)
		}
	}
}

func dialFrom(t *testing.T, addr, from string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedBy reports whether the server closed c before deadline (EOF or a
// reset, not a read timeout), with the bytes read until then.
func closedBy(c net.Conn, deadline time.Time) (bool, []byte) {
	c.SetReadDeadline(deadline)
	b, err := io.ReadAll(c)
	ne, ok := err.(net.Error)
	return !(ok && ne.Timeout()), b
}

// get fetches path from the boot HTTP server from a loopback address.
func (c *limitedCorrald) get(t *testing.T, from, path string) (int, []byte) {
	t.Helper()
	conn := dialFrom(t, c.http, from)
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path, c.http)
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func TestAttackLimits(t *testing.T) {
	c := startLimitedCorrald(t)
	ipxe, err := os.ReadFile("/usr/lib/ipxe/ipxe.efi")
	if err != nil {
		t.Fatal(err)
	}

	t.Run("http slowloris headers are cut", func(t *testing.T) {
		conn := dialFrom(t, c.http, "127.0.0.10")
		io.WriteString(conn, "GET /images/ipxe.efi HTTP/1.1\r\nHost: x\r\n")
		stop := make(chan struct{})
		defer close(stop)
		go func() { // one header byte every 200 ms, for 20 s if allowed
			for range 100 {
				select {
				case <-stop:
					return
				case <-time.After(200 * time.Millisecond):
				}
				if _, err := io.WriteString(conn, "X"); err != nil {
					return
				}
			}
		}()
		if closed, _ := closedBy(conn, time.Now().Add(15*time.Second)); !closed {
			t.Fatal("a client trickling its headers was not cut")
		}
		c.waitLog(t, "request headers not received within the read-header timeout")
	})

	t.Run("http connection flood is refused, then a legit request is served", func(t *testing.T) {
		var flood []net.Conn
		for range 4 { // the per-address cap
			flood = append(flood, dialFrom(t, c.http, "127.0.0.20"))
		}
		code, body := 0, []byte(nil)
		for deadline := time.Now().Add(5 * time.Second); code != http.StatusServiceUnavailable; time.Sleep(50 * time.Millisecond) {
			if code, body = c.get(t, "127.0.0.20", "/images/ipxe.efi"); time.Now().After(deadline) {
				t.Fatalf("a fifth connection from one address: %d %s, want 503", code, body)
			}
		}
		if !strings.Contains(string(body), "too many connections from 127.0.0.20 (limit 4)") {
			t.Errorf("503 body %q does not name the cap", body)
		}
		for range 4 { // the total cap: 8
			flood = append(flood, dialFrom(t, c.http, "127.0.0.21"))
		}
		if code, body = c.get(t, "127.0.0.22", "/images/ipxe.efi"); code != http.StatusServiceUnavailable || !strings.Contains(string(body), "too many connections (limit 8)") {
			t.Errorf("a connection over the total: %d %s, want 503 naming the total", code, body)
		}
		c.waitLog(t, "connection refused: limit reached")
		for _, f := range flood {
			f.Close()
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			code, body = c.get(t, "127.0.0.20", "/images/ipxe.efi")
			if code == http.StatusOK {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after the flood closed: %d %s", code, body)
			}
		}
		if !bytes.Equal(body, ipxe) {
			t.Errorf("served %d bytes, want ipxe.efi's %d", len(body), len(ipxe))
		}
	})

	t.Run("http client that stops reading a download is cut", func(t *testing.T) {
		conn := dialFrom(t, c.http, "127.0.0.30")
		io.WriteString(conn, "GET /images/initrd.img HTTP/1.1\r\nHost: x\r\n\r\n")
		// Read nothing for a while: the server fills the socket buffers,
		// its write stalls and it cuts the connection.
		c.waitLog(t, "connection cut: client stopped reading")
		closed, b := closedBy(conn, time.Now().Add(30*time.Second))
		if !closed {
			t.Fatal("the connection is still open")
		}
		if len(b) >= 64<<20 {
			t.Fatalf("a client that stopped reading got all %d bytes", len(b))
		}
		t.Logf("the stalled client got %d of %d bytes before the cut", len(b), 64<<20)
	})

	t.Run("tftp transfers over the per-client cap get an error packet", func(t *testing.T) {
		for range 2 { // held: DATA 1 never acknowledged
			if p := tftpRRQ(t, c.tftp, "127.0.0.40", "ipxe.efi"); p.op != 3 {
				t.Fatalf("a transfer within the cap: %+v, want DATA", p)
			}
		}
		p := tftpRRQ(t, c.tftp, "127.0.0.40", "ipxe.efi")
		if p.op != 5 || p.msg != "too many transfers from 127.0.0.40 (limit 2), retry later" {
			t.Fatalf("third transfer from one address: %+v, want an ERROR packet naming the cap", p)
		}
		if p := tftpRRQ(t, c.tftp, "127.0.0.41", "ipxe.efi"); p.op != 3 {
			t.Errorf("another address: %+v, want DATA", p)
		}
		c.waitLog(t, "tftp transfer refused: limit reached")
	})

	t.Run("grpc message over the limit is ResourceExhausted and the server keeps serving", func(t *testing.T) {
		cc, err := clientconfig.Load(filepath.Join(c.dataDir, "admin.conf"))
		if err != nil {
			t.Fatal(err)
		}
		conn, err := clientconfig.Dial(cc)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		nodes := poolv1.NewNodeServiceClient(conn)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err = nodes.ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: "n1", CpuMilliCores: 1000, MemoryBytes: 1 << 30,
			Annotations: map[string]string{"blob": strings.Repeat("x", 100<<10)}})
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("a 100 KiB request: %v, want ResourceExhausted", err)
		}
		if _, err := nodes.ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: "n1", CpuMilliCores: 1000, MemoryBytes: 1 << 30}); err != nil {
			t.Fatalf("the next call on the same connection: %v", err)
		}
		c.waitLog(t, "grpc call refused: limit reached")
	})

	t.Run("grpc connection flood is refused, then a legit client is served", func(t *testing.T) {
		var flood []net.Conn
		for range 4 { // never handshake
			flood = append(flood, dialFrom(t, c.api, "127.0.0.50"))
		}
		var closed bool
		for deadline := time.Now().Add(5 * time.Second); !closed; time.Sleep(50 * time.Millisecond) {
			over := dialFrom(t, c.api, "127.0.0.50")
			closed, _ = closedBy(over, time.Now().Add(500*time.Millisecond))
			if !closed && time.Now().After(deadline) {
				t.Fatal("a fifth connection from one address was kept")
			}
		}
		// The handshake timeout cuts the flood.
		for _, f := range flood {
			if closed, _ := closedBy(f, time.Now().Add(15*time.Second)); !closed {
				t.Fatal("a connection that never handshakes outlived the handshake timeout")
			}
		}
		cc, err := clientconfig.Load(filepath.Join(c.dataDir, "admin.conf"))
		if err != nil {
			t.Fatal(err)
		}
		cc.Endpoint = c.api
		conn, err := clientconfig.Dial(cc)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := poolv1.NewNodeServiceClient(conn).ListNodes(ctx, &poolv1.ListNodesRequest{}); err != nil {
			t.Fatalf("a legit client after the flood: %v", err)
		}
	})
}

// tftpPacket is a TFTP answer: DATA (op 3) or ERROR (op 5, msg).
type tftpPacket struct {
	op  uint16
	msg string
}

// tftpRRQ sends a read request from a fresh socket on from and returns
// the first answer; the socket stays open (and silent) until the test
// ends, so a DATA answer leaves the transfer waiting for an ACK.
func tftpRRQ(t *testing.T, server, from, file string) tftpPacket {
	t.Helper()
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(from)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	addr, err := net.ResolveUDPAddr("udp4", server)
	if err != nil {
		t.Fatal(err)
	}
	rrq := append(append([]byte{0, 1}, file...), 0)
	rrq = append(append(rrq, "octet"...), 0)
	if _, err := conn.WriteToUDP(rrq, addr); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2048)
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, _, err := conn.ReadFromUDP(buf)
	if err != nil || n < 4 {
		t.Fatalf("no TFTP answer from %s: %v", server, err)
	}
	p := tftpPacket{op: binary.BigEndian.Uint16(buf)}
	if p.op == 5 {
		p.msg = string(bytes.TrimRight(buf[4:n], "\x00"))
	}
	return p
}
