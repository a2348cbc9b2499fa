package cli

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
)

// standbyPoolKind prints standby pools. It is not a kind of the deploy
// registry (corral do does not know it): pools have verbs of their own
// under `corral pool`, and `corral get` lists them (standbyPoolNames).
var standbyPoolKind = &kind{
	name:    "standbypool",
	columns: []string{"NAME", "READINESS", "MIN_READY", "READY", "BOOTED", "WARMING", "ALLOCATED", "DEFICIT", "LAST_ACTION"},
	row: func(m proto.Message) []string {
		p := m.(*inventoryv1.StandbyPool)
		st := p.GetStatus()
		return []string{p.GetName(), readinessWord(p.GetReadiness()), fmt.Sprint(p.GetMinReady()), fmt.Sprint(st.GetReady()),
			fmt.Sprint(st.GetBooted()), fmt.Sprint(st.GetWarming()), fmt.Sprint(st.GetAllocated()), fmt.Sprint(st.GetDeficit()), cell(st.GetLastAction())}
	},
	wide: []string{"SELECTOR", "ERASE", "AUTO_ACCEPT", "READY_MACHINES", "CONDITIONS"},
	wideRow: func(m proto.Message) []string {
		p := m.(*inventoryv1.StandbyPool)
		return []string{cell(p.GetSelector()), eraseWord(p.GetErase()), fmt.Sprint(p.GetAutoAccept()),
			cell(strings.Join(p.GetStatus().GetReadyMachines(), ",")), cell(strings.Join(p.GetStatus().GetConditions(), "; "))}
	},
	page: func(ctx context.Context, cc grpc.ClientConnInterface, q pageQuery) ([]proto.Message, string, error) {
		resp, err := inventoryv1.NewStandbyPoolServiceClient(cc).ListStandbyPools(ctx, &inventoryv1.ListStandbyPoolsRequest{PageSize: q.size, PageToken: q.token})
		return messages(resp.GetPools()), resp.GetNextPageToken(), err
	},
	get: func(ctx context.Context, cc grpc.ClientConnInterface, name string) (proto.Message, error) {
		resp, err := inventoryv1.NewStandbyPoolServiceClient(cc).GetStandbyPool(ctx, &inventoryv1.GetStandbyPoolRequest{Name: name})
		return resp.GetPool(), err
	},
	del: func(ctx context.Context, cc grpc.ClientConnInterface, name string) error {
		_, err := inventoryv1.NewStandbyPoolServiceClient(cc).DeleteStandbyPool(ctx, &inventoryv1.DeleteStandbyPoolRequest{Name: name})
		return err
	},
}

// standbyPoolNames are the names get accepts for standbyPoolKind.
var standbyPoolNames = []string{"standbypool", "standbypools", "standby_pool", "standby_pools", "pool", "pools"}

func readinessWord(r inventoryv1.Readiness) string {
	switch r {
	case inventoryv1.Readiness_READINESS_BOOTED:
		return "booted"
	case inventoryv1.Readiness_READINESS_POWERED_OFF:
		return "off"
	default:
		return "-"
	}
}

func eraseWord(e inventoryv1.EraseLevel) string {
	if e == inventoryv1.EraseLevel_ERASE_LEVEL_DEFAULT {
		return "none"
	}
	return strings.ToLower(strings.TrimPrefix(e.String(), "ERASE_LEVEL_"))
}

// standbyPoolFile is a pool's apply file.
type standbyPoolFile struct {
	Name     string `json:"name"`
	Selector string `json:"selector"`
	MinReady int32  `json:"min_ready"`
	// Readiness is a word, or false: YAML 1.1 reads an unquoted off as
	// a boolean.
	Readiness  any    `json:"readiness"`
	Erase      string `json:"erase"`
	AutoAccept bool   `json:"auto_accept"`
}

// parseStandbyPool reads a pool's YAML apply file. Unknown fields and
// words are usage errors; the appliance checks the rest (min_ready,
// selector).
func parseStandbyPool(data []byte) (*inventoryv1.StandbyPool, error) {
	var f standbyPoolFile
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, usageErrorf("pool file: %v", err)
	}
	if f.Name == "" {
		return nil, usageErrorf("pool file: name is required")
	}
	p := &inventoryv1.StandbyPool{Name: f.Name, Selector: f.Selector, MinReady: f.MinReady, AutoAccept: f.AutoAccept}
	word, _ := f.Readiness.(string)
	if b, ok := f.Readiness.(bool); ok && !b {
		word = "off"
	}
	switch strings.ToLower(word) {
	case "booted":
		p.Readiness = inventoryv1.Readiness_READINESS_BOOTED
	case "off", "powered_off", "powered-off":
		p.Readiness = inventoryv1.Readiness_READINESS_POWERED_OFF
	default:
		return nil, usageErrorf("pool file: readiness %v: want booted or off", f.Readiness)
	}
	switch strings.ToLower(f.Erase) {
	case "", "none":
		p.Erase = inventoryv1.EraseLevel_ERASE_LEVEL_NONE
	case "quick":
		p.Erase = inventoryv1.EraseLevel_ERASE_LEVEL_QUICK
	case "full":
		p.Erase = inventoryv1.EraseLevel_ERASE_LEVEL_FULL
	case "secure":
		p.Erase = inventoryv1.EraseLevel_ERASE_LEVEL_SECURE
	default:
		return nil, usageErrorf("pool file: erase %q: want none, quick, full or secure", f.Erase)
	}
	return p, nil
}

// standbyPoolCommand groups the standby pool verbs.
func (inv *invocation) standbyPoolCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "pool VERB",
		Aliases: []string{"pools", "standbypool", "standbypools"},
		Short:   "Standby pools: keep min_ready machines of a pool READY, powered off or booted into discovery",
		Long: `A standby pool named P keeps at least min_ready of the machines whose pool is P
(set with "corral label machine NAME pool=P", plus the pool's optional
selector) READY for allocation. The appliance's controller accepts matching
INVENTORIED machines into the pool when auto_accept is set, and powers READY
machines on into the discovery agent (readiness booted: a deploy starts at
once) or off (readiness off) through their BMC. An allocation takes one; the
pool refills. Release erases the pool's machines at its erase level by
default.`,
		Args: cobra.ArbitraryArgs,
		RunE: groupRunE,
	}
	cmd.AddCommand(inv.poolApplyCommand(), inv.poolListCommand(), inv.poolGetCommand(), inv.poolDeleteCommand())
	return cmd
}

func (inv *invocation) poolApplyCommand() *cobra.Command {
	var file, output string
	cmd := &cobra.Command{
		Use:   "apply -f FILE",
		Short: "Create a standby pool or replace its spec from a YAML file, and print it",
		Long: `The file says (only name and readiness are required):

  name: ci              # the pool: machines whose pool is ci
  selector: zone=a      # optional extra selector terms
  min_ready: 2          # READY machines to hold
  readiness: booted     # booted (into discovery) or off (powered off)
  erase: quick          # release's default: none, quick, full or secure
  auto_accept: true     # accept INVENTORIED machines of the pool

-f - reads the file from standard input.`,
		Args: argsBetween(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			if file == "" {
				return usageErrorf("apply needs -f FILE")
			}
			data, err := readInput(cmd.InOrStdin(), file)
			if err != nil {
				return err
			}
			p, err := parseStandbyPool(data)
			if err != nil {
				return err
			}
			var out *inventoryv1.StandbyPool
			if err := inv.rpc(cmd, "apply "+standbyPoolKind.subject(p.GetName()), func(ctx context.Context, cc *grpc.ClientConn) error {
				resp, err := inventoryv1.NewStandbyPoolServiceClient(cc).ApplyStandbyPool(ctx, &inventoryv1.ApplyStandbyPoolRequest{Pool: p})
				out = resp.GetPool()
				return err
			}); err != nil {
				return err
			}
			return printRecord(cmd, standbyPoolKind, out, output)
		},
	}
	cmd.Flags().StringVarP(&file, "filename", "f", "", "the pool's YAML file (- for standard input)")
	addOutputFlag(cmd, &output)
	return cmd
}

func (inv *invocation) poolListCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List standby pools with their status",
		Args:    argsBetween(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkGetFormat(output); err != nil {
				return err
			}
			var ms []proto.Message
			if err := inv.rpc(cmd, "list "+standbyPoolKind.plural(), func(ctx context.Context, cc *grpc.ClientConn) error {
				var err error
				ms, err = standbyPoolKind.listAll(ctx, cc, pageQuery{}, 0)
				return err
			}); err != nil {
				return err
			}
			return printRecords(cmd.OutOrStdout(), standbyPoolKind, ms, true, output)
		},
	}
	addGetOutputFlag(cmd, &output)
	return cmd
}

func (inv *invocation) poolGetCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "get NAME",
		Short: "Show one standby pool with its status",
		Args:  argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkGetFormat(output); err != nil {
				return err
			}
			var m proto.Message
			if err := inv.rpc(cmd, "get "+standbyPoolKind.subject(args[0]), func(ctx context.Context, cc *grpc.ClientConn) error {
				var err error
				m, err = standbyPoolKind.get(ctx, cc, args[0])
				return err
			}); err != nil {
				return err
			}
			return printRecord(cmd, standbyPoolKind, m, output)
		},
	}
	addGetOutputFlag(cmd, &output)
	return cmd
}

func (inv *invocation) poolDeleteCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a standby pool (its machines stay as they are)",
		Args:  argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := inv.rpc(cmd, "delete "+standbyPoolKind.subject(args[0]), func(ctx context.Context, cc *grpc.ClientConn) error {
				return standbyPoolKind.del(ctx, cc, args[0])
			}); err != nil {
				return err
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "%s/%s deleted\n", standbyPoolKind.name, args[0])
			return writeErr(err)
		},
	}
}
