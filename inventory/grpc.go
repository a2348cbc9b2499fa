package inventory

import (
	"context"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/internal/watchstream"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"
)

// MachineServer is the one implementation of corral.inventory.v1
// MachineService. It serves the inventory's own RPCs (list, get, delete,
// watch, timeline) from the Inventory and hands the verbs inventory does
// not own to the interfaces below, which it declares and never imports
// the implementations of: BMC control (inventory/bmc) and the machine
// lifecycle (package lifecycle). cmd wires them.
type MachineServer struct {
	inventoryv1.UnimplementedMachineServiceServer
	Inv *Inventory
	// BMC serves Enroll, GetPower and SetBootDevice, and SetPower when
	// Lifecycle is nil; when nil those RPCs answer FailedPrecondition.
	BMC BMCVerbs
	// Lifecycle serves Accept, Reprovision, SetMaintenance, Deploy,
	// SetPower and DeleteMachine; when nil the first four answer FailedPrecondition,
	// SetPower goes to BMC and DeleteMachine to Inv.
	Lifecycle LifecycleVerbs
	// Watchers caps the Watch streams (nil: the appliance-wide
	// watchstream.Default).
	Watchers *watchstream.Limiter
	// Caller says who calls, for allocation and what a caller sees
	// (alloc.go, docs/security.md "Owners"); nil: every caller is the
	// operator Anonymous (an appliance without authentication, tests).
	Caller func(ctx context.Context) Owner
}

// BMCVerbs is BMC control as the MachineService edge uses it. Implemented
// by *bmc.Service.
type BMCVerbs interface {
	Enroll(ctx context.Context, req *inventoryv1.EnrollMachineRequest) (*inventoryv1.Machine, error)
	GetPower(ctx context.Context, name string) (*inventoryv1.PowerStatus, error)
	SetPower(ctx context.Context, name string, a inventoryv1.PowerAction) (*inventoryv1.PowerStatus, error)
	SetBootDevice(ctx context.Context, name string, req BootRequest) error
}

// LifecycleVerbs is the machine lifecycle as the MachineService edge uses
// it. Implemented by *lifecycle.Lifecycle: its SetPower arms the boot
// watchdog, its DeleteMachine revokes the node's certificates.
type LifecycleVerbs interface {
	Accept(ctx context.Context, name, disk string, wipe bool) (*inventoryv1.Machine, error)
	Reprovision(ctx context.Context, name string) (*inventoryv1.Machine, error)
	SetMaintenance(ctx context.Context, name string, on bool, reason string) (*inventoryv1.Machine, error)
	SetPower(ctx context.Context, name string, a inventoryv1.PowerAction) (*inventoryv1.PowerStatus, error)
	DeleteMachine(ctx context.Context, name string) error
	Deploy(ctx context.Context, by Owner, req *inventoryv1.DeployMachineRequest) (*inventoryv1.Machine, error)
}

// BootRequest is a next-boot device request (it mirrors the ipmi
// package's, which inventory does not import).
type BootRequest struct {
	Device     inventoryv1.BootDevice
	Persistent bool
	EFI        bool
}

// Register registers srv's MachineService on s, its answers without
// deployments' user data (grpc_deploy.go).
func Register(s grpc.ServiceRegistrar, srv *MachineServer) {
	s.RegisterService(machineServiceDesc(), srv)
}

// ListMachines answers one page of the machines the request selects
// (Inventory.ListMachinesPage).
func (s *MachineServer) ListMachines(ctx context.Context, req *inventoryv1.ListMachinesRequest) (*inventoryv1.ListMachinesResponse, error) {
	who := s.caller(ctx)
	req = ownerFilter(req, who)
	ms, next, err := s.Inv.ListMachinesPage(ctx, req)
	if err != nil {
		return nil, apierr.ToStatus(err)
	}
	return &inventoryv1.ListMachinesResponse{Machines: visible(who, ms), NextPageToken: next}, nil
}

// GetMachine returns one machine by name.
func (s *MachineServer) GetMachine(ctx context.Context, req *inventoryv1.GetMachineRequest) (*inventoryv1.Machine, error) {
	m, err := s.Inv.GetMachine(ctx, req.GetName())
	if err == nil && !s.caller(ctx).Sees(m) {
		err = hidden(req.GetName())
	}
	if err != nil {
		return nil, apierr.ToStatus(err)
	}
	return m, nil
}

// DeleteMachine deletes a machine: through the lifecycle when there is one
// (it revokes the node's certificates), else from inventory alone.
func (s *MachineServer) DeleteMachine(ctx context.Context, req *inventoryv1.DeleteMachineRequest) (*emptypb.Empty, error) {
	del := s.Inv.DeleteMachine
	if s.Lifecycle != nil {
		del = s.Lifecycle.DeleteMachine
	}
	if err := del(ctx, req.GetName()); err != nil {
		return nil, apierr.ToStatus(err)
	}
	return &emptypb.Empty{}, nil
}

// Timeline returns a machine's (or a MAC's) boot timeline, newest last.
func (s *MachineServer) Timeline(ctx context.Context, req *inventoryv1.TimelineRequest) (*inventoryv1.TimelineResponse, error) {
	if err := s.checkSees(ctx, req.GetName(), req.GetMac()); err != nil {
		return nil, apierr.ToStatus(err)
	}
	es, err := s.Inv.Timeline(ctx, req.GetName(), req.GetMac(), int(req.GetLimit()))
	if err != nil {
		return nil, apierr.ToStatus(err)
	}
	return &inventoryv1.TimelineResponse{Entries: es}, nil
}

// errNoBMC and errNoLifecycle answer the verbs whose service is not
// configured on this appliance.
var (
	errNoBMC       = apierr.Preconditionf("BMC control is not configured on this appliance")
	errNoLifecycle = apierr.Preconditionf("the machine lifecycle is not configured on this appliance")
)

// EnrollMachine checks and stores BMC credentials; FailedPrecondition
// without BMC control.
func (s *MachineServer) EnrollMachine(ctx context.Context, req *inventoryv1.EnrollMachineRequest) (*inventoryv1.Machine, error) {
	if s.BMC == nil {
		return nil, apierr.ToStatus(errNoBMC)
	}
	m, err := s.BMC.Enroll(ctx, req)
	if err != nil {
		return nil, apierr.ToStatus(err)
	}
	return m, nil
}

// SetPower runs a power action: through the lifecycle when there is one
// (it arms the boot watchdog), else through BMC control.
func (s *MachineServer) SetPower(ctx context.Context, req *inventoryv1.SetPowerRequest) (*inventoryv1.PowerStatus, error) {
	var set func(context.Context, string, inventoryv1.PowerAction) (*inventoryv1.PowerStatus, error)
	switch {
	case s.Lifecycle != nil:
		set = s.Lifecycle.SetPower
	case s.BMC != nil:
		set = s.BMC.SetPower
	default:
		return nil, apierr.ToStatus(errNoBMC)
	}
	ps, err := set(ctx, req.GetName(), req.GetAction())
	if err != nil {
		return nil, apierr.ToStatus(err)
	}
	return ps, nil
}

// GetPower reads a machine's power state from its BMC.
func (s *MachineServer) GetPower(ctx context.Context, req *inventoryv1.GetPowerRequest) (*inventoryv1.PowerStatus, error) {
	if s.BMC == nil {
		return nil, apierr.ToStatus(errNoBMC)
	}
	if err := s.checkSees(ctx, req.GetName(), ""); err != nil {
		return nil, apierr.ToStatus(err)
	}
	ps, err := s.BMC.GetPower(ctx, req.GetName())
	if err != nil {
		return nil, apierr.ToStatus(err)
	}
	return ps, nil
}

// SetBootDevice sets a machine's next boot device through its BMC.
func (s *MachineServer) SetBootDevice(ctx context.Context, req *inventoryv1.SetBootDeviceRequest) (*emptypb.Empty, error) {
	if s.BMC == nil {
		return nil, apierr.ToStatus(errNoBMC)
	}
	if err := s.BMC.SetBootDevice(ctx, req.GetName(), BootRequest{Device: req.GetDevice(), Persistent: req.GetPersistent(), EFI: req.GetEfi()}); err != nil {
		return nil, apierr.ToStatus(err)
	}
	return &emptypb.Empty{}, nil
}

// AcceptMachine accepts a machine for install (the lifecycle).
func (s *MachineServer) AcceptMachine(ctx context.Context, req *inventoryv1.AcceptMachineRequest) (*inventoryv1.Machine, error) {
	switch req.GetTarget() {
	case inventoryv1.AcceptTarget_ACCEPT_TARGET_HYPERVISOR:
	case inventoryv1.AcceptTarget_ACCEPT_TARGET_POOL:
		return machineOrStatus(s.Inv.AcceptToPool(ctx, req.GetName()))
	default:
		return nil, apierr.ToStatus(apierr.Invalidf("accept target %d: want hypervisor or pool", req.GetTarget()))
	}
	if s.Lifecycle == nil {
		return nil, apierr.ToStatus(errNoLifecycle)
	}
	return machineOrStatus(s.Lifecycle.Accept(ctx, req.GetName(), req.GetDisk(), req.GetWipe()))
}

// AdoptMachine accepts a parked report as the machine it claimed to be,
// or as a machine of its own (Inventory.AdoptMachine).
func (s *MachineServer) AdoptMachine(ctx context.Context, req *inventoryv1.AdoptMachineRequest) (*inventoryv1.Machine, error) {
	return machineOrStatus(s.Inv.AdoptMachine(ctx, req.GetName(), req.GetSeparate()))
}

// RejectMachine deletes a parked report (Inventory.RejectMachine).
func (s *MachineServer) RejectMachine(ctx context.Context, req *inventoryv1.RejectMachineRequest) (*emptypb.Empty, error) {
	if err := s.Inv.RejectMachine(ctx, req.GetName()); err != nil {
		return nil, apierr.ToStatus(err)
	}
	return &emptypb.Empty{}, nil
}

// ReprovisionMachine sends a deployed machine back to install (the
// lifecycle).
func (s *MachineServer) ReprovisionMachine(ctx context.Context, req *inventoryv1.ReprovisionMachineRequest) (*inventoryv1.Machine, error) {
	if s.Lifecycle == nil {
		return nil, apierr.ToStatus(errNoLifecycle)
	}
	return machineOrStatus(s.Lifecycle.Reprovision(ctx, req.GetName()))
}

// SetMaintenance puts a machine in or out of MAINTENANCE (the lifecycle).
func (s *MachineServer) SetMaintenance(ctx context.Context, req *inventoryv1.SetMaintenanceRequest) (*inventoryv1.Machine, error) {
	if s.Lifecycle == nil {
		return nil, apierr.ToStatus(errNoLifecycle)
	}
	return machineOrStatus(s.Lifecycle.SetMaintenance(ctx, req.GetName(), req.GetOn(), req.GetReason()))
}

func machineOrStatus(m *inventoryv1.Machine, err error) (*inventoryv1.Machine, error) {
	if err != nil {
		return nil, apierr.ToStatus(err)
	}
	return m, nil
}
