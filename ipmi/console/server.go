package console

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	consolev1 "github.com/corralhq/corral/api/console/v1"
	"github.com/corralhq/corral/internal/apierr"
)

// Server is ConsoleService over a Hub.
type Server struct {
	consolev1.UnimplementedConsoleServiceServer
	Hub *Hub
	// VMs is the hub of virtual machines' consoles (ConsoleOpen.vm); nil:
	// they are not served here (FailedPrecondition).
	VMs *Hub
	// Who names the caller of ctx to other viewers (nil: "another
	// viewer").
	Who func(ctx context.Context) string
}

// Register serves s on r.
func Register(r grpc.ServiceRegistrar, s *Server) {
	consolev1.RegisterConsoleServiceServer(r, s)
}

var events = map[Event]consolev1.ConsoleEvent{
	EventAttached:   consolev1.ConsoleEvent_CONSOLE_EVENT_ATTACHED,
	EventLive:       consolev1.ConsoleEvent_CONSOLE_EVENT_LIVE,
	EventWriteTaken: consolev1.ConsoleEvent_CONSOLE_EVENT_WRITE_TAKEN,
	EventLinkDown:   consolev1.ConsoleEvent_CONSOLE_EVENT_LINK_DOWN,
	EventLinkUp:     consolev1.ConsoleEvent_CONSOLE_EVENT_LINK_UP,
}

// Attach serves one viewer: its first message opens, its data goes to the
// machine (a read-only viewer's is refused with PermissionDenied), the
// machine's output comes back. It returns when the client closes its
// side (OK), the hub cuts the viewer, or a message is refused.
func (s *Server) Attach(stream consolev1.ConsoleService_AttachServer) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	open := first.GetOpen()
	if open == nil {
		return status.Error(codes.InvalidArgument, "a console stream's first message must be open (machine and mode)")
	}
	hub, target := s.Hub, open.GetMachine()
	switch {
	case open.GetVm() != "" && target != "":
		return status.Error(codes.InvalidArgument, "open: machine or vm, not both")
	case open.GetVm() != "":
		hub, target = s.VMs, open.GetVm()
		if len(target) > 253 {
			return status.Error(codes.InvalidArgument, "open.vm: at most 253 bytes")
		}
		if hub == nil {
			return status.Error(codes.FailedPrecondition, "virtual machines' consoles are not served by this appliance (it runs no hypervisor services)")
		}
	case target == "" || len(target) > 253:
		return status.Error(codes.InvalidArgument, "open.machine: a machine's (or open.vm: a virtual machine's) name is required (at most 253 bytes)")
	case hub == nil:
		return status.Error(codes.FailedPrecondition, "machines' consoles are not served by this appliance (it has no BMC service)")
	}
	var mode Mode
	switch open.GetMode() {
	case consolev1.ConsoleMode_CONSOLE_MODE_READ_ONLY:
		mode = ReadOnly
	case consolev1.ConsoleMode_CONSOLE_MODE_WRITE:
		mode = Write
	default:
		return status.Error(codes.InvalidArgument, "open.mode: CONSOLE_MODE_READ_ONLY or CONSOLE_MODE_WRITE")
	}
	who := "another viewer"
	if s.Who != nil {
		who = s.Who(ctx)
	}
	v, err := hub.Attach(ctx, target, mode, open.GetTake(), who)
	if err != nil {
		return apierr.ToStatus(err)
	}
	defer v.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		for {
			in, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				errc <- nil
				return
			}
			if err != nil {
				errc <- err
				return
			}
			if in.GetOpen() != nil {
				errc <- status.Error(codes.InvalidArgument, "a console stream opens once: open after the first message is refused")
				return
			}
			if err := v.Input(ctx, in.GetData()); err != nil {
				errc <- apierr.ToStatus(err)
				return
			}
		}
	}()
	for {
		select {
		case o := <-v.Output():
			if err := stream.Send(&consolev1.ConsoleOutput{Data: o.Data, Event: events[o.Event], Detail: o.Detail}); err != nil {
				return err
			}
		case <-v.Done():
			return apierr.ToStatus(v.Err())
		case err := <-errc:
			return err
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}
