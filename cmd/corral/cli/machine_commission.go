package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
)

func init() { machineVerbs = append(machineVerbs, (*invocation).commissionCommand) }

// commissionCommand: corral machine commission NAME [--profile P] [--wait]
// and corral machine commission clear NAME.
func (inv *invocation) commissionCommand() *cobra.Command {
	var profile, output string
	var wait bool
	cmd := &cobra.Command{
		Use:   "commission NAME | clear NAME",
		Short: "Run hardware tests on a machine with its discovery agent (SMART, memtester, stress-ng, fio, NIC link), or clear a failure",
		Long: `commission has the machine's discovery agent run the tests of a profile
with real tools: smartctl health (and a short self-test in full), a
memtester pass, stress-ng on every CPU, a read-only fio read of every disk,
and every NIC's link speed and duplex. The plan goes to the agent at once
when its session is up; otherwise the machine is power-cycled into network
boot through its BMC (or waits to be network-booted). Profiles: quick (16
MiB of memtester, 10 s of stress-ng, 5 s of fio per disk), full (a
burn-in: a SMART self-test, 1 GiB of memtester twice, 10 minutes of
stress-ng, a minute of fio per disk, full duplex), link-10g (quick, and
every NIC at 10 Gb/s or more, full duplex).

A machine whose commissioning is running or failed cannot be accepted or
allocated until it passes or an operator runs 'corral machine commission
clear NAME'. 'corral describe machine NAME' shows every test's result and
an excerpt of its output.`,
		Args: argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			name := args[0]
			var m *inventoryv1.Machine
			err := inv.rpc(cmd, fmt.Sprintf("commission machine %q", name), func(ctx context.Context, cc *grpc.ClientConn) (err error) {
				m, err = inventoryv1.NewCommissionServiceClient(cc).CommissionMachine(ctx, &inventoryv1.CommissionMachineRequest{Name: name, Profile: profile})
				return err
			})
			if err != nil {
				return err
			}
			if wait {
				if m, err = inv.waitCommission(cmd, name, m.GetCommission().GetCommissionId()); err != nil {
					return err
				}
			}
			if output != formatTable {
				return printMachine(cmd, m, output)
			}
			if err := commissionNotes(cmd.OutOrStdout(), m, wait); err != nil {
				return err
			}
			if wait && m.GetCommission().GetStatus() == "failed" {
				return failf("machine %q failed commissioning", name)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&profile, "profile", "quick", "the tests to run: quick, full or link-10g")
	cmd.Flags().BoolVar(&wait, "wait", false, "follow the commissioning until it passes or fails (exit 1 when it fails)")
	addOutputFlag(cmd, &output)
	cmd.AddCommand(inv.commissionClearCommand())
	return cmd
}

func (inv *invocation) commissionClearCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "clear NAME",
		Short: "Let a machine whose commissioning failed be accepted and allocated again (its results are kept)",
		Args:  argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			name := args[0]
			var m *inventoryv1.Machine
			if err := inv.rpc(cmd, fmt.Sprintf("clear the commissioning of machine %q", name), func(ctx context.Context, cc *grpc.ClientConn) (err error) {
				m, err = inventoryv1.NewCommissionServiceClient(cc).ClearCommission(ctx, &inventoryv1.ClearCommissionRequest{Name: name})
				return err
			}); err != nil {
				return err
			}
			return printMachine(cmd, m, output)
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

// waitCommission polls machine name until commissioning id passes or
// fails, printing each new test on stderr.
func (inv *invocation) waitCommission(cmd *cobra.Command, name, id string) (*inventoryv1.Machine, error) {
	seen := 0
	for {
		var m *inventoryv1.Machine
		if err := inv.rpc(cmd, fmt.Sprintf("get machine %q", name), func(ctx context.Context, cc *grpc.ClientConn) (err error) {
			m, err = inventoryv1.NewMachineServiceClient(cc).GetMachine(ctx, &inventoryv1.GetMachineRequest{Name: name})
			return err
		}); err != nil {
			return nil, err
		}
		c := m.GetCommission()
		if c.GetCommissionId() != id {
			return nil, failf("machine %q: commissioning %s was replaced by %s", name, id, cmp0(c.GetCommissionId(), "none"))
		}
		for _, t := range c.GetTests()[min(seen, len(c.GetTests())):] {
			fmt.Fprintln(inv.app.stderr(), "machine "+name+": "+testLine(t))
		}
		seen = len(c.GetTests())
		if s := c.GetStatus(); s == "passed" || s == "failed" {
			return m, nil
		}
		select {
		case <-cmd.Context().Done():
			return nil, failf("waiting for machine %q: %v", name, cmd.Context().Err())
		case <-time.After(time.Second):
		}
	}
}

func testLine(t *inventoryv1.CommissionTest) string {
	return fmt.Sprintf("%s: %s (%s): %s", strings.TrimSpace(t.GetName()+" "+t.GetTarget()), t.GetResult(),
		(time.Duration(t.GetDurationMs()) * time.Millisecond).Round(time.Millisecond*100), t.GetSummary())
}

// commissionWords is one line on a machine's commissioning.
func commissionWords(c *inventoryv1.Commission) string {
	s := fmt.Sprintf("%s (profile %s): %s", c.GetCommissionId(), c.GetProfile(), c.GetStatus())
	if c.GetError() != "" {
		s += ": " + c.GetError()
	}
	if c.GetCleared() {
		s += fmt.Sprintf(" (cleared by %s)", c.GetClearedBy())
	}
	if d := c.GetFinishedAt().AsTime().Sub(c.GetRequestedAt().AsTime()); c.GetFinishedAt() != nil && d > 0 {
		s += fmt.Sprintf(", %s", d.Round(time.Second))
	}
	return s
}

// commissionNotes prints a machine's commissioning and, with tests, one
// line per test (the App's stdout escapes what the agent sent).
func commissionNotes(w io.Writer, m *inventoryv1.Machine, tests bool) error {
	c := m.GetCommission()
	if c == nil {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# commissioning %s\n", commissionWords(c))
	if tests {
		for _, t := range c.GetTests() {
			fmt.Fprintf(&b, "#   %s\n", testLine(t))
		}
	}
	_, err := io.WriteString(w, b.String())
	return writeErr(err)
}
