package appliance

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	hypervisorv1 "github.com/corralhq/corral/api/hypervisor/v1"
	"github.com/corralhq/corral/internal/apierr"
)

// echoSerial is a node's SerialConsole over a VM that echoes its input
// in upper case; refuse, when set, is the status the node answers.
type echoSerial struct {
	hypervisorv1.UnimplementedHypervisorServiceServer
	mu     sync.Mutex
	vms    []string
	refuse error
}

func (e *echoSerial) SerialConsole(s hypervisorv1.HypervisorService_SerialConsoleServer) error {
	first, err := s.Recv()
	if err != nil {
		return err
	}
	e.mu.Lock()
	e.vms = append(e.vms, first.GetVm())
	refuse := e.refuse
	e.mu.Unlock()
	if refuse != nil {
		return refuse
	}
	if err := s.Send(&hypervisorv1.SerialOutput{}); err != nil {
		return err
	}
	for {
		in, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := s.Send(&hypervisorv1.SerialOutput{Data: []byte(strings.ToUpper(string(in.GetData())))}); err != nil {
			return err
		}
	}
}

// serialNodes is the env's dialer with SerialConsole answered by serial.
type serialNodes struct {
	NodeDialer
	serial hypervisorv1.HypervisorServiceClient
}

type serialClient struct {
	hypervisorv1.HypervisorServiceClient
	serial hypervisorv1.HypervisorServiceClient
}

func (c serialClient) SerialConsole(ctx context.Context, opts ...grpc.CallOption) (hypervisorv1.HypervisorService_SerialConsoleClient, error) {
	return c.serial.SerialConsole(ctx, opts...)
}

func (d serialNodes) Hypervisor(ctx context.Context, name string) (hypervisorv1.HypervisorServiceClient, error) {
	c, err := d.NodeDialer.Hypervisor(ctx, name)
	if err != nil {
		return nil, err
	}
	return serialClient{c, d.serial}, nil
}

// lineWriter collects what SerialConsole writes.
type lineWriter struct {
	mu  sync.Mutex
	b   strings.Builder
	got chan struct{}
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b.Write(p)
	select {
	case w.got <- struct{}{}:
	default:
	}
	return len(p), nil
}

func (w *lineWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestSerialConsole: a VM's serial port through its node: the VM is
// named to the node that runs it, keys go there and its output comes
// back, the end of ctx ends the stream without an error; a VM that does
// not exist, or one its node refuses, is an error of the right class.
func TestSerialConsole(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	node := &echoSerial{}
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	hypervisorv1.RegisterHypervisorServiceServer(srv, node)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///node", grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	e.svc.cfg.Nodes = serialNodes{NodeDialer: e.svc.cfg.Nodes, serial: hypervisorv1.NewHypervisorServiceClient(conn)}

	if _, err := e.vm.CreateVirtualMachine(ctx, vmReq("web")); err != nil {
		t.Fatal(err)
	}
	if id, err := e.svc.CheckSerialConsole(ctx, "web"); err != nil || id == "" {
		t.Fatalf("check: %q %v, want the VM's UUID", id, err)
	}
	if _, err := e.svc.CheckSerialConsole(ctx, "nope"); !errors.Is(err, apierr.ErrNotFound) {
		t.Fatalf("check of a VM that does not exist: %v, want NotFound", err)
	}

	keys, typer := io.Pipe()
	out := &lineWriter{got: make(chan struct{}, 1)}
	up := make(chan struct{})
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- e.svc.SerialConsole(sctx, "web", keys, out, func() { close(up) }) }()
	select {
	case <-up:
	case err := <-done:
		t.Fatalf("serial console ended before it was up: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("serial console never up")
	}
	if _, err := typer.Write([]byte("root\r")); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(out.String(), "ROOT\r"); {
		if time.Now().After(deadline) {
			t.Fatalf("output %q, want the echo of the keys", out.String())
		}
		select {
		case <-out.got:
		case <-time.After(100 * time.Millisecond):
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Errorf("serial console after its ctx ended: %v, want nil", err)
	}
	node.mu.Lock()
	named := append([]string(nil), node.vms...)
	node.refuse = status.Error(codes.FailedPrecondition, `vm "web" is not running (shutdown): its serial port is closed`)
	node.mu.Unlock()
	if len(named) != 1 || named[0] != "web" {
		t.Errorf("the node was asked for %q, want web", named)
	}
	err = e.svc.SerialConsole(ctx, "web", strings.NewReader(""), io.Discard, func() { t.Error("up called for a refused console") })
	if !errors.Is(err, apierr.ErrPrecondition) || !strings.Contains(err.Error(), "not running") {
		t.Errorf("a console the node refuses: %v, want FailedPrecondition naming why", err)
	}
}
