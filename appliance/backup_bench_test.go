package appliance

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	adminv1 "github.com/corralhq/corral/api/admin/v1"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// BenchmarkBackupRestore backs up and restores a store of 5,000 records of
// 2 KiB (about the size of a machine with its facts) at age's default
// scrypt work factor, in process (no gRPC), and reports the time of each,
// the file's size and the heap the backup allocated. Not run by CI:
//
//	go test -run '^$' -bench BackupRestore -benchtime 3x ./appliance/
func BenchmarkBackupRestore(b *testing.B) {
	const n = 5000
	dir := b.TempDir()
	srv, _ := startServer(b, filepath.Join(dir, "a"))
	ctx := context.Background()
	val := bytes.Repeat([]byte{0x5a}, 2<<10)
	sem := make(chan struct{}, 64)
	for i := range n {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			if _, err := record.Put(ctx, srv.store, fmt.Sprintf("/bench/m%05d", i), wrapperspb.Bytes(val), 0); err != nil {
				b.Error(err)
			}
		}()
	}
	for range cap(sem) {
		sem <- struct{}{}
	}
	var backupT, restoreT time.Duration
	var size int64
	for i := 0; b.Loop(); i++ {
		var buf bytes.Buffer
		t0 := time.Now()
		_, err := srv.backup.Write(ctx, []byte(testPassphrase), func(c *adminv1.BackupChunk) error {
			buf.Write(c.GetData())
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		backupT += time.Since(t0)
		size = int64(buf.Len())
		file := filepath.Join(dir, fmt.Sprintf("b%d.backup", i))
		os.WriteFile(file, buf.Bytes(), 0o600)
		t0 = time.Now()
		if _, err := Restore(ctx, RestoreOptions{File: file, DataDir: filepath.Join(dir, fmt.Sprint("r", i)), Passphrase: []byte(testPassphrase)}); err != nil {
			b.Fatal(err)
		}
		restoreT += time.Since(t0)
	}
	b.ReportMetric(float64(backupT.Milliseconds())/float64(b.N), "ms/backup")
	b.ReportMetric(float64(restoreT.Milliseconds())/float64(b.N), "ms/restore")
	b.ReportMetric(float64(size)/(1<<20), "MiB/file")
}
