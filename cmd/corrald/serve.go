package main

import (
	"github.com/corralhq/corral/cmd/corrald/server"
	"github.com/spf13/cobra"
)

func newServeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the Corral API (creates CA, certificate and admin.conf on first start)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(cmd)
			if err != nil {
				return err
			}
			dataDir, _ := cmd.Flags().GetString("data-dir")
			listen, _ := cmd.Flags().GetString("api-listen")
			sans, _ := cmd.Flags().GetStringSlice("api-san")
			boot, err := bootConfig(cmd)
			if err != nil {
				return err
			}
			bmc, err := bmcConfig(cmd)
			if err != nil {
				return err
			}
			srv, err := server.New(server.Config{DataDir: dataDir, APIListen: listen, APISANs: sans, Logger: log, Boot: boot, BMC: bmc})
			if err != nil {
				return err
			}
			return srv.Run(cmd.Context())
		},
	}
	cmd.Flags().String("api-listen", ":20180", "gRPC API listen address (env CORRAL_API_LISTEN)")
	cmd.Flags().StringSlice("api-san", nil, "extra host name or address for the server certificate, repeatable (env CORRAL_API_SAN, comma-separated)")
	addBootFlags(cmd)
	addBMCFlags(cmd)
	return cmd
}
