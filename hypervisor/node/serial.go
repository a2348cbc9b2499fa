package node

import (
	"context"
	"errors"
	"io"
	"net"

	hypervisorv1 "github.com/corralhq/corral/api/hypervisor/v1"
	"github.com/corralhq/corral/hypervisor/vm"
	"github.com/corralhq/corral/internal/apierr"
)

// serialChunk bounds one SerialOutput; serialMaxInput one SerialInput's
// data (the appliance's console sends at most 4 KiB a message).
const (
	serialChunk    = 16 << 10
	serialMaxInput = 4096
)

// SerialConsole connects the stream to a running VM's serial port: the
// unix socket of QEMU's chardev, which also logs to console.log. The
// first message names the VM; an empty output says the port is open;
// then keys go in and output comes back
// until the appliance closes its side (OK), the VM's QEMU closes the
// socket (Unavailable) or a message is refused.
func (s *Server) SerialConsole(stream hypervisorv1.HypervisorService_SerialConsoleServer) error {
	err := s.serialConsole(stream)
	if err != nil {
		return apierr.ToStatus(err)
	}
	return nil
}

func (s *Server) serialConsole(stream hypervisorv1.HypervisorService_SerialConsoleServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	name := first.GetVm()
	if name == "" {
		return apierr.Invalidf("a serial stream's first message names the vm")
	}
	v, err := s.vms.Get(ctx, name)
	if err != nil {
		return err
	}
	if v.State != vm.Running && v.State != vm.Paused {
		return apierr.Preconditionf("vm %q is not running (%s): its serial port is closed", name, v.State)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", v.Serial)
	if err != nil {
		return apierr.Unavailablef("vm %q: serial port: %v", name, err)
	}
	defer conn.Close()
	context.AfterFunc(ctx, func() { conn.Close() })
	if err := stream.Send(&hypervisorv1.SerialOutput{}); err != nil {
		return err
	}
	s.log.Info("serial console opened", "vm", name)
	defer s.log.Info("serial console closed", "vm", name)

	inErr := make(chan error, 1)
	go func() {
		for {
			in, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				inErr <- nil
				return
			}
			if err != nil {
				inErr <- err
				return
			}
			if in.GetVm() != "" {
				inErr <- apierr.Invalidf("a serial stream names its vm once, in the first message")
				return
			}
			if len(in.GetData()) > serialMaxInput {
				inErr <- apierr.Invalidf("serial input of %d bytes: at most %d a message", len(in.GetData()), serialMaxInput)
				return
			}
			if _, err := conn.Write(in.GetData()); err != nil {
				inErr <- apierr.Unavailablef("vm %q: serial port: %v", name, err)
				return
			}
		}
	}()
	outErr := make(chan error, 1)
	go func() {
		buf := make([]byte, serialChunk)
		for {
			n, err := conn.Read(buf)
			if n > 0 {
				if serr := stream.Send(&hypervisorv1.SerialOutput{Data: append([]byte(nil), buf[:n]...)}); serr != nil {
					outErr <- serr
					return
				}
			}
			if err != nil {
				outErr <- apierr.Unavailablef("vm %q: serial port closed: %v", name, err)
				return
			}
		}
	}()
	select {
	case err := <-inErr:
		// Stop the reader before returning: Send is not called once the
		// handler has returned.
		cancel()
		<-outErr //nolint:errcheck // the input's error is the one reported
		return err
	case err := <-outErr:
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	}
}
