package main

import (
	"fmt"
	"strings"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/auth"
	"github.com/corralhq/corral/internal/server"
	"github.com/spf13/cobra"
)

var roleNames = map[string]authv1.Role{
	"viewer":   authv1.Role_ROLE_VIEWER,
	"operator": authv1.Role_ROLE_OPERATOR,
	"admin":    authv1.Role_ROLE_ADMIN,
	"node":     authv1.Role_ROLE_NODE,
	"agent":    authv1.Role_ROLE_AGENT,
}

func newTokenCmd() *cobra.Command {
	tok := &cobra.Command{Use: "token", Short: "Manage API tokens (offline, against the data dir)"}
	create := &cobra.Command{
		Use:   "create",
		Short: "Create a token and print it (only its hash is stored)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			roleName, _ := cmd.Flags().GetString("role")
			role, ok := roleNames[strings.ToLower(roleName)]
			if !ok {
				return fmt.Errorf("--role %q: want one of viewer, operator, admin, node, agent", roleName)
			}
			desc, _ := cmd.Flags().GetString("description")
			ttl, _ := cmd.Flags().GetDuration("ttl")
			if ttl < 0 {
				return fmt.Errorf("--ttl must not be negative")
			}
			log, err := newLogger(cmd)
			if err != nil {
				return err
			}
			dataDir, _ := cmd.Flags().GetString("data-dir")
			st, err := server.OpenStore(dataDir, log)
			if err != nil {
				return fmt.Errorf("%w (is corrald running on this data dir? stop it first)", err)
			}
			defer st.Close()
			t, err := (&auth.Tokens{Store: st}).Create(cmd.Context(), role, desc, ttl)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), t)
			return nil
		},
	}
	create.Flags().String("role", "", "role: viewer, operator, admin, node or agent (required)")
	create.Flags().String("description", "", "what the token is for")
	create.Flags().Duration("ttl", 0, "lifetime, e.g. 720h (0 = no expiry)")
	_ = create.MarkFlagRequired("role")
	tok.AddCommand(create)
	return tok
}
