package cli

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func init() {
	machineVerbs = append(machineVerbs, (*invocation).allocateCommand, (*invocation).machineReleaseCommand)
}

// parseExpiry reads --expires: a Go duration (90m, 8h) or whole days (7d).
func parseExpiry(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	if d, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(d)
		if err != nil || n <= 0 {
			return 0, usageErrorf("--expires %q: want a positive duration such as 90m, 8h or 7d", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, usageErrorf("--expires %q: want a positive duration such as 90m, 8h or 7d", s)
	}
	return d, nil
}

// allocateCommand: corral machine allocate --selector S [--pool P] [--count N] [--expires D]
func (inv *invocation) allocateCommand() *cobra.Command {
	var selector, pool, expires, output string
	var count uint32
	cmd := &cobra.Command{
		Use:   "allocate [--selector S] [--pool P] [--count N] [--expires D]",
		Short: "Claim READY machines for yourself",
		Long: `allocate claims free (READY) machines that match the selector for the
caller, all or none: --count 3 gets three machines or an error. Of
concurrent allocations for the same machines, each machine goes to exactly
one. The selector combines facts, labels (label.KEY), zone and pool, comma-
separated: 'pool=ci,zone=a,cpu.cores>=16,disks.count>=2'.

--expires releases the machines on their own that long after (90m, 8h, 7d);
the machine then says why (corral describe machine NAME). A caller that is
not an operator sees and releases only the machines it holds.`,
		Args: argsBetween(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			d, err := parseExpiry(expires)
			if err != nil {
				return err
			}
			req := &inventoryv1.AllocateMachinesRequest{Selector: selector, Pool: pool, Count: count}
			if d > 0 {
				req.ExpiresIn = durationpb.New(d)
			}
			var resp *inventoryv1.AllocateMachinesResponse
			if err := inv.rpc(cmd, "allocate machines", func(ctx context.Context, cc *grpc.ClientConn) (err error) {
				resp, err = inventoryv1.NewMachineServiceClient(cc).AllocateMachines(ctx, req)
				return err
			}); err != nil {
				return err
			}
			if output != formatTable {
				return printRecords(cmd.OutOrStdout(), machineKind, messages(resp.GetMachines()), true, output)
			}
			var b strings.Builder
			for _, m := range resp.GetMachines() {
				fmt.Fprintf(&b, "machine %s: ALLOCATED%s\n", m.GetName(), allocationWords(m.GetAllocation()))
			}
			_, err = fmt.Fprint(cmd.OutOrStdout(), b.String())
			return writeErr(err)
		},
	}
	cmd.Flags().StringVarP(&selector, "selector", "l", "", "what to allocate: KEY OP VALUE terms, comma-separated, over facts, labels (label.KEY), zone and pool")
	cmd.Flags().StringVar(&pool, "pool", "", "only machines of this pool (short for pool=P in the selector)")
	cmd.Flags().Uint32Var(&count, "count", 1, "how many machines, all or none")
	cmd.Flags().StringVar(&expires, "expires", "", "release the machines on their own after this long (90m, 8h, 7d; default never)")
	addOutputFlag(cmd, &output)
	return cmd
}

// allocationWords is " to OWNER until T" for an allocation line.
func allocationWords(a *inventoryv1.Allocation) string {
	s := " to " + a.GetOwner()
	if n := a.GetOwnerName(); n != "" {
		s += " (" + n + ")"
	}
	if e := a.GetExpiresAt(); e != nil {
		s += " until " + e.AsTime().UTC().Format(time.RFC3339)
	}
	return s
}

// machineReleaseCommand: corral machine release NAME [--erase LEVEL] [--reason R]
func (inv *invocation) machineReleaseCommand() *cobra.Command {
	var reason, erase, output string
	cmd := &cobra.Command{
		Use:   "release NAME [--erase quick|full|secure|none] [--reason R]",
		Short: "End an allocation: the machine's disks are erased and it returns to READY",
		Long: `release ends the machine's allocation: its owner or an operator may.

--erase says how its disks are erased before it is free again: quick
(partition tables and filesystem, RAID and LVM signatures), full (every
block discarded where the disk supports it, else zeroed), secure (the
disk's own erase: NVMe format or sanitize, ATA secure erase; refused by
the agent, with the reason, on a disk without one) or none. Without
--erase the machine's standby pool's level applies (none outside a pool
that erases). An erase makes the machine RELEASING: its discovery agent
erases every disk (the machine is power-cycled into network boot through
its BMC; without one, network-boot it by hand) and it returns to READY
once the erase succeeded, powered off when it has a BMC. An erase that
fails leaves it FAILED with the reason, out of its pool, until an
operator erases it again with release NAME --erase LEVEL.

Without an erase the machine is READY at once and its disks keep what
the owner left on them. A machine with an operating system deployed
boots discovery again either way.`,
		Args: argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			level, err := parseEraseLevel(erase)
			if err != nil {
				return err
			}
			return inv.machineRPC(cmd, fmt.Sprintf("release machine %q", name), output, func(ctx context.Context, c inventoryv1.MachineServiceClient) (*inventoryv1.Machine, error) {
				return c.ReleaseMachine(ctx, &inventoryv1.ReleaseMachineRequest{Name: name, Reason: reason, Erase: level})
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, recorded with the release")
	cmd.Flags().StringVar(&erase, "erase", "", "erase the disks first: quick, full, secure or none (default: the machine's standby pool's level)")
	addOutputFlag(cmd, &output)
	return cmd
}

// parseEraseLevel reads --erase ("" is the pool's default).
func parseEraseLevel(s string) (inventoryv1.EraseLevel, error) {
	switch s {
	case "":
		return inventoryv1.EraseLevel_ERASE_LEVEL_DEFAULT, nil
	case "none", "quick", "full", "secure":
		return inventoryv1.EraseLevel(inventoryv1.EraseLevel_value["ERASE_LEVEL_"+strings.ToUpper(s)]), nil
	}
	return 0, usageErrorf("--erase %q: want quick, full, secure or none", s)
}

// eraseNote sums up a machine's erase for describe: level and disks,
// then how it stands ("" without an erase).
func eraseNote(m *inventoryv1.Machine) string {
	e := m.GetErase()
	if e.GetEraseId() == "" {
		return ""
	}
	level := strings.ToLower(strings.TrimPrefix(e.GetLevel().String(), "ERASE_LEVEL_"))
	s := level + " of " + strings.Join(e.GetDisks(), ", ")
	stamp := func(t *timestamppb.Timestamp) string { return t.AsTime().UTC().Format(time.RFC3339) }
	switch {
	case e.GetError() != "":
		s += ": failed at " + stamp(e.GetFinishedAt()) + ": " + e.GetError()
	case e.GetFinishedAt() != nil:
		s += ": erased at " + stamp(e.GetFinishedAt())
	case e.GetStep() != "":
		s += ": " + e.GetStep()
		if d := e.GetDetail(); d != "" {
			s += " (" + d + ")"
		}
		s += " at " + stamp(e.GetUpdatedAt())
	case e.GetSentAt() != nil:
		s += ": sent to the discovery agent at " + stamp(e.GetSentAt())
	default:
		s += ": waiting for the discovery agent since " + stamp(e.GetRequestedAt())
	}
	return s
}

// labelCommand: corral label machine NAME KEY=VALUE... KEY-...
func (inv *invocation) labelCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "label machine NAME KEY=VALUE... [KEY-...]",
		Short: "Set and remove a machine's labels, zone and pool",
		Long: `label sets (KEY=VALUE) and removes (KEY-) labels on a machine, in one
compare-and-swap on its record. The keys zone and pool set the machine's
zone and pool: corral label machine m1 zone=a pool=ci rack=r12.

A key is an optional DNS-style prefix and '/' and a name of up to 63
letters, digits, '.', '_' or '-'; a value is empty or up to 63 of the same.
Selectors name labels as label.KEY: --selector 'pool=ci,label.rack=r12'.`,
		Args: argsBetween(3, 2+2*64),
		RunE: func(cmd *cobra.Command, args []string) error {
			if k, err := kindArg(args[0]); err != nil {
				return err
			} else if k != machineKind {
				return usageErrorf("label takes machines only (got %s)", k.name)
			}
			name := args[1]
			req := &inventoryv1.LabelMachineRequest{Name: name, Set: map[string]string{}}
			for _, a := range args[2:] {
				if k, ok := strings.CutSuffix(a, "-"); ok && !strings.Contains(a, "=") {
					req.Remove = append(req.Remove, k)
					continue
				}
				k, v, ok := strings.Cut(a, "=")
				if !ok {
					return usageErrorf("%q: want KEY=VALUE to set or KEY- to remove", a)
				}
				if _, dup := req.Set[k]; dup {
					return usageErrorf("%q: label %s given twice", a, k)
				}
				req.Set[k] = v
			}
			return inv.machineRPC(cmd, fmt.Sprintf("label machine %q", name), output, func(ctx context.Context, c inventoryv1.MachineServiceClient) (*inventoryv1.Machine, error) {
				return c.LabelMachine(ctx, req)
			})
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}
