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
