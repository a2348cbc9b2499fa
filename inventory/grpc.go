package inventory

import (
	"context"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/watchstream"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"
)

// MachineServer is the gRPC edge of the inventory.
type MachineServer struct {
	inventoryv1.UnimplementedMachineServiceServer
	Inv *Inventory
	// BMC serves Enroll, SetPower, GetPower and SetBootDevice; when nil
	// those RPCs answer FailedPrecondition.
	BMC *BMCControl
	// Watchers caps the Watch streams (nil: the appliance-wide
	// watchstream.Default).
	Watchers *watchstream.Limiter
}

// Register registers srv's MachineService on s.
func Register(s grpc.ServiceRegistrar, srv *MachineServer) {
	inventoryv1.RegisterMachineServiceServer(s, srv)
}

func (s *MachineServer) ListMachines(ctx context.Context, req *inventoryv1.ListMachinesRequest) (*inventoryv1.ListMachinesResponse, error) {
	ms, err := s.Inv.ListMachines(ctx, req)
	if err != nil {
		return nil, toStatus(err)
	}
	return &inventoryv1.ListMachinesResponse{Machines: ms}, nil
}

func (s *MachineServer) GetMachine(ctx context.Context, req *inventoryv1.GetMachineRequest) (*inventoryv1.Machine, error) {
	m, err := s.Inv.GetMachine(ctx, req.GetName())
	if err != nil {
		return nil, toStatus(err)
	}
	return m, nil
}

func (s *MachineServer) DeleteMachine(ctx context.Context, req *inventoryv1.DeleteMachineRequest) (*emptypb.Empty, error) {
	if err := s.Inv.DeleteMachine(ctx, req.GetName()); err != nil {
		return nil, toStatus(err)
	}
	return &emptypb.Empty{}, nil
}

func (s *MachineServer) Timeline(ctx context.Context, req *inventoryv1.TimelineRequest) (*inventoryv1.TimelineResponse, error) {
	es, err := s.Inv.Timeline(ctx, req.GetName(), req.GetMac(), int(req.GetLimit()))
	if err != nil {
		return nil, toStatus(err)
	}
	return &inventoryv1.TimelineResponse{Entries: es}, nil
}

func (s *MachineServer) bmc() (*BMCControl, error) {
	if s.BMC != nil {
		return s.BMC, nil
	}
	return nil, preconditionf("BMC control is not configured on this appliance")
}

func (s *MachineServer) EnrollMachine(ctx context.Context, req *inventoryv1.EnrollMachineRequest) (*inventoryv1.Machine, error) {
	c, err := s.bmc()
	if err != nil {
		return nil, toStatus(err)
	}
	m, err := c.Enroll(ctx, req)
	if err != nil {
		return nil, toStatus(err)
	}
	return m, nil
}

func (s *MachineServer) SetPower(ctx context.Context, req *inventoryv1.SetPowerRequest) (*inventoryv1.PowerStatus, error) {
	c, err := s.bmc()
	if err != nil {
		return nil, toStatus(err)
	}
	ps, err := c.SetPower(ctx, req.GetName(), req.GetAction())
	if err != nil {
		return nil, toStatus(err)
	}
	return ps, nil
}

func (s *MachineServer) GetPower(ctx context.Context, req *inventoryv1.GetPowerRequest) (*inventoryv1.PowerStatus, error) {
	c, err := s.bmc()
	if err != nil {
		return nil, toStatus(err)
	}
	ps, err := c.GetPower(ctx, req.GetName())
	if err != nil {
		return nil, toStatus(err)
	}
	return ps, nil
}

func (s *MachineServer) SetBootDevice(ctx context.Context, req *inventoryv1.SetBootDeviceRequest) (*emptypb.Empty, error) {
	c, err := s.bmc()
	if err != nil {
		return nil, toStatus(err)
	}
	if err := c.SetBootDevice(ctx, req.GetName(), BootRequest{Device: req.GetDevice(), Persistent: req.GetPersistent(), EFI: req.GetEfi()}); err != nil {
		return nil, toStatus(err)
	}
	return &emptypb.Empty{}, nil
}

// errNoLifecycle answers the lifecycle RPCs (Accept, Reprovision,
// SetMaintenance) when this edge is served alone; the lifecycle package's
// MachineServer overrides them.
var errNoLifecycle = preconditionf("the machine lifecycle is not configured on this appliance")

func (s *MachineServer) AcceptMachine(context.Context, *inventoryv1.AcceptMachineRequest) (*inventoryv1.Machine, error) {
	return nil, toStatus(errNoLifecycle)
}

func (s *MachineServer) ReprovisionMachine(context.Context, *inventoryv1.ReprovisionMachineRequest) (*inventoryv1.Machine, error) {
	return nil, toStatus(errNoLifecycle)
}

func (s *MachineServer) SetMaintenance(context.Context, *inventoryv1.SetMaintenanceRequest) (*inventoryv1.Machine, error) {
	return nil, toStatus(errNoLifecycle)
}
