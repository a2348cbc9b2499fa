package lifecycle

import (
	"context"
	"strings"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/inventory"
	"google.golang.org/grpc"
)

// MachineServer is the MachineService edge: inventory's (list, get,
// delete, timeline, enroll, power, boot device) extended with the
// lifecycle's Accept, Reprovision and SetMaintenance, and with SetPower
// arming the boot watchdog.
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
