package inventory

import (
	"context"
	"errors"
	"io"

	nodev1 "github.com/corralhq/corral/api/node/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// AgentServer is the gRPC edge agents on machines dial: Register, the
// command Session, and Join (node enrolment), which cmd wires because it
// needs the CA.
type AgentServer struct {
	nodev1.UnimplementedAgentServiceServer
	Inv *Inventory
	// JoinFunc serves Join; nil answers Unimplemented.
	JoinFunc func(ctx context.Context, req *nodev1.JoinRequest) (*nodev1.JoinResponse, error)
}

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

// RegisterAgent registers srv's AgentService on s.
func RegisterAgent(s grpc.ServiceRegistrar, srv *AgentServer) {
	nodev1.RegisterAgentServiceServer(s, srv)
}

func (s *AgentServer) Register(ctx context.Context, req *nodev1.RegisterRequest) (*nodev1.RegisterResponse, error) {
	m, err := s.Inv.Register(ctx, req.GetBootMac(), req.GetFacts())
	if err != nil {
		return nil, toStatus(err)
	}
	return &nodev1.RegisterResponse{MachineName: m.GetName(), SessionId: s.Inv.sess.open(m.GetName())}, nil
}

// Session: the agent's first message must be a heartbeat carrying the
// session id Register returned. The appliance answers with `wait`, then
// sends commands as they are issued (Inventory.Send); the agent sends
// heartbeats and progress.
func (s *AgentServer) Session(stream nodev1.AgentService_SessionServer) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	machine, ok := s.Inv.sess.machine(first.GetHeartbeat().GetSessionId())
	if !ok {
		return status.Error(codes.FailedPrecondition, "session: first message must be a heartbeat with the session id from Register")
	}
	inv := s.Inv
	local := ""
	if p, ok := peer.FromContext(ctx); ok && p.LocalAddr != nil {
		local = p.LocalAddr.String()
	}
	ch := inv.sess.attach(machine, inv.cfg.Now(), local)
	defer inv.sess.detach(machine, ch)
	inv.heartbeat(ctx, machine)
	if err := stream.Send(&nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Wait_{Wait: &nodev1.ApplianceMessage_Wait{}}}); err != nil {
		return err
	}
	// Commands the lifecycle queues now (a pending install plan or wipe)
	// follow the wait.
	if lc := inv.lc.Load(); lc != nil {
		lc.onConnect(ctx, machine)
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
				inv.heartbeat(ctx, machine)
			case *nodev1.AgentMessage_Progress:
				p := x.Progress
				m, _ := inv.GetMachine(ctx, machine)
				mac := ""
				if m != nil {
					mac = m.GetBootMac()
				}
				attrs := map[string]string{"done": boolString(p.GetDone())}
				if p.GetError() != "" {
					attrs["error"] = p.GetError()
				}
				inv.Event(mac, "agent", "progress: "+p.GetStep(), p.GetDetail(), attrs)
				if lc := inv.lc.Load(); lc != nil {
					lc.onProgress(ctx, machine, p)
				}
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

func boolString(b bool) string {
	if b {
		return "true"
	}
	return "false"
}
