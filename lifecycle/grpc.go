package lifecycle

import (
	"context"
	"errors"
	"strings"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/inventory"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

// MachineServer is the MachineService edge: inventory's (list, get,
// timeline, enroll, power, boot device) extended with the lifecycle's
// Accept, Reprovision and SetMaintenance, with SetPower arming the boot
// watchdog, and with DeleteMachine revoking the node's certificates.
type MachineServer struct {
	*inventory.MachineServer
	Lifecycle *Lifecycle
}

// RegisterMachines registers srv's MachineService on s.
func RegisterMachines(s grpc.ServiceRegistrar, srv *MachineServer) {
	inventoryv1.RegisterMachineServiceServer(s, srv)
}

func (s *MachineServer) AcceptMachine(ctx context.Context, req *inventoryv1.AcceptMachineRequest) (*inventoryv1.Machine, error) {
	m, err := s.Lifecycle.Accept(ctx, req.GetName(), req.GetDisk(), req.GetWipe())
	if err != nil {
		return nil, toStatus(err)
	}
	return m, nil
}

func (s *MachineServer) ReprovisionMachine(ctx context.Context, req *inventoryv1.ReprovisionMachineRequest) (*inventoryv1.Machine, error) {
	m, err := s.Lifecycle.Reprovision(ctx, req.GetName())
	if err != nil {
		return nil, toStatus(err)
	}
	return m, nil
}

// DeleteMachine deletes the machine (inventory's rules: refused while
// INSTALLING or DEPLOYED) and then revokes every certificate issued for
// its node. A machine already gone has its certificates revoked all the
// same, so a delete whose revocation failed can be retried.
func (s *MachineServer) DeleteMachine(ctx context.Context, req *inventoryv1.DeleteMachineRequest) (*emptypb.Empty, error) {
	m, err := s.Lifecycle.inv.GetMachine(ctx, req.GetName())
	switch {
	case errors.Is(err, apierr.ErrNotFound):
		m = &inventoryv1.Machine{Name: req.GetName()}
	case err != nil:
		return nil, toStatus(err)
	}
	_, derr := s.MachineServer.DeleteMachine(ctx, req)
	if derr != nil && status.Code(derr) != codes.NotFound {
		return nil, derr
	}
	if inventory.CheckName(req.GetName()) == nil {
		if err := s.Lifecycle.revokeCerts(ctx, m, "machine deleted"); err != nil {
			return nil, toStatus(err)
		}
	}
	if derr != nil {
		return nil, derr
	}
	return &emptypb.Empty{}, nil
}

func (s *MachineServer) SetMaintenance(ctx context.Context, req *inventoryv1.SetMaintenanceRequest) (*inventoryv1.Machine, error) {
	m, err := s.Lifecycle.SetMaintenance(ctx, req.GetName(), req.GetOn(), req.GetReason())
	if err != nil {
		return nil, toStatus(err)
	}
	return m, nil
}

func (s *MachineServer) SetPower(ctx context.Context, req *inventoryv1.SetPowerRequest) (*inventoryv1.PowerStatus, error) {
	ps, err := s.Lifecycle.SetPower(ctx, req.GetName(), req.GetAction())
	if err != nil {
		return nil, toStatus(err)
	}
	return ps, nil
}

// SetPower performs a power action through the machine's BMC; on, cycle
// and reset arm the machine's boot watchdog when it is to network-boot.
// Without BMC control it is ErrPrecondition.
func (l *Lifecycle) SetPower(ctx context.Context, name string, a inventoryv1.PowerAction) (*inventoryv1.PowerStatus, error) {
	if l.cfg.BMC == nil {
		return nil, apierr.Preconditionf("BMC control is not configured on this appliance")
	}
	ps, err := l.cfg.BMC.SetPower(ctx, name, a)
	if err != nil {
		return nil, err
	}
	switch a {
	case inventoryv1.PowerAction_POWER_ACTION_ON, inventoryv1.PowerAction_POWER_ACTION_CYCLE, inventoryv1.PowerAction_POWER_ACTION_RESET:
		l.armWatchdog(ctx, name, "power "+strings.ToLower(strings.TrimPrefix(a.String(), "POWER_ACTION_")))
	}
	return ps, nil
}
