package appliance

import (
	"context"
	"errors"
	"io"

	hypervisorv1 "github.com/corralhq/corral/api/hypervisor/v1"
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
	"github.com/corralhq/corral/internal/apierr"
)

// serialChunk is the most one read of the viewer's keys sends the node.
const serialChunk = 4096

// serialVM finds the VM whose serial port is asked for: one placed on a
// node and not pending.
func (s *Services) serialVM(ctx context.Context, name string) (*provisioningv1.VirtualMachine, error) {
	vm, err := s.GetVirtualMachine(ctx, name)
	if err != nil {
		return nil, err
	}
	if vm.GetState() == vmPending {
		return nil, s.pendingErr(vmKind, name, vm.GetAnnotations())
	}
	if vm.GetComputeNodeName() == "" {
		return nil, apierr.Preconditionf("virtual machine %q is on no node: it has no serial console", name)
	}
	return vm, nil
}

// CheckSerialConsole says whether VM name has a serial console to open
// (ipmi/console's Link.Check): it exists, is not pending and is placed on
// a node. It returns the VM's UUID, which tells a VM from another created
// later under its name.
func (s *Services) CheckSerialConsole(ctx context.Context, name string) (string, error) {
	vm, err := s.serialVM(ctx, name)
	if err != nil {
		return "", err
	}
	return vm.GetUuid(), nil
}

// SerialConsole opens VM name's serial port through its node
// (HypervisorService.SerialConsole) and copies in to it and its output to
// out until ctx ends (nil) or the stream fails (an error naming the node).
// It calls up once the node says the port is open.
func (s *Services) SerialConsole(ctx context.Context, name string, in io.Reader, out io.Writer, up func()) error {
	vm, err := s.serialVM(ctx, name)
	if err != nil {
		return err
	}
	node := vm.GetComputeNodeName()
	c, err := s.nodeClient(ctx, node)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.SerialConsole(ctx)
	if err != nil {
		return nodeErr(node, "serial console", err)
	}
	if err := stream.Send(&hypervisorv1.SerialInput{Input: &hypervisorv1.SerialInput_Vm{Vm: name}}); err != nil {
		return s.serialEnd(ctx, node, stream)
	}
	if _, err := stream.Recv(); err != nil {
		return s.serialEnd(ctx, node, stream, err)
	}
	up()
	go func() {
		buf := make([]byte, serialChunk)
		for {
			n, err := in.Read(buf)
			if n > 0 {
				data := append([]byte(nil), buf[:n]...)
				if stream.Send(&hypervisorv1.SerialInput{Input: &hypervisorv1.SerialInput_Data{Data: data}}) != nil {
					return // Recv below reports why
				}
			}
			if err != nil {
				_ = stream.CloseSend()
				return
			}
		}
	}()
	for {
		o, err := stream.Recv()
		if err != nil {
			return s.serialEnd(ctx, node, stream, err)
		}
		if len(o.GetData()) > 0 {
			if _, err := out.Write(o.GetData()); err != nil {
				return err
			}
		}
	}
}

// serialEnd phrases how a node's serial stream ended: nil when ctx ended
// (the hub closed the link), else the node's error. With no error given
// it is read from the stream.
func (s *Services) serialEnd(ctx context.Context, node string, stream hypervisorv1.HypervisorService_SerialConsoleClient, errs ...error) error {
	if ctx.Err() != nil {
		return nil //nolint:nilerr // the hub closed the link: not a failure
	}
	err := errors.Join(errs...)
	if err == nil {
		_, err = stream.Recv()
	}
	if errors.Is(err, io.EOF) {
		return apierr.Unavailablef("node %q closed the serial console", node)
	}
	return nodeErr(node, "serial console", err)
}
