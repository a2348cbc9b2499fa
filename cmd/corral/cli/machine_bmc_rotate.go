package cli

import (
	"context"
	"fmt"
	"io"
	"strings"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

func init() { machineVerbs = append(machineVerbs, (*invocation).bmcCommand) }

// bmcCommand: corral machine bmc rotate|forget-hostkey NAME
func (inv *invocation) bmcCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bmc VERB",
		Short: "The BMC account Corral owns on a machine (rotate its password), and its console's pinned SSH host key",
		Args:  cobra.ArbitraryArgs,
		RunE:  groupRunE,
	}
	cmd.AddCommand(inv.bmcRotateCommand(), inv.bmcForgetHostKeyCommand())
	return cmd
}

func (inv *invocation) bmcForgetHostKeyCommand() *cobra.Command {
	var output, expect string
	cmd := &cobra.Command{
		Use:   "forget-hostkey NAME",
		Short: "Clear the SSH host key pinned for a machine's Redfish serial console, so the next console pins the key presented then",
		Long: `forget-hostkey clears the SSH host key corrald pinned for a machine's serial
console on its Redfish BMC (trust on first use: the key the BMC presented at
the first console link). While a BMC presents another key than the pinned
one, its console is refused and the password is not sent to it; the
machine carries the flag bmc-console-host-key-changed naming both keys.

Clear the pin only when the key changed on purpose (a new BMC board, a
factory reset): check the new key on the BMC first (its fingerprint as
ssh-keygen -l prints it, SHA256:...). The next console link pins the key the
BMC presents then. --expect refuses unless the pin is the one given. The
call is recorded in the audit stream and on the machine's timeline.`,
		Args: argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			name := args[0]
			var resp *inventoryv1.ForgetBmcHostKeyResponse
			err := inv.rpc(cmd, fmt.Sprintf("forget the BMC console host key of machine %q", name), func(ctx context.Context, cc *grpc.ClientConn) error {
				var err error
				resp, err = inventoryv1.NewBmcCredentialServiceClient(cc).ForgetBmcHostKey(ctx, &inventoryv1.ForgetBmcHostKeyRequest{Name: name, Expect: expect})
				return err
			})
			if err != nil {
				return err
			}
			if output != formatTable {
				return printRecords(cmd.OutOrStdout(), &kind{name: "bmc host key"}, []proto.Message{resp}, false, output)
			}
			msg := fmt.Sprintf("%s: no console host key was pinned; the next console link pins the key the BMC presents\n", name)
			if resp.GetForgotten() != "" {
				msg = fmt.Sprintf("%s: console host key %s forgotten; the next console link pins the key the BMC presents\n", name, resp.GetForgotten())
			}
			_, err = io.WriteString(cmd.OutOrStdout(), msg)
			return writeErr(err)
		},
	}
	cmd.Flags().StringVar(&expect, "expect", "", "refuse unless this is the pinned key (SHA256:...)")
	addOutputFlag(cmd, &output)
	return cmd
}

func (inv *invocation) bmcRotateCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "rotate NAME",
		Short: "Give Corral's own BMC account on a machine a new random password (made the first time), proven before the old one is dropped",
		Long: `rotate makes or updates the BMC account Corral logs in with (corral-a or
corral-b, alternately) with a random password that never leaves the
appliance. The new password is sealed in the store before the BMC is told
it, a login with it must succeed before the machine uses it, and only then
is the account used before disabled (the account the machine was enrolled
with is the operator's and is left alone). A rotation an appliance left
unfinished is finished first. IPMI (Set User Name/Password/Access) and
Redfish (AccountService) BMCs alike.`,
		Args: argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			name := args[0]
			var resp *inventoryv1.RotateBmcCredentialsResponse
			err := inv.rpc(cmd, fmt.Sprintf("rotate the BMC credential of machine %q", name), func(ctx context.Context, cc *grpc.ClientConn) error {
				var err error
				resp, err = inventoryv1.NewBmcCredentialServiceClient(cc).RotateBmcCredentials(ctx, &inventoryv1.RotateBmcCredentialsRequest{Name: name})
				return err
			})
			if err != nil {
				return err
			}
			if output != formatTable {
				return printRecords(cmd.OutOrStdout(), &kind{name: "bmc rotation"}, []proto.Message{resp}, false, output)
			}
			var b strings.Builder
			for _, s := range resp.GetSteps() {
				fmt.Fprintf(&b, "  %s\n", s)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s: BMC user %q (slot %d), password rotated\n%s", name,
				resp.GetBmc().GetUsername(), resp.GetBmc().GetAccountId(), b.String())
			return writeErr(err)
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

// rotateAfterEnroll is enroll --bmc-rotate: the machine just enrolled
// gets Corral's own account at once. The enrolment stands whatever the
// rotation says.
func (inv *invocation) rotateAfterEnroll(cmd *cobra.Command, m *inventoryv1.Machine) (*inventoryv1.Machine, error) {
	name := m.GetName()
	var resp *inventoryv1.RotateBmcCredentialsResponse
	err := inv.rpc(cmd, fmt.Sprintf("rotate the BMC credential of machine %q (enrolled)", name), func(ctx context.Context, cc *grpc.ClientConn) error {
		var err error
		resp, err = inventoryv1.NewBmcCredentialServiceClient(cc).RotateBmcCredentials(ctx, &inventoryv1.RotateBmcCredentialsRequest{Name: name})
		return err
	})
	if err != nil {
		return m, err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "machine %s: BMC user %q (slot %d) made with a random password; the enrolment credential is no longer used\n",
		name, resp.GetBmc().GetUsername(), resp.GetBmc().GetAccountId())
	m.Bmc = resp.GetBmc()
	return m, nil
}
