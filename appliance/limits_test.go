package appliance

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/corralhq/corral/api/clientconfig"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	boothttp "github.com/corralhq/corral/boot/http"
	"github.com/corralhq/corral/boot/tftp"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/testsupport/syncbuf"
)

// startLimited runs the appliance with lim on a loopback port and returns
// its admin config and its log.
func startLimited(t *testing.T, lim LimitsConfig) (*Server, *clientconfig.Config, *syncbuf.Buffer) {
	t.Helper()
	logs := &syncbuf.Buffer{}
	dir := t.TempDir()
	srv, err := New(Config{DataDir: dir, APIListen: "127.0.0.1:0", Logger: slog.New(slog.NewTextHandler(logs, nil)), Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		if t.Failed() {
			t.Logf("server logs:\n%s", logs)
		}
	})
	cc, err := clientconfig.Load(filepath.Join(dir, AdminConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	return srv, cc, logs
}

// TestGRPCMessageLimit: a request over the size limit is ResourceExhausted
// (and logged); the server, and the same connection, keep serving.
func TestGRPCMessageLimit(t *testing.T) {
	_, cc, logs := startLimited(t, LimitsConfig{GRPC: GRPCLimits{MaxRecvMsgBytes: 64 << 10}})
	nodes := poolv1.NewNodeServiceClient(dial(t, cc, ""))
	ctx := context.Background()
	big := &poolv1.ApplyNodeRequest{Name: "n1", CpuMilliCores: 1000, MemoryBytes: gib, Annotations: map[string]string{"blob": strings.Repeat("x", 100<<10)}}
	_, err := nodes.ApplyNode(ctx, big)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("ApplyNode with a 100 KiB annotation: %v, want ResourceExhausted", err)
	}
	if _, err := nodes.ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: "n1", CpuMilliCores: 1000, MemoryBytes: gib}); err != nil {
		t.Fatalf("a normal call after the refusal: %v", err)
	}
	if !strings.Contains(logs.String(), "grpc call refused: limit reached") || !strings.Contains(logs.String(), "ApplyNode") {
		t.Errorf("no log line naming the method:\n%s", logs)
	}
}

// TestGRPCConnectionLimits: raw TCP connections that never handshake hold
// the per-address slots until the handshake timeout closes them; over the
// cap a connection is closed at once; then a real client is served.
func TestGRPCConnectionLimits(t *testing.T) {
	srv, cc, logs := startLimited(t, LimitsConfig{GRPC: GRPCLimits{MaxConnsPerIP: 2, HandshakeTimeout: 700 * time.Millisecond}})
	addr := srv.Addr().String()
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	time.Sleep(100 * time.Millisecond) // let the server accept them
	over, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer over.Close()
	over.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := over.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("third connection from one address: read %v, want it closed at once", err)
	}
	// The held connections are cut by the handshake timeout.
	for _, c := range held {
		c.SetReadDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Read(make([]byte, 1)); isTimeout(err) {
			t.Fatal("a connection that never handshakes is still open after the handshake timeout")
		}
	}
	nodes := poolv1.NewNodeServiceClient(dial(t, cc, ""))
	if _, err := nodes.ListNodes(context.Background(), &poolv1.ListNodesRequest{}); err != nil {
		t.Fatalf("a real client after the holders were cut: %v", err)
	}
	if !strings.Contains(logs.String(), "connection refused: limit reached") {
		t.Errorf("no log line for the refused connection:\n%s", logs)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

func TestLimitsConfigDefaultsAndErrors(t *testing.T) {
	var zero LimitsConfig
	if err := zero.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(DefaultGRPCLimits(), zero.GRPC); diff != "" {
		t.Errorf("gRPC defaults (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(DefaultTimelineLimits(), zero.Timeline); diff != "" {
		t.Errorf("timeline defaults (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(inventory.DefaultFactCaps, zero.Reports); diff != "" {
		t.Errorf("report caps defaults (-want +got):\n%s", diff)
	}
	if zero.HTTP.MaxConns == 0 || zero.TFTP.MaxTransfers == 0 {
		t.Errorf("boot limits not filled: %+v %+v", zero.HTTP, zero.TFTP)
	}
	for name, tc := range map[string]struct {
		cfg  LimitsConfig
		want string
	}{
		"negative message size":  {cfg: LimitsConfig{GRPC: GRPCLimits{MaxRecvMsgBytes: -1}}, want: "--grpc-max-recv-bytes -1: want a positive number"},
		"negative keepalive":     {cfg: LimitsConfig{GRPC: GRPCLimits{KeepaliveTime: -time.Second}}, want: "--grpc-keepalive-time -1s: want a positive duration"},
		"per address over total": {cfg: LimitsConfig{GRPC: GRPCLimits{MaxConns: 10, MaxConnsPerIP: 11}}, want: "--grpc-max-conns-per-ip 11 is above --grpc-max-conns 10"},
		"timeline total below per MAC": {cfg: LimitsConfig{Timeline: TimelineLimits{PerMAC: 100, MaxEntries: 50}},
			want: "--timeline-max-entries 50 is below --timeline-per-mac 100"},
		"one attribute":       {cfg: LimitsConfig{Timeline: TimelineLimits{Attrs: 1}}, want: "--timeline-max-attrs 1: at least 2 (one says how many were cut)"},
		"http":                {cfg: LimitsConfig{HTTP: httpLimits(-5)}, want: "--http-max-conns -5: want a positive number"},
		"tftp":                {cfg: LimitsConfig{TFTP: tftpLimits(-1)}, want: "--tftp-retries -1: want a positive number"},
		"negative report cap": {cfg: LimitsConfig{Reports: inventory.FactCaps{NICs: -1}}, want: "--max-report-nics -1: want a positive number"},
		"report bytes over the ceiling": {cfg: LimitsConfig{Reports: inventory.FactCaps{ReportBytes: inventory.MaxFactsBytes + 1}},
			want: fmt.Sprintf("--max-report-bytes %d: at most %d", inventory.MaxFactsBytes+1, inventory.MaxFactsBytes)},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.cfg.setDefaults()
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tc.want {
				t.Errorf("setDefaults = %q, want %q", got, tc.want)
			}
		})
	}
}

func httpLimits(maxConns int) (l boothttp.Limits) { l.MaxConns = maxConns; return l }

func tftpLimits(retries int) (l tftp.Limits) { l.Retries = retries; return l }

// TestGRPCKeepaliveCutsDeadPeer: a client whose packets stop arriving (a
// machine that died mid-session) is pinged after KeepaliveTime and cut
// after KeepaliveTimeout more, freeing its session and its slots.
func TestGRPCKeepaliveCutsDeadPeer(t *testing.T) {
	srv, cc, _ := startLimited(t, LimitsConfig{GRPC: GRPCLimits{KeepaliveTime: time.Second, KeepaliveTimeout: time.Second, KeepaliveMinTime: time.Second}})
	// A proxy in front of the server that can go silent.
	front, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer front.Close()
	dead := make(chan struct{})
	upstreamClosed := make(chan time.Time, 1)
	go func() {
		down, err := front.Accept()
		if err != nil {
			return
		}
		defer down.Close()
		up, err := net.Dial("tcp", srv.Addr().String())
		if err != nil {
			return
		}
		defer up.Close()
		go func() {
			// Client → server until the client "dies", then nothing.
			buf := make([]byte, 32<<10)
			for {
				n, err := down.Read(buf)
				if err != nil {
					return
				}
				select {
				case <-dead:
					continue
				default:
				}
				up.Write(buf[:n])
			}
		}()
		// Server → client until the server closes the connection.
		buf := make([]byte, 32<<10)
		for {
			n, err := up.Read(buf)
			if err != nil {
				upstreamClosed <- time.Now()
				return
			}
			select {
			case <-dead:
			default:
				down.Write(buf[:n])
			}
		}
	}()
	c := *cc
	c.Endpoint = front.Addr().String()
	conn, err := clientconfig.Dial(&c)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := poolv1.NewNodeServiceClient(conn).ListNodes(context.Background(), &poolv1.ListNodesRequest{}); err != nil {
		t.Fatal(err)
	}
	died := time.Now()
	close(dead)
	select {
	case at := <-upstreamClosed:
		t.Logf("the server closed the dead peer's connection %s after it went silent", at.Sub(died).Round(100*time.Millisecond))
	case <-time.After(20 * time.Second):
		t.Fatal("the server kept a dead peer's connection for 20 s with keepalive 1 s + 1 s")
	}
}
