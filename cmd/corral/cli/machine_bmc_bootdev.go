package cli

import (
	"context"
	"fmt"
	"strings"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
)

func init() { machineVerbs = append(machineVerbs, (*invocation).bootdevCommand) }

var bootDevices = map[string]inventoryv1.BootDevice{
	"pxe":  inventoryv1.BootDevice_BOOT_DEVICE_PXE,
	"disk": inventoryv1.BootDevice_BOOT_DEVICE_DISK,
	"bios": inventoryv1.BootDevice_BOOT_DEVICE_BIOS,
}

// bootdevCommand: corral machine bootdev pxe|disk|bios NAME [--persistent] [--efi]
func (inv *invocation) bootdevCommand() *cobra.Command {
	var persistent, efi bool
	cmd := &cobra.Command{
		Use:   "bootdev pxe|disk|bios NAME [--persistent] [--efi]",
		Short: "Set a machine's next boot device through its BMC (next boot only unless --persistent)",
		Args:  argsBetween(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			dev, ok := bootDevices[strings.ToLower(args[0])]
			if !ok {
				return usageErrorf("unknown boot device %q (valid: pxe, disk, bios)", args[0])
			}
			name := args[1]
			err := inv.rpc(cmd, fmt.Sprintf("bootdev %s machine %q", args[0], name), func(ctx context.Context, cc *grpc.ClientConn) error {
				_, err := inventoryv1.NewMachineServiceClient(cc).SetBootDevice(ctx, &inventoryv1.SetBootDeviceRequest{Name: name, Device: dev, Persistent: persistent, Efi: efi})
				return err
			})
			if err != nil {
				return err
			}
			when := "next boot"
			if persistent {
				when = "every boot"
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s: %s boots %s\n", name, when, strings.ToLower(args[0]))
			return writeErr(err)
		},
	}
	cmd.Flags().BoolVar(&persistent, "persistent", false, "keep the device for every boot")
	cmd.Flags().BoolVar(&efi, "efi", false, "request a UEFI boot")
	return cmd
}
