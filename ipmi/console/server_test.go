package console

import (
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	consolev1 "github.com/corralhq/corral/api/console/v1"
)

func serve(t *testing.T, h *Hub) consolev1.ConsoleServiceClient {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	Register(srv, &Server{Hub: h})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient("passthrough:///bufnet", grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
		return lis.DialContext(ctx)
	}), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return consolev1.NewConsoleServiceClient(cc)
}

func open(machine string, mode consolev1.ConsoleMode) *consolev1.ConsoleInput {
	return &consolev1.ConsoleInput{Input: &consolev1.ConsoleInput_Open{Open: &consolev1.ConsoleOpen{Machine: machine, Mode: mode}}}
}

func data(s string) *consolev1.ConsoleInput {
	return &consolev1.ConsoleInput{Input: &consolev1.ConsoleInput_Data{Data: []byte(s)}}
}

// endOf reads the stream to its end and returns its status.
func endOf(s consolev1.ConsoleService_AttachClient) *status.Status {
	for {
		if _, err := s.Recv(); err != nil {
			if err == io.EOF {
				return status.New(codes.OK, "")
			}
			return status.Convert(err)
		}
	}
}

func TestAttachRefusals(t *testing.T) {
	h, _ := newHub(t, Config{})
	c := serve(t, h)
	for name, tc := range map[string]struct {
		msgs []*consolev1.ConsoleInput
		code codes.Code
		text string
	}{
		"data from a read-only viewer": {[]*consolev1.ConsoleInput{open("m1", consolev1.ConsoleMode_CONSOLE_MODE_READ_ONLY), data("rm -rf /\r")},
			codes.PermissionDenied, "a console stream from a viewer is refused"},
		"no open first":   {[]*consolev1.ConsoleInput{data("x")}, codes.InvalidArgument, "first message must be open"},
		"no machine":      {[]*consolev1.ConsoleInput{open("", consolev1.ConsoleMode_CONSOLE_MODE_WRITE)}, codes.InvalidArgument, "machine"},
		"no mode":         {[]*consolev1.ConsoleInput{open("m1", consolev1.ConsoleMode_CONSOLE_MODE_UNSPECIFIED)}, codes.InvalidArgument, "mode"},
		"open twice":      {[]*consolev1.ConsoleInput{open("m1", consolev1.ConsoleMode_CONSOLE_MODE_WRITE), open("m2", consolev1.ConsoleMode_CONSOLE_MODE_WRITE)}, codes.InvalidArgument, "opens once"},
		"oversized input": {[]*consolev1.ConsoleInput{open("m1", consolev1.ConsoleMode_CONSOLE_MODE_WRITE), data(strings.Repeat("a", MaxInput+1))}, codes.InvalidArgument, "at most 4096"},
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, err := c.Attach(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range tc.msgs {
				if err := s.Send(m); err != nil {
					break
				}
			}
			st := endOf(s)
			if st.Code() != tc.code || !strings.Contains(st.Message(), tc.text) {
				t.Fatalf("ended with %v %q, want %v containing %q", st.Code(), st.Message(), tc.code, tc.text)
			}
		})
	}
}

func TestAttachRoundTrip(t *testing.T) {
	h, link := newHub(t, Config{})
	c := serve(t, h)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.Attach(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(open("m1", consolev1.ConsoleMode_CONSOLE_MODE_WRITE)); err != nil {
		t.Fatal(err)
	}
	first, err := s.Recv()
	if err != nil || first.GetEvent() != consolev1.ConsoleEvent_CONSOLE_EVENT_ATTACHED || first.GetDetail() != "write" {
		t.Fatalf("first: %v %v", first, err)
	}
	if err := s.Send(data("hello\r")); err != nil {
		t.Fatal(err)
	}
	if got := <-link.keys; string(got) != "hello\r" {
		t.Fatalf("machine got %q", got)
	}
	link.print(t, "m1", "hello back")
	var got strings.Builder
	for !strings.Contains(got.String(), "hello back") {
		o, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		got.Write(o.GetData())
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if st := endOf(s); st.Code() != codes.OK {
		t.Fatalf("close: %v", st)
	}
	waitFor(t, "viewer gone", func() bool { n, _ := h.Viewers("m1"); return n == 0 })
}

// TestAttachTargets: open names a machine or a VM, each served by its
// hub; both, or a VM where no VM hub is configured, are refused, and a
// name on one hub is another session than the same name on the other.
func TestAttachTargets(t *testing.T) {
	machines, mlink := newHub(t, Config{})
	vms, vlink := newHub(t, Config{Kind: "virtual machine"})
	serveWith := func(s *Server) consolev1.ConsoleServiceClient {
		t.Helper()
		lis := bufconn.Listen(1 << 20)
		srv := grpc.NewServer()
		Register(srv, s)
		go func() { _ = srv.Serve(lis) }()
		t.Cleanup(srv.Stop)
		cc, err := grpc.NewClient("passthrough:///bufnet", grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return lis.DialContext(ctx)
		}), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return consolev1.NewConsoleServiceClient(cc)
	}
	vmOpen := func(name string, mode consolev1.ConsoleMode) *consolev1.ConsoleInput {
		return &consolev1.ConsoleInput{Input: &consolev1.ConsoleInput_Open{Open: &consolev1.ConsoleOpen{Vm: name, Mode: mode}}}
	}
	attach := func(c consolev1.ConsoleServiceClient, msgs ...*consolev1.ConsoleInput) consolev1.ConsoleService_AttachClient {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t.Cleanup(cancel)
		s, err := c.Attach(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if err := s.Send(m); err != nil {
				break
			}
		}
		return s
	}
	both := serveWith(&Server{Hub: machines, VMs: vms})
	machinesOnly := serveWith(&Server{Hub: machines})
	vmsOnly := serveWith(&Server{VMs: vms})

	for name, tc := range map[string]struct {
		c    consolev1.ConsoleServiceClient
		msg  *consolev1.ConsoleInput
		code codes.Code
		text string
	}{
		"machine and vm": {both, &consolev1.ConsoleInput{Input: &consolev1.ConsoleInput_Open{Open: &consolev1.ConsoleOpen{Machine: "m1", Vm: "v1",
			Mode: consolev1.ConsoleMode_CONSOLE_MODE_WRITE}}}, codes.InvalidArgument, "not both"},
		"vm without a vm hub":           {machinesOnly, vmOpen("v1", consolev1.ConsoleMode_CONSOLE_MODE_WRITE), codes.FailedPrecondition, "virtual machines"},
		"machine without a machine hub": {vmsOnly, open("m1", consolev1.ConsoleMode_CONSOLE_MODE_WRITE), codes.FailedPrecondition, "no BMC service"},
		"vm name too long":              {both, vmOpen(strings.Repeat("v", 254), consolev1.ConsoleMode_CONSOLE_MODE_WRITE), codes.InvalidArgument, "253"},
	} {
		t.Run(name, func(t *testing.T) {
			st := endOf(attach(tc.c, tc.msg))
			if st.Code() != tc.code || !strings.Contains(st.Message(), tc.text) {
				t.Fatalf("ended with %v %q, want %v containing %q", st.Code(), st.Message(), tc.code, tc.text)
			}
		})
	}

	// The same name as a machine and as a VM: two sessions, two writers.
	m := attach(both, open("x1", consolev1.ConsoleMode_CONSOLE_MODE_WRITE))
	v := attach(both, vmOpen("x1", consolev1.ConsoleMode_CONSOLE_MODE_WRITE))
	for _, s := range []consolev1.ConsoleService_AttachClient{m, v} {
		if o, err := s.Recv(); err != nil || o.GetDetail() != "write" {
			t.Fatalf("attach: %v %v, want write granted", o, err)
		}
	}
	if err := v.Send(data("to the vm\r")); err != nil {
		t.Fatal(err)
	}
	if got := <-vlink.keys; string(got) != "to the vm\r" {
		t.Fatalf("the VM got %q", got)
	}
	select {
	case got := <-mlink.keys:
		t.Fatalf("the machine got the VM's keys %q", got)
	default:
	}
	// A second VM writer is refused in the VM hub's words.
	st := endOf(attach(both, vmOpen("x1", consolev1.ConsoleMode_CONSOLE_MODE_WRITE)))
	if st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), `virtual machine "x1"'s console has a writer`) {
		t.Fatalf("second VM writer: %v %q", st.Code(), st.Message())
	}
}
