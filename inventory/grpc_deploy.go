package inventory

import (
	"context"
	"slices"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// DeployMachine deploys an operating system onto a machine allocated to
// the caller, or any allocated machine for an operator (the lifecycle's
// Deploy).
func (s *MachineServer) DeployMachine(ctx context.Context, req *inventoryv1.DeployMachineRequest) (*inventoryv1.Machine, error) {
	if s.Lifecycle == nil {
		return nil, apierr.ToStatus(errNoLifecycle)
	}
	return machineOrStatus(s.Lifecycle.Deploy(ctx, s.caller(ctx), req))
}

// Deployments' user data (it may hold secrets) is kept in the record for
// resends of the plan and never leaves the appliance through the API:
// machineServiceDesc wraps every MachineService handler so that each
// answer and each watch event carries the machine without it (its
// user_data_sha256 stays). It is the one place machines leave the API;
// the web page and the CLI read them through it.

// machineServiceDesc is MachineService's descriptor with every handler's
// answers passed through withoutUserData.
func machineServiceDesc() *grpc.ServiceDesc {
	desc := inventoryv1.MachineService_ServiceDesc
	desc.Methods = slices.Clone(desc.Methods)
	for k := range desc.Methods {
		h := desc.Methods[k].Handler
		desc.Methods[k].Handler = func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			resp, err := h(srv, ctx, dec, ic)
			return withoutUserData(resp), err
		}
	}
	desc.Streams = slices.Clone(desc.Streams)
	for k := range desc.Streams {
		h := desc.Streams[k].Handler
		desc.Streams[k].Handler = func(srv any, ss grpc.ServerStream) error {
			return h(srv, redactingStream{ss})
		}
	}
	return &desc
}

// redactingStream sends every message through withoutUserData.
type redactingStream struct{ grpc.ServerStream }

func (s redactingStream) SendMsg(m any) error { return s.ServerStream.SendMsg(withoutUserData(m)) }

// withoutUserData returns resp with no deployment user data in the
// machines it carries: resp itself when it has none, else a copy (the
// answer may share its machines with a cache).
func withoutUserData(resp any) any {
	switch r := resp.(type) {
	case *inventoryv1.Machine:
		return redactMachine(r)
	case *inventoryv1.MachineEvent:
		if hasUserData(r.GetMachine()) {
			c := proto.CloneOf(r)
			c.Machine.Deployment.UserData = nil
			return c
		}
	case *inventoryv1.ListMachinesResponse:
		if slices.ContainsFunc(r.GetMachines(), hasUserData) {
			c := proto.CloneOf(r)
			clearUserData(c.GetMachines())
			return c
		}
	case *inventoryv1.AllocateMachinesResponse:
		if slices.ContainsFunc(r.GetMachines(), hasUserData) {
			c := proto.CloneOf(r)
			clearUserData(c.GetMachines())
			return c
		}
	}
	return resp
}

// clearUserData clears the user data of machines (copies the caller owns).
func clearUserData(ms []*inventoryv1.Machine) {
	for _, m := range ms {
		if hasUserData(m) {
			m.Deployment.UserData = nil
		}
	}
}

func hasUserData(m *inventoryv1.Machine) bool { return len(m.GetDeployment().GetUserData()) > 0 }

func redactMachine(m *inventoryv1.Machine) *inventoryv1.Machine {
	if !hasUserData(m) {
		return m
	}
	c := proto.CloneOf(m)
	c.Deployment.UserData = nil
	return c
}
