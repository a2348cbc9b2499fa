package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/internal/paging"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// tokenRoles are the roles `corral token create --role` takes; agent
// tokens are minted by the boot server only.
var tokenRoles = map[string]authv1.Role{
	"viewer":   authv1.Role_ROLE_VIEWER,
	"user":     authv1.Role_ROLE_USER,
	"operator": authv1.Role_ROLE_OPERATOR,
	"admin":    authv1.Role_ROLE_ADMIN,
	"node":     authv1.Role_ROLE_NODE,
}

// tokenCommand groups the token verbs (TokenService, admin only).
func (inv *invocation) tokenCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "token VERB",
		Aliases: []string{"tokens"},
		Short:   "API tokens: create, list, revoke (admin; a revoked token fails its next call)",
		Args:    cobra.ArbitraryArgs,
		RunE:    groupRunE,
	}
	cmd.AddCommand(inv.tokenCreateCommand(), inv.tokenListCommand(), inv.tokenRevokeCommand())
	return cmd
}

// tokenCreateCommand: corral token create --role R [--description D]
// [--ttl 24h] [--node NAME] [--single-use]
func (inv *invocation) tokenCreateCommand() *cobra.Command {
	var (
		role, description, node, output string
		ttl                             time.Duration
		singleUse                       bool
	)
	cmd := &cobra.Command{
		Use:   "create --role ROLE",
		Short: "Create a token and print it once (corrald keeps only its hash)",
		Long: `Create a token and print it on stdout; it cannot be shown again.

Roles: viewer, operator, admin, node. A node token is single-use: Join
consumes it when it issues the node's certificate; --node binds it to the
one node name it may join as. --single-use makes any other token work for
one call. With -o json|yaml the token is printed with its record.`,
		Args: argsBetween(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			r, ok := tokenRoles[strings.ToLower(role)]
			if !ok {
				return usageErrorf("--role %q: want viewer, operator, admin or node", role)
			}
			if ttl < 0 {
				return usageErrorf("--ttl %s: must not be negative", ttl)
			}
			if node != "" && r != authv1.Role_ROLE_NODE {
				return usageErrorf("--node %q: only a node token (--role node) is bound to a node name", node)
			}
			req := &authv1.CreateTokenRequest{Role: r, Description: description, TtlSeconds: int64(ttl / time.Second), Node: node, SingleUse: singleUse}
			if ttl > 0 && req.TtlSeconds == 0 {
				req.TtlSeconds = 1
			}
			var resp *authv1.CreateTokenResponse
			if err := inv.rpc(cmd, "create token", func(ctx context.Context, cc *grpc.ClientConn) (err error) {
				resp, err = authv1.NewTokenServiceClient(cc).CreateToken(ctx, req)
				return err
			}); err != nil {
				return err
			}
			if output == formatTable {
				_, err := fmt.Fprintln(cmd.OutOrStdout(), resp.GetToken())
				return writeErr(err)
			}
			return printRecords(cmd.OutOrStdout(), &kind{name: "token"}, []proto.Message{resp}, false, output)
		},
	}
	f := cmd.Flags()
	f.StringVar(&role, "role", "", "viewer, user, operator, admin or node (required)")
	f.StringVar(&description, "description", "", "what the token is for (shown by list)")
	f.DurationVar(&ttl, "ttl", 0, "lifetime, e.g. 24h (0 = no expiry)")
	f.StringVar(&node, "node", "", "with --role node: the one node name the token may join as")
	f.BoolVar(&singleUse, "single-use", false, "the token works for one call (node tokens: one Join, always)")
	_ = cmd.MarkFlagRequired("role")
	addOutputFlag(cmd, &output)
	return cmd
}

// tokenListCommand: corral token list [--all]
func (inv *invocation) tokenListCommand() *cobra.Command {
	var (
		all    bool
		output string
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List tokens: id, role, bindings, expiry (never a secret); per-boot agent tokens with --all",
		Args:  argsBetween(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			resp := &authv1.ListTokensResponse{}
			if err := inv.rpc(cmd, "list tokens", func(ctx context.Context, cc *grpc.ClientConn) error {
				return paging.All(ctx, 0, func(ctx context.Context, tok string) ([]*authv1.Token, string, error) {
					r, err := authv1.NewTokenServiceClient(cc).ListTokens(ctx, &authv1.ListTokensRequest{IncludeAgent: all, PageSize: paging.MaxSize, PageToken: tok})
					return r.GetTokens(), r.GetNextPageToken(), err
				}, func(t *authv1.Token) error {
					resp.Tokens = append(resp.Tokens, t)
					return nil
				})
			}); err != nil {
				return err
			}
			if output != formatTable {
				ms := make([]proto.Message, len(resp.GetTokens()))
				for i, t := range resp.GetTokens() {
					ms[i] = t
				}
				return printRecords(cmd.OutOrStdout(), &kind{name: "token"}, ms, true, output)
			}
			return writeErr(writeList(cmd.OutOrStdout(), "tokens", []string{"ID", "ROLE", "DESCRIPTION", "BOUND TO", "SINGLE-USE", "CREATED", "EXPIRES"}, tokenRows(resp.GetTokens(), time.Now())))
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "include the per-boot agent tokens of booting machines")
	addOutputFlag(cmd, &output)
	return cmd
}

func tokenRows(ts []*authv1.Token, now time.Time) [][]string {
	rows := make([][]string, 0, len(ts))
	for _, t := range ts {
		bound := "-"
		switch {
		case t.GetNode() != "":
			bound = "node " + t.GetNode()
		case t.GetMachine() != "" || t.GetMac() != "":
			bound = strings.TrimSpace("machine " + t.GetMachine() + " " + t.GetMac())
		}
		single := "no"
		if t.GetSingleUse() || t.GetRole() == authv1.Role_ROLE_NODE {
			single = "yes"
		}
		expires := "never"
		if e := t.GetExpiresUnix(); e != 0 {
			expires = time.Unix(e, 0).UTC().Format(time.RFC3339)
			if now.Unix() >= e {
				expires += " (expired)"
			}
		}
		rows = append(rows, []string{t.GetId(), strings.ToLower(strings.TrimPrefix(t.GetRole().String(), "ROLE_")),
			orDash(t.GetDescription()), bound, single, time.Unix(t.GetCreatedUnix(), 0).UTC().Format(time.RFC3339), expires})
	}
	return rows
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// tokenRevokeCommand: corral token revoke ID
func (inv *invocation) tokenRevokeCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a token by id (from `corral token list`); its next call is refused",
		Args:  argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			if err := inv.rpc(cmd, fmt.Sprintf("revoke token %s", id), func(ctx context.Context, cc *grpc.ClientConn) error {
				_, err := authv1.NewTokenServiceClient(cc).RevokeToken(ctx, &authv1.RevokeTokenRequest{Id: id})
				return err
			}); err != nil {
				return err
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "token %s revoked\n", id)
			return writeErr(err)
		},
	}
}
