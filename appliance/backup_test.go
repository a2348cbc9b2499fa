package appliance

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	adminv1 "github.com/corralhq/corral/api/admin/v1"
	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/appliance/backup"
	"github.com/corralhq/corral/auth/pki"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/ipmi/seal"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/bolt"
	"github.com/corralhq/corral/store/record"
	"github.com/corralhq/corral/testsupport/etcdtest"
)

const testPassphrase = "correct horse battery staple"

// fastScrypt lowers the backup's scrypt work factor for one test (the
// default costs seconds under -race).
func fastScrypt(t *testing.T) {
	old := backup.WorkFactor
	backup.WorkFactor = 10
	t.Cleanup(func() { backup.WorkFactor = old })
}

// fetchBackup calls Backup and returns the file's bytes, the summary and
// the progress stages seen.
func fetchBackup(t *testing.T, c adminv1.BackupServiceClient, pass string) ([]byte, *adminv1.BackupSummary, []string, error) {
	t.Helper()
	st, err := c.Backup(context.Background(), &adminv1.BackupRequest{Passphrase: []byte(pass)})
	if err != nil {
		return nil, nil, nil, err
	}
	var buf bytes.Buffer
	var sum *adminv1.BackupSummary
	var stages []string
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return buf.Bytes(), sum, stages, nil
		}
		if err != nil {
			return nil, nil, nil, err
		}
		switch p := m.GetPart().(type) {
		case *adminv1.BackupChunk_Data:
			if len(p.Data) > backup.MaxChunk {
				t.Errorf("chunk of %d bytes, over %d", len(p.Data), backup.MaxChunk)
			}
			buf.Write(p.Data)
		case *adminv1.BackupChunk_Progress:
			stages = append(stages, p.Progress.GetStage())
		case *adminv1.BackupChunk_Summary:
			sum = p.Summary
		}
	}
}

func TestBackupRestore(t *testing.T) {
	fastScrypt(t)
	dir := t.TempDir()
	srv, cc := startServer(t, filepath.Join(dir, "a"))
	ctx := context.Background()
	// Enough records for several 1 MiB chunks and progress messages.
	big := bytes.Repeat([]byte("x"), 8<<10)
	for i := range 300 {
		if _, err := record.Put(ctx, srv.store, fmt.Sprintf("/test/r%05d", i), wrapperspb.Bytes(big), 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := seal.Ensure(filepath.Join(srv.cfg.DataDir, seal.KeyFile)); err != nil {
		t.Fatal(err)
	}
	viewer := newToken(t, srv, authv1.Role_ROLE_VIEWER)
	// A catalog of one artifact: the backup lists it, without its bytes.
	os.MkdirAll(srv.catalogDir(), 0o755)
	os.WriteFile(filepath.Join(srv.catalogDir(), "vmlinuz"), []byte("kernel bytes"), 0o644)
	os.WriteFile(filepath.Join(srv.catalogDir(), "SHA256SUMS"), []byte(strings.Repeat("ab", 32)+"  vmlinuz\n"), 0o644)

	admin := adminv1.NewBackupServiceClient(dial(t, cc, ""))
	if _, _, _, err := fetchBackup(t, adminv1.NewBackupServiceClient(dial(t, cc, viewer)), testPassphrase); status.Code(err) != codes.PermissionDenied {
		t.Errorf("viewer's backup: %v, want PermissionDenied", err)
	}
	if _, _, _, err := fetchBackup(t, admin, "short"); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "at least 12") {
		t.Errorf("short passphrase: %v, want InvalidArgument naming the minimum", err)
	}

	data, sum, stages, err := fetchBackup(t, admin, testPassphrase)
	if err != nil {
		t.Fatal(err)
	}
	if sum == nil {
		t.Fatal("no summary")
	}
	h := sha256.Sum256(data)
	if sum.GetSha256() != hex.EncodeToString(h[:]) || sum.GetBytes() != int64(len(data)) {
		t.Errorf("summary %v does not describe the %d bytes received", sum, len(data))
	}
	if len(stages) < 2 || stages[0] != "snapshot" || stages[len(stages)-1] != "done" {
		t.Errorf("progress stages %v", stages)
	}
	if bytes.Contains(data, big[:64]) || bytes.Contains(data, []byte("/test/r00001")) {
		t.Error("the backup carries plaintext")
	}
	all, err := srv.store.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	// The snapshot is the store at the backup's revision (the audit
	// records the backup call itself after it).
	var want []store.KV
	for _, kv := range all {
		if kv.Revision <= sum.GetStoreRevision() {
			want = append(want, kv)
		}
	}
	if sum.GetRecords() != int64(len(want)) {
		t.Errorf("summary: %d records, store has %d", sum.GetRecords(), len(want))
	}
	file := filepath.Join(dir, "backup.age")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}

	// Refusals write nothing.
	truncated := filepath.Join(dir, "truncated.age")
	os.WriteFile(truncated, data[:len(data)-100], 0o600)
	flipped := filepath.Join(dir, "flipped.age")
	bad := bytes.Clone(data)
	bad[len(bad)/2] ^= 0x01
	os.WriteFile(flipped, bad, 0o600)
	nonEmpty := filepath.Join(dir, "nonempty")
	os.MkdirAll(filepath.Join(nonEmpty, PKIDir), 0o700)
	for name, tc := range map[string]struct {
		file, dir, pass string
		class           error
		msg             string
	}{
		"wrong passphrase": {file, filepath.Join(dir, "r1"), "not the passphrase", apierr.ErrInvalid, "wrong passphrase"},
		"truncated":        {truncated, filepath.Join(dir, "r2"), testPassphrase, apierr.ErrDataLoss, "truncated or altered"},
		"byte flipped":     {flipped, filepath.Join(dir, "r3"), testPassphrase, apierr.ErrDataLoss, "truncated or altered"},
		"existing CA":      {file, nonEmpty, testPassphrase, apierr.ErrPrecondition, "already holds a CA"},
		"existing store":   {file, srv.cfg.DataDir, testPassphrase, apierr.ErrPrecondition, "already holds a store"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Restore(ctx, RestoreOptions{File: tc.file, DataDir: tc.dir, Passphrase: []byte(tc.pass)})
			if !errors.Is(err, tc.class) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("Restore: %v, want %v saying %q", err, tc.class, tc.msg)
			}
			if tc.dir != nonEmpty && tc.dir != srv.cfg.DataDir {
				if _, err := os.Stat(tc.dir); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s exists after a refused restore", tc.dir)
				}
			}
			left, _ := filepath.Glob(filepath.Join(dir, ".*restore-*"))
			if len(left) > 0 {
				t.Errorf("temporary directories left: %v", left)
			}
		})
	}

	restored := filepath.Join(dir, "b")
	os.Mkdir(restored, 0o700) // an empty directory is fresh too
	res, err := Restore(ctx, RestoreOptions{File: file, DataDir: restored, Passphrase: []byte(testPassphrase)})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]backup.ImageManifestEntry{{Name: "vmlinuz", Size: 12, SHA256: strings.Repeat("ab", 32)}}, res.Images); d != "" {
		t.Errorf("image manifest (-want +got):\n%s", d)
	}
	if res.Records != int64(len(want)) || res.Header.StoreRevision != sum.GetStoreRevision() {
		t.Errorf("restored %d records at revision %d, want %d at %d", res.Records, res.Header.StoreRevision, len(want), sum.GetStoreRevision())
	}
	st, err := bolt.Open(filepath.Join(restored, StoreFile), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := st.List(ctx, "")
	st.Close()
	if err != nil {
		t.Fatal(err)
	}
	strip := func(kvs []store.KV) map[string]string {
		m := map[string]string{}
		for _, kv := range kvs {
			m[kv.Key] = string(kv.Value)
		}
		return m
	}
	if d := cmp.Diff(strip(want), strip(got)); d != "" {
		t.Errorf("restored records differ (-backed up +restored):\n%.2000s", d)
	}
	for _, f := range []string{filepath.Join(PKIDir, pki.CACertFile), filepath.Join(PKIDir, pki.CAKeyFile), seal.KeyFile, AdminConfigFile} {
		a, _ := os.ReadFile(filepath.Join(srv.cfg.DataDir, f))
		b, err := os.ReadFile(filepath.Join(restored, f))
		if err != nil || !bytes.Equal(a, b) {
			t.Errorf("%s: restored copy differs or is missing (%v)", f, err)
		}
	}
	if fi, err := os.Stat(filepath.Join(restored, PKIDir, pki.CAKeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("restored CA key: %v, mode %v", err, fi.Mode())
	}
}

// TestRestoreEtcd: a backup restored into an empty etcd prefix holds the
// same records; a prefix that holds records is refused and nothing is
// written anywhere.
func TestRestoreEtcd(t *testing.T) {
	fastScrypt(t)
	c := etcdtest.New(t, 1)
	dir := t.TempDir()
	srv, _ := startServer(t, filepath.Join(dir, "a"))
	ctx := context.Background()
	var buf bytes.Buffer
	sum, err := srv.backup.Write(ctx, []byte(testPassphrase), func(c *adminv1.BackupChunk) error { buf.Write(c.GetData()); return nil })
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "backup")
	os.WriteFile(file, buf.Bytes(), 0o600)
	sc := StoreConfig{Kind: StoreEtcd}
	sc.Etcd.Endpoints, sc.Etcd.Prefix = c.Endpoints(), "/restored"
	res, err := Restore(ctx, RestoreOptions{File: file, DataDir: filepath.Join(dir, "b"), Passphrase: []byte(testPassphrase), Store: sc})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "b", StoreFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("an etcd restore left a bbolt file in the data directory (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "b", PKIDir, pki.CAKeyFile)); err != nil {
		t.Errorf("CA key: %v", err)
	}
	st, err := OpenConfiguredStore(ctx, dir, sc, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	got, err := st.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(got)) != sum.GetRecords() || res.Records != sum.GetRecords() {
		t.Errorf("etcd holds %d records, restore wrote %d, the backup had %d", len(got), res.Records, sum.GetRecords())
	}
	_, err = Restore(ctx, RestoreOptions{File: file, DataDir: filepath.Join(dir, "c"), Passphrase: []byte(testPassphrase), Store: sc})
	if !errors.Is(err, apierr.ErrPrecondition) || !strings.Contains(err.Error(), "already holds") {
		t.Fatalf("restore into a prefix with records: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "c")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused restore created its data directory")
	}
	if again, _ := st.List(ctx, ""); len(again) != len(got) {
		t.Errorf("the refused restore changed etcd: %d records, had %d", len(again), len(got))
	}
}
