package sol_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/ipmi/sol"
	"github.com/corralhq/corral/testsupport/ipmisim"
)

// syncBuffer is a bytes.Buffer safe for a writer and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestStreamIpmiSim proves SOL both ways against OpenIPMI's ipmi_sim,
// whose SOL carries a TCP serial port this test listens on: what the
// "machine" writes to the port reaches out, what goes into in reaches the
// port.
func TestStreamIpmiSim(t *testing.T) {
	lis, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	bmc := ipmisim.Start(t, ipmisim.Options{SOL: "tcp:" + lis.Addr().String()})
	conns := make(chan net.Conn, 1)
	go func() {
		c, err := lis.Accept()
		if err == nil {
			conns <- c
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	inR, inW := io.Pipe()
	defer inW.Close()
	var out syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- sol.Stream(ctx, sol.Target{Host: "127.0.0.1", Port: bmc.Port, Username: bmc.User, Password: bmc.Pass}, inR, &out)
	}()
	var port net.Conn
	select {
	case port = <-conns:
	case err := <-done:
		t.Fatalf("stream ended before ipmi_sim connected to the serial port: %v", err)
	case <-ctx.Done():
		t.Fatal("ipmi_sim never connected to the serial port")
	}
	defer port.Close()
	// Wait until the payload is active: keep writing until it shows.
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(out.String(), "hello from the machine") {
		if time.Now().After(deadline) {
			t.Fatalf("machine output never arrived; got %q", out.String())
		}
		_, _ = port.Write([]byte("hello from the machine\r\n"))
		time.Sleep(300 * time.Millisecond)
	}
	if _, err := inW.Write([]byte("typed keys\r")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 0, 64)
	buf := make([]byte, 64)
	_ = port.SetReadDeadline(time.Now().Add(10 * time.Second))
	for !bytes.Contains(got, []byte("typed keys\r")) {
		n, err := port.Read(buf)
		if err != nil {
			t.Fatalf("serial port read %q: %v", got, err)
		}
		got = append(got, buf[:n]...)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("stream: %v", err)
	}
}

func TestKeepaliveWait(t *testing.T) {
	for elapsed, want := range map[time.Duration]time.Duration{
		0:                        0,
		10 * time.Second:         0,
		29 * time.Second:         3 * time.Second,
		30 * time.Second:         2 * time.Second,
		31 * time.Second:         time.Second,
		32 * time.Second:         0,
		45 * time.Second:         0,
		59500 * time.Millisecond: 2500 * time.Millisecond,
	} {
		if got := sol.KeepaliveWait(elapsed); got != want {
			t.Errorf("KeepaliveWait(%s) = %s, want %s", elapsed, got, want)
		}
	}
}
