package main

import (
	"fmt"
	"strings"
	"time"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/appliance"
	"github.com/corralhq/corral/auth"
	"github.com/corralhq/corral/auth/pki"
	"github.com/corralhq/corral/inventory"
	"github.com/spf13/cobra"
)

var roleNames = map[string]authv1.Role{
	"viewer":   authv1.Role_ROLE_VIEWER,
	"user":     authv1.Role_ROLE_USER,
	"operator": authv1.Role_ROLE_OPERATOR,
	"admin":    authv1.Role_ROLE_ADMIN,
	"node":     authv1.Role_ROLE_NODE,
	"agent":    authv1.Role_ROLE_AGENT,
}

// newTokenCmd is `corrald token`: the offline bootstrap (the store is
// opened directly, so corrald must be stopped). While corrald runs, use
// `corral token create|list|revoke` (TokenService).
func newTokenCmd(g *globals) *cobra.Command {
	var roleName, desc, node string
	var ttl time.Duration
	var single bool
	var sc appliance.StoreConfig
	tok := &cobra.Command{Use: "token", Short: "Create API tokens offline, against the data dir (corrald stopped; while it runs use `corral token`)"}
	create := &cobra.Command{
		Use:   "create",
		Short: "Create a token and print it (only its hash is stored)",
		Long: `Create a token and print it; only its hash is stored.

Node tokens are single-use (Join consumes them); --node binds one to the
only node name it may join as. --single-use makes any other token work
for one call.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			role, ok := roleNames[strings.ToLower(roleName)]
			if !ok {
				return fmt.Errorf("--role %q: want one of viewer, operator, admin, node, agent", roleName)
			}
			if ttl < 0 {
				return fmt.Errorf("--ttl must not be negative")
			}
			if node != "" {
				if role != authv1.Role_ROLE_NODE {
					return fmt.Errorf("--node %q: only a node token (--role node) is bound to a node name", node)
				}
				if err := inventory.CheckName(node); err != nil {
					return fmt.Errorf("--node: %w", err)
				}
				if err := pki.CheckNodeName(node); err != nil {
					return fmt.Errorf("--node: %w", err)
				}
			}
			if role == authv1.Role_ROLE_AGENT && single {
				return fmt.Errorf("--single-use: agent tokens cannot be single-use")
			}
			log, err := g.logger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			st, err := appliance.OpenConfiguredStore(cmd.Context(), g.dataDir, sc, log)
			if err != nil {
				return fmt.Errorf("%w (is corrald running on this data dir? stop it first, or use `corral token create`)", err)
			}
			defer st.Close()
			tokens := &auth.Tokens{Store: st}
			var t string
			if role == authv1.Role_ROLE_AGENT {
				// An agent token made by hand is bound to no machine.
				t, err = tokens.Create(cmd.Context(), role, desc, ttl)
			} else {
				t, _, err = tokens.CreateBound(cmd.Context(), auth.TokenSpec{Role: role, Description: desc, TTL: ttl, Node: node, SingleUse: single})
			}
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), t)
			return nil
		},
	}
	create.Flags().StringVar(&roleName, "role", "", "role: viewer, user, operator, admin, node or agent (required)")
	create.Flags().StringVar(&desc, "description", "", "what the token is for")
	create.Flags().DurationVar(&ttl, "ttl", 0, "lifetime, e.g. 720h (0 = no expiry)")
	create.Flags().StringVar(&node, "node", "", "with --role node: the one node name the token may join as")
	create.Flags().BoolVar(&single, "single-use", false, "the token works once (node tokens always do)")
	addStoreAccessFlags(create.Flags(), &sc)
	_ = create.MarkFlagRequired("role")
	tok.AddCommand(create)
	return tok
}
