package cli

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

func init() {
	machineVerbs = append(machineVerbs, (*invocation).biosCommand, (*invocation).firmwareCommand, (*invocation).mediaCommand)
}

// biosCommand: corral machine bios get|set NAME
func (inv *invocation) biosCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bios VERB",
		Short: "A machine's BIOS settings over Redfish: read them, set them (pending until the next boot)",
		Args:  cobra.ArbitraryArgs,
		RunE:  groupRunE,
	}
	cmd.AddCommand(inv.biosGetCommand(), inv.biosSetCommand())
	return cmd
}

func printBios(cmd *cobra.Command, name string, b *inventoryv1.Bios, output string) error {
	if output != formatTable {
		return printRecords(cmd.OutOrStdout(), &kind{name: "bios"}, []proto.Message{b}, false, output)
	}
	w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
	reg := b.GetRegistry()
	if reg == "" {
		reg = "none (values checked against the types read)"
	}
	fmt.Fprintf(w, "machine %s, attribute registry %s\n", name, reg)
	fmt.Fprintln(w, "ATTRIBUTE\tTYPE\tCURRENT\tPENDING\tALLOWED")
	pending := 0
	for _, a := range b.GetAttributes() {
		p := ""
		if a.GetHasPending() {
			p, pending = a.GetPending(), pending+1
		}
		allowed := strings.Join(a.GetAllowed(), ",")
		switch {
		case a.GetReadOnly():
			allowed = "(read-only)"
		case a.GetLower() != 0 || a.GetUpper() != 0:
			allowed = fmt.Sprintf("%d..%d", a.GetLower(), a.GetUpper())
		case a.GetMaxLength() > 0:
			allowed = fmt.Sprintf("at most %d characters", a.GetMaxLength())
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", a.GetName(), a.GetType(), a.GetCurrent(), p, allowed)
	}
	if pending > 0 {
		fmt.Fprintf(w, "%d settings pending: the machine applies them at its next boot\n", pending)
	}
	return writeErr(w.Flush())
}

func (inv *invocation) biosGetCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "get NAME",
		Short: "Show a machine's BIOS attributes: current values, pending ones, what each accepts",
		Args:  argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			var resp *inventoryv1.GetBiosResponse
			err := inv.rpc(cmd, fmt.Sprintf("read the BIOS of machine %q", args[0]), func(ctx context.Context, cc *grpc.ClientConn) error {
				var err error
				resp, err = inventoryv1.NewBmcRedfishServiceClient(cc).GetBios(ctx, &inventoryv1.GetBiosRequest{Name: args[0]})
				return err
			})
			if err != nil {
				return err
			}
			return printBios(cmd, args[0], resp.GetBios(), output)
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

func (inv *invocation) biosSetCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "set NAME KEY=VALUE...",
		Short: "Apply BIOS settings (checked against the BMC's attribute registry; pending until the next boot)",
		Long: `set checks every KEY=VALUE against the BMC's BIOS attribute registry (or,
when it offers none, against the type of each value read) and refuses
the lot, sending nothing, if any key is unknown or any value wrong. The
settings go to the BIOS's settings object and stay pending until the
machine next boots: reboot it (corral machine power cycle NAME) to apply
them. Redfish BMCs only.`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			settings := map[string]string{}
			for _, kv := range args[1:] {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || k == "" {
					return usageErrorf("setting %q: want KEY=VALUE", kv)
				}
				settings[k] = v
			}
			var resp *inventoryv1.SetBiosResponse
			err := inv.rpc(cmd, fmt.Sprintf("set the BIOS of machine %q", args[0]), func(ctx context.Context, cc *grpc.ClientConn) error {
				var err error
				resp, err = inventoryv1.NewBmcRedfishServiceClient(cc).SetBios(ctx, &inventoryv1.SetBiosRequest{Name: args[0], Settings: settings})
				return err
			})
			if err != nil {
				return err
			}
			return printBios(cmd, args[0], resp.GetBios(), output)
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

// firmwareCommand: corral machine firmware list|update NAME
func (inv *invocation) firmwareCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "firmware VERB",
		Short: "A machine's firmware over Redfish: list it, update it from an image in the catalog",
		Args:  cobra.ArbitraryArgs,
		RunE:  groupRunE,
	}
	cmd.AddCommand(inv.firmwareListCommand(), inv.firmwareUpdateCommand())
	return cmd
}

func printFirmware(cmd *cobra.Command, fw []*inventoryv1.Firmware) error {
	w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tNAME\tVERSION\tUPDATEABLE")
	for _, f := range fw {
		fmt.Fprintf(w, "%s\t%s\t%s\t%t\n", f.GetId(), f.GetName(), f.GetVersion(), f.GetUpdateable())
	}
	return writeErr(w.Flush())
}

func (inv *invocation) firmwareListCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "list NAME",
		Short: "List a machine's firmware components: version, whether updateable",
		Args:  argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			var resp *inventoryv1.ListFirmwareResponse
			err := inv.rpc(cmd, fmt.Sprintf("list the firmware of machine %q", args[0]), func(ctx context.Context, cc *grpc.ClientConn) error {
				var err error
				resp, err = inventoryv1.NewBmcRedfishServiceClient(cc).ListFirmware(ctx, &inventoryv1.ListFirmwareRequest{Name: args[0]})
				return err
			})
			if err != nil {
				return err
			}
			if output != formatTable {
				return printRecords(cmd.OutOrStdout(), &kind{name: "firmware"}, []proto.Message{resp}, false, output)
			}
			return printFirmware(cmd, resp.GetFirmware())
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

func (inv *invocation) firmwareUpdateCommand() *cobra.Command {
	var (
		output, image, sum string
		targets            []string
		wait               time.Duration
	)
	cmd := &cobra.Command{
		Use:   "update NAME --image IMG [--targets ID,...]",
		Short: "Update a machine's firmware from an image in the OS image catalog, following the BMC's task to its end",
		Long: `update has the BMC fetch image IMG of the OS image catalog (corral
osimage upload) from the appliance and apply it (Redfish SimpleUpdate),
then follows the BMC's task until it completes or fails, each step on
the machine's timeline. The image's bytes are hashed and compared with
the catalog's SHA-256 first: a mismatch (or one with --sha256) is
refused and the BMC is told nothing. --targets names firmware components
(the IDs of corral machine firmware list); without it the BMC decides.`,
		Args: argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			if image == "" {
				return usageErrorf("--image is required: the catalog name of the firmware image")
			}
			if wait <= 0 {
				return usageErrorf("--wait %s: must be positive", wait)
			}
			var resp *inventoryv1.UpdateFirmwareResponse
			err := inv.rpc(cmd, fmt.Sprintf("update the firmware of machine %q", args[0]), func(_ context.Context, cc *grpc.ClientConn) error {
				// The task may take long: the call's deadline is the wait's.
				ctx, cancel := context.WithTimeout(cmd.Context(), wait+inv.timeout)
				defer cancel()
				var err error
				resp, err = inventoryv1.NewBmcRedfishServiceClient(cc).UpdateFirmware(ctx, &inventoryv1.UpdateFirmwareRequest{Name: args[0], Image: image,
					Sha256: sum, Targets: targets, WaitSeconds: uint32(wait.Seconds())})
				return err
			})
			if err != nil {
				return err
			}
			if output != formatTable {
				return printRecords(cmd.OutOrStdout(), &kind{name: "firmware update"}, []proto.Message{resp}, false, output)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: firmware image %s (sha256 %s) applied: task %s %s\n", args[0], image, resp.GetImageSha256(),
				resp.GetTask(), resp.GetState())
			return printFirmware(cmd, resp.GetFirmware())
		},
	}
	cmd.Flags().StringVar(&image, "image", "", "the firmware image's name in the OS image catalog")
	cmd.Flags().StringVar(&sum, "sha256", "", "refuse unless the catalog's SHA-256 of the image is this")
	cmd.Flags().StringSliceVar(&targets, "targets", nil, "firmware component IDs to update (default: the BMC decides)")
	cmd.Flags().DurationVar(&wait, "wait", 30*time.Minute, "how long to follow the BMC's task")
	addOutputFlag(cmd, &output)
	return cmd
}

// mediaCommand: corral machine media insert|eject NAME
func (inv *invocation) mediaCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "media VERB",
		Short: "A machine's virtual CD over Redfish: insert an ISO from the catalog (and boot it), eject",
		Args:  cobra.ArbitraryArgs,
		RunE:  groupRunE,
	}
	cmd.AddCommand(inv.mediaInsertCommand(), inv.mediaEjectCommand())
	return cmd
}

func (inv *invocation) mediaInsertCommand() *cobra.Command {
	var (
		image string
		boot  bool
	)
	cmd := &cobra.Command{
		Use:   "insert NAME --image ISO [--boot]",
		Short: "Put an ISO of the OS image catalog in the machine's virtual CD (the BMC fetches it from the appliance)",
		Args:  argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if image == "" {
				return usageErrorf("--image is required: the catalog name of the ISO")
			}
			var resp *inventoryv1.InsertMediaResponse
			err := inv.rpc(cmd, fmt.Sprintf("insert virtual media in machine %q", args[0]), func(ctx context.Context, cc *grpc.ClientConn) error {
				var err error
				resp, err = inventoryv1.NewBmcRedfishServiceClient(cc).InsertMedia(ctx, &inventoryv1.InsertMediaRequest{Name: args[0], Image: image, Boot: boot})
				return err
			})
			if err != nil {
				return err
			}
			note := ""
			if resp.GetBoot() {
				note = "; the next boot (once) is from it"
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s: virtual CD holds %s (%s)%s\n", args[0], image, resp.GetImageUri(), note)
			return writeErr(err)
		},
	}
	cmd.Flags().StringVar(&image, "image", "", "the ISO's name in the OS image catalog")
	cmd.Flags().BoolVar(&boot, "boot", false, "set the next boot (once) to the virtual CD")
	return cmd
}

func (inv *invocation) mediaEjectCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "eject NAME",
		Short: "Empty the machine's virtual CD",
		Args:  argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			err := inv.rpc(cmd, fmt.Sprintf("eject virtual media from machine %q", args[0]), func(ctx context.Context, cc *grpc.ClientConn) error {
				_, err := inventoryv1.NewBmcRedfishServiceClient(cc).EjectMedia(ctx, &inventoryv1.EjectMediaRequest{Name: args[0]})
				return err
			})
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s: virtual CD empty\n", args[0])
			return writeErr(err)
		},
	}
}
