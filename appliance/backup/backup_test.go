package backup

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	adminv1 "github.com/corralhq/corral/api/admin/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/bolt"
	"github.com/corralhq/corral/store/mem"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const testPassphrase = "correct horse battery staple"

func openBolt(dir string, log *slog.Logger) (store.Store, error) {
	return bolt.Open(filepath.Join(dir, "corral.db"), bolt.Options{Logger: log})
}

// TestWriteRestore: a backup of a store and a data directory's CA, written
// without an appliance, restores into a fresh directory with the same
// records and files; a wrong passphrase writes nothing.
func TestWriteRestore(t *testing.T) {
	old := WorkFactor
	WorkFactor = 10
	t.Cleanup(func() { WorkFactor = old })
	ctx := context.Background()
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(filepath.Join(data, "pki"), 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(data, "pki", "ca.crt"), []byte("cert"), 0o644)
	os.WriteFile(filepath.Join(data, "pki", "ca.key"), []byte("key"), 0o600)
	// The boot CA (HTTPS boot) goes along: firmware has it enrolled.
	os.MkdirAll(filepath.Join(data, "pki", "boot"), 0o700)
	os.WriteFile(filepath.Join(data, "pki", "boot", "ca.crt"), []byte("boot cert"), 0o644)
	os.WriteFile(filepath.Join(data, "pki", "boot", "ca.key"), []byte("boot key"), 0o600)
	st := mem.New()
	defer st.Close()
	for _, k := range []string{"/a/1", "/a/2", "/b/1"} {
		if _, err := record.Put(ctx, st, k, wrapperspb.String(k), 0); err != nil {
			t.Fatal(err)
		}
	}
	svc := New(Config{DataDir: data, CatalogDir: filepath.Join(data, "images"), StoreKind: "bolt", StoreName: "mem", Appliance: "a", Version: "test"}, st)
	var buf bytes.Buffer
	sum, err := svc.Write(ctx, []byte(testPassphrase), func(c *adminv1.BackupChunk) error { buf.Write(c.GetData()); return nil })
	if err != nil {
		t.Fatal(err)
	}
	if sum.GetRecords() != 3 || sum.GetBytes() != int64(buf.Len()) {
		t.Errorf("summary %v for %d bytes", sum, buf.Len())
	}
	file := filepath.Join(dir, "backup")
	os.WriteFile(file, buf.Bytes(), 0o600)

	_, err = Restore(ctx, RestoreOptions{File: file, DataDir: filepath.Join(dir, "wrong"), Passphrase: []byte("not the passphrase"), OpenLocal: openBolt, LocalFile: "corral.db"})
	if !errors.Is(err, apierr.ErrInvalid) {
		t.Errorf("wrong passphrase: %v, want Invalid", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "wrong")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused restore created its directory (%v)", err)
	}

	res, err := Restore(ctx, RestoreOptions{File: file, DataDir: filepath.Join(dir, "restored"), Passphrase: []byte(testPassphrase), OpenLocal: openBolt, LocalFile: "corral.db"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Records != 3 || res.Header.Appliance != "a" || res.Header.CorralVersion != "test" || len(res.Files) != 4 {
		t.Errorf("restored %+v", res)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "restored", "pki", "ca.key")); err != nil || string(b) != "key" {
		t.Errorf("CA key: %q, %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "restored", "pki", "boot", "ca.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("boot CA key: %v, %v", fi, err)
	}
	got, err := openBolt(filepath.Join(dir, "restored"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	kvs, err := got.List(ctx, "")
	if err != nil || len(kvs) != 3 {
		t.Errorf("restored store: %d records, %v", len(kvs), err)
	}
}
