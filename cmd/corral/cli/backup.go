package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	adminv1 "github.com/corralhq/corral/api/admin/v1"
	"github.com/corralhq/corral/internal/progress"
)

// minPassphrase is the shortest backup passphrase corrald takes.
const minPassphrase = 12

// backupCommand: corral backup -o FILE --passphrase-file P
func (inv *invocation) backupCommand() *cobra.Command {
	var out, passFile string
	cmd := &cobra.Command{
		Use:   "backup -o FILE --passphrase-file P",
		Short: "Write an encrypted backup of the appliance (admin): store, CA, BMC seal key, image manifest",
		Long: `Write an encrypted backup of the appliance to FILE (mode 0600).

corrald reads every store record at one revision while it keeps running, adds
its CA certificate and key, the boot CA (HTTPS boot, if made), the BMC
seal key, the cluster key (etcd), its
admin.conf and the list of its boot images (names, sizes, SHA-256; not the
images: re-import or rebuild them after a restore), and encrypts all of it
with the passphrase (age, scrypt) before the first byte leaves it.

The passphrase is the first line of the --passphrase-file (at least 12
bytes). The file is written as FILE.partial and renamed to FILE only when
the byte count and SHA-256 corrald reports match what arrived; an
interrupted backup leaves no FILE. Progress goes to stderr. --timeout bounds
the wait for each message of the stream, not the whole backup.

Restore with: corrald restore FILE --data-dir NEW_DIR --passphrase-file P`,
		Args: argsBetween(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return usageErrorf("backup needs -o FILE")
			}
			if passFile == "" {
				return usageErrorf("backup needs --passphrase-file P (its first line is the passphrase)")
			}
			pass, err := readPassphrase(passFile)
			if err != nil {
				return err
			}
			if _, err := os.Lstat(out); err == nil {
				return usageErrorf("-o %s already exists: name a new file (a backup never overwrites one)", out)
			}
			return inv.backup(cmd, out, pass)
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "file to write the backup to (must not exist)")
	cmd.Flags().StringVar(&passFile, "passphrase-file", "", "file whose first line is the passphrase (at least 12 bytes)")
	return cmd
}

// readPassphrase reads the first line of path.
func readPassphrase(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fileErrorf("--passphrase-file", err)
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	line = bytes.TrimSuffix(line, []byte("\r"))
	if len(line) < minPassphrase {
		return nil, usageErrorf("--passphrase-file %s: the passphrase (its first line) is %d bytes: use at least %d", path, len(line), minPassphrase)
	}
	return line, nil
}

func (inv *invocation) backup(cmd *cobra.Command, out string, pass []byte) (err error) {
	cc, err := inv.connect(cmd.Flags())
	if err != nil {
		return err
	}
	partial := out + ".partial"
	f, err := os.OpenFile(partial, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return failf("backup: %v", err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(partial)
		}
	}()

	ctx, cancel := context.WithCancelCause(cmd.Context())
	defer cancel(nil)
	idle := time.AfterFunc(inv.timeout, func() {
		cancel(fmt.Errorf("corrald sent nothing for %s (--timeout)", inv.timeout))
	})
	defer idle.Stop()
	stream, err := adminv1.NewBackupServiceClient(cc).Backup(ctx, &adminv1.BackupRequest{Passphrase: pass})
	if err != nil {
		return inv.callError("backup", err)
	}
	rep := progress.New(inv.app.rawStderr())
	rep.Stage("backup", 0)
	h := sha256.New()
	w := io.MultiWriter(f, h)
	var got int64
	var sum *adminv1.BackupSummary
	for sum == nil {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			rep.Done()
			return failf("backup: the stream ended without a summary after %d bytes: the backup is incomplete", got)
		}
		if err != nil {
			rep.Done()
			if c := context.Cause(ctx); c != nil && cmd.Context().Err() == nil {
				return failf("backup: %v", c)
			}
			return inv.callError("backup", err)
		}
		idle.Reset(inv.timeout)
		switch p := m.GetPart().(type) {
		case *adminv1.BackupChunk_Data:
			if _, err := w.Write(p.Data); err != nil {
				rep.Done()
				return failf("backup: write %s: %v", partial, err)
			}
			got += int64(len(p.Data))
			rep.Set(got)
		case *adminv1.BackupChunk_Progress:
			if p.Progress.GetStage() == "snapshot" {
				rep.Stage(fmt.Sprintf("backup of %d records", p.Progress.GetRecords()), 0)
			}
		case *adminv1.BackupChunk_Summary:
			sum = p.Summary
		}
	}
	rep.Done()
	if sha := hex.EncodeToString(h.Sum(nil)); sum.GetBytes() != got || sum.GetSha256() != sha {
		return failf("backup: received %d bytes with sha256 %s, corrald sent %d with sha256 %s: the backup is damaged, not kept", got, sha, sum.GetBytes(), sum.GetSha256())
	}
	if err := f.Sync(); err != nil {
		return failf("backup: sync %s: %v", partial, err)
	}
	if err := f.Close(); err != nil {
		return failf("backup: close %s: %v", partial, err)
	}
	// A hard link, not a rename: it fails instead of replacing a FILE
	// that appeared meanwhile.
	if err := os.Link(partial, out); err != nil {
		return failf("backup: %v (the complete backup is left in %s)", err, partial)
	}
	os.Remove(partial)
	if d, err := os.Open(filepath.Dir(out)); err == nil {
		// The backup is complete either way; a directory that cannot be
		// synced only leaves the new name less durable, so it warns.
		if err := d.Sync(); err != nil {
			fmt.Fprintf(inv.app.stderr(), "corral: backup: sync %s: %v (%s may not survive a crash)\n", filepath.Dir(out), err, out)
		}
		d.Close()
	}
	fmt.Fprintf(inv.app.stdout(), "wrote %s: %d records at store revision %d, %s, sha256 %s\n",
		out, sum.GetRecords(), sum.GetStoreRevision(), progress.Bytes(got), sum.GetSha256())
	return nil
}
