package lifecycle

import (
	"context"
	"errors"
	"io"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/inventory"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// AgentServer is the gRPC edge agents on machines dial: Register, the
// command Session, and Join (node enrolment), which cmd wires because it
// needs the CA. Errors become gRPC statuses in toStatus only.
type AgentServer struct {
	nodev1.UnimplementedAgentServiceServer
	Lifecycle *Lifecycle
	// JoinFunc serves Join; nil answers Unimplemented.
	JoinFunc func(ctx context.Context, req *nodev1.JoinRequest) (*nodev1.JoinResponse, error)
}

// RegisterAgent registers srv's AgentService on s.
func RegisterAgent(s grpc.ServiceRegistrar, srv *AgentServer) {
	nodev1.RegisterAgentServiceServer(s, srv)
}

// toStatus is this package's one mapping from error classes to gRPC
// status, for both of its edges.
func toStatus(err error) error { return apierr.ToStatus(err) }

func (s *AgentServer) Join(ctx context.Context, req *nodev1.JoinRequest) (*nodev1.JoinResponse, error) {
	if s.JoinFunc == nil {
		return s.UnimplementedAgentServiceServer.Join(ctx, req)
	}
	resp, err := s.JoinFunc(ctx, req)
	if err != nil {
		return nil, toStatus(err)
	}
	return resp, nil
}

func (s *AgentServer) Register(ctx context.Context, req *nodev1.RegisterRequest) (*nodev1.RegisterResponse, error) {
	m, err := s.Lifecycle.Register(ctx, req.GetBootMac(), req.GetFacts())
	if err != nil {
		return nil, toStatus(err)
	}
	return &nodev1.RegisterResponse{MachineName: m.GetName(), SessionId: s.Lifecycle.sess.open(m.GetName(), m.GetBootMac())}, nil
}

// Register records a discovery report (inventory.Register) and, in the
// same machine mutation, auto-accepts a machine that just became
// INVENTORIED when the policy says so. The accepted plan goes when the
// registering agent opens its session (at once if one is already open).
func (l *Lifecycle) Register(ctx context.Context, bootMAC string, facts *inventoryv1.Facts) (*inventoryv1.Machine, error) {
	var acc autoAccepted
	m, err := l.inv.Register(ctx, bootMAC, facts, inventory.RegisterOptions{Hook: func(m *inventoryv1.Machine, became bool) {
		acc = l.autoAccept(m, became)
	}})
	if err != nil {
		return nil, err
	}
	return l.afterAutoAccept(ctx, m, acc), nil
}

// Session: the agent's first message must be a heartbeat carrying the
// session id Register returned. The appliance answers with `wait`, then
// sends commands as they are issued; the agent sends heartbeats and
// progress.
func (s *AgentServer) Session(stream nodev1.AgentService_SessionServer) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	l := s.Lifecycle
	id, ok := l.sess.lookup(first.GetHeartbeat().GetSessionId())
	if !ok {
		return status.Error(codes.FailedPrecondition, "session: first message must be a heartbeat with the session id from Register")
	}
	machine := id.machine
	local := ""
	if p, ok := peer.FromContext(ctx); ok && p.LocalAddr != nil {
		local = p.LocalAddr.String()
	}
	ch := l.sess.attach(machine, l.now(), local)
	defer l.sess.detach(machine, ch)
	l.heartbeat(ctx, machine)
	// Commands queued now (a pending install plan or wipe) wait in ch and
	// follow the `wait` below; queuing them first means the agent's first
	// answer comes only once the appliance has looked at its machine.
	l.onConnect(ctx, machine)
	if err := stream.Send(&nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Wait_{Wait: &nodev1.ApplianceMessage_Wait{}}}); err != nil {
		return err
	}
	recvErr := make(chan error, 1)
	go func() {
		for {
			msg, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			switch x := msg.GetMsg().(type) {
			case *nodev1.AgentMessage_Heartbeat:
				l.heartbeat(ctx, machine)
			case *nodev1.AgentMessage_Progress:
				p := x.Progress
				attrs := map[string]string{"done": boolString(p.GetDone())}
				if p.GetError() != "" {
					attrs["error"] = p.GetError()
				}
				l.ev.Event(id.mac, "agent", "progress: "+p.GetStep(), p.GetDetail(), attrs)
				l.onProgress(ctx, machine, p)
			case *nodev1.AgentMessage_Csr:
				l.onCSR(ctx, machine, x.Csr)
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-recvErr:
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
				return nil
			}
			return err
		case cmd, ok := <-ch:
			if !ok {
				return status.Error(codes.Aborted, "session replaced by a newer one of the same machine")
			}
			if err := stream.Send(cmd); err != nil {
				return err
			}
		}
	}
}

// heartbeat records that machine's agent is alive, persisting last_seen at
// most once a minute per machine.
func (l *Lifecycle) heartbeat(ctx context.Context, machine string) {
	now := l.now()
	if !l.sess.seenDue(machine, now) {
		return
	}
	_, err := l.inv.UpdateMachine(ctx, machine, func(m *inventoryv1.Machine) error {
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		m.Annotations[inventory.AnnotationLastSeen] = now.UTC().Format("2006-01-02T15:04:05Z")
		return nil
	})
	if err != nil {
		l.log.Debug("last_seen not updated", "machine", machine, "err", err)
	}
}

func boolString(b bool) string {
	if b {
		return "true"
	}
	return "false"
}
