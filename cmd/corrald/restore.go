package main

import (
	"bytes"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/corralhq/corral/appliance"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/internal/progress"
)

// Backups name the corrald that wrote them.
func init() { appliance.Version = version }

// newRestoreCmd is `corrald restore FILE`: a backup made by `corral
// backup` becomes a new data directory.
func newRestoreCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "restore FILE --data-dir D --passphrase-file P",
		Short: "Restore a backup (corral backup) into a new data directory (offline)",
		Long: `Restore a backup made by 'corral backup' into a new data directory.

The data directory must not exist or be empty: restore never merges or
overwrites. It decrypts FILE with the passphrase (the first line of
--passphrase-file), checks its header and counts, and writes a bbolt store
holding every backed-up record (same keys and values; the revisions are the
new store's), the CA certificate and key, the BMC seal key, the cluster key
(a backup of an etcd fleet) and admin.conf. Everything is written into a
temporary directory beside D and moved into place at the end, so a wrong
passphrase or a truncated or altered file writes nothing.

The boot images are not in the backup: it lists them (names, sizes,
SHA-256); import them with 'corrald images import' or rebuild them with
'corrald images build'. Then start 'corrald serve --data-dir D'.

With --store etcd the records go to the etcd cluster instead (its prefix
must hold none), once the whole file has been checked; the data directory
gets the CA, the seal key and the cluster key, as an appliance of that
fleet needs. A failure removes the records it wrote.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return apierr.Invalidf("restore takes one backup file: usage: %s", cmd.UseLine())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			dataDir, _ := cmd.Flags().GetString("data-dir")
			passFile, _ := cmd.Flags().GetString("passphrase-file")
			if passFile == "" {
				return apierr.Invalidf("restore needs --passphrase-file P (its first line is the passphrase)")
			}
			b, err := os.ReadFile(passFile)
			if err != nil {
				return apierr.Invalidf("--passphrase-file: %v", err)
			}
			pass, _, _ := bytes.Cut(b, []byte("\n"))
			pass = bytes.TrimSuffix(pass, []byte("\r"))
			log, err := newLogger(cmd)
			if err != nil {
				return err
			}
			sc := storeAccessConfig(cmd)
			if sc.Kind != appliance.StoreBolt && sc.Kind != appliance.StoreEtcd {
				return apierr.Invalidf("--store %q: use %s or %s", sc.Kind, appliance.StoreBolt, appliance.StoreEtcd)
			}
			if sc.Kind == appliance.StoreEtcd && len(sc.Etcd.Endpoints) == 0 {
				return apierr.Invalidf("--store etcd needs --etcd-endpoints")
			}
			res, err := appliance.Restore(cmd.Context(), appliance.RestoreOptions{
				File: args[0], DataDir: dataDir, Passphrase: pass, Store: sc,
				Progress: progress.New(cmd.ErrOrStderr()), Logger: log,
			})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "restored %s\n%d records into %s; into %s: %s\n", res.Header.String(), res.Records, res.Store, res.DataDir, strings.Join(res.Files, ", "))
			if len(res.Images) > 0 {
				fmt.Fprintf(out, "boot images to import or rebuild (not in the backup):\n")
				for _, im := range res.Images {
					fmt.Fprintf(out, "  %s  %s  %s\n", im.SHA256, progress.Bytes(im.Size), im.Name)
				}
			}
			start := "corrald serve --data-dir " + res.DataDir
			if sc.Kind == appliance.StoreEtcd {
				start += " --store etcd --etcd-endpoints " + strings.Join(sc.Etcd.Endpoints, ",") + " --etcd-prefix " + sc.Etcd.Prefix
			}
			fmt.Fprintf(out, "start it with: %s\n", start)
			return nil
		},
	}
	cmd.Flags().String("passphrase-file", "", "file whose first line is the backup's passphrase (env CORRAL_PASSPHRASE_FILE)")
	addStoreAccessFlags(cmd)
	return cmd
}
