package cli

import (
	"context"
	"fmt"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// machineStateCell is the STATE column: an INSTALLING machine shows its
// install step ("INSTALLING/format"; "INSTALLING/-" before the first).
func machineStateCell(m *inventoryv1.Machine) string {
	s := stateName(m.GetState().String(), "")
	if m.GetState() == inventoryv1.Machine_INSTALLING {
		step := m.GetInstall().GetStep()
		if step == "" {
			step = "-"
		}
		s += "/" + step
	}
	if m.GetState() == inventoryv1.Machine_DEPLOYING {
		s += "/" + deployStep(m.GetDeployment())
	}
	return s
}

// printMachine prints a machine changed by a verb: a one-line summary
// (state and reason) or the record in -o json|yaml.
func printMachine(cmd *cobra.Command, m *inventoryv1.Machine, output string) error {
	if output != formatTable {
		return printRecords(cmd.OutOrStdout(), machineKind, []proto.Message{m}, false, output)
	}
	line := fmt.Sprintf("machine %s: %s", m.GetName(), machineStateCell(m))
	if r := m.GetStateReason(); r != "" {
		line += " (" + r + ")"
	}
	if in := m.GetInstall(); m.GetState() == inventoryv1.Machine_INSTALLING {
		line += fmt.Sprintf("; install %s on %s", in.GetInstallId(), in.GetDisk())
	}
	if w := m.GetWipe(); w.GetDisk() != "" {
		line += "; " + w.GetDisk() + " is wiped when the discovery agent connects"
	}
	_, err := fmt.Fprintln(cmd.OutOrStdout(), line)
	return writeErr(err)
}

// machineRPC runs one MachineService call returning a Machine and prints it.
func (inv *invocation) machineRPC(cmd *cobra.Command, subject, output string, call func(ctx context.Context, c inventoryv1.MachineServiceClient) (*inventoryv1.Machine, error)) error {
	if err := checkFormat(output); err != nil {
		return err
	}
	var m *inventoryv1.Machine
	if err := inv.rpc(cmd, subject, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		m, err = call(ctx, inventoryv1.NewMachineServiceClient(cc))
		return err
	}); err != nil {
		return err
	}
	return printMachine(cmd, m, output)
}
