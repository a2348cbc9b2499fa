package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	adminv1 "github.com/corralhq/corral/api/admin/v1"
	"github.com/corralhq/corral/api/clientconfig"
)

// scriptedBackup is a hand-written BackupService: it sends data, then
// ends as told (a good summary, a lying one, an error, or nothing).
type scriptedBackup struct {
	adminv1.UnimplementedBackupServiceServer
	data []byte
	end  string // "ok", "bad-sha", "error", "eof"
	got  chan []byte
}

func (s *scriptedBackup) Backup(req *adminv1.BackupRequest, ss grpc.ServerStreamingServer[adminv1.BackupChunk]) error {
	s.got <- req.GetPassphrase()
	ss.Send(&adminv1.BackupChunk{Part: &adminv1.BackupChunk_Progress{Progress: &adminv1.BackupProgress{Stage: "snapshot", Records: 3}}})
	for c := range slices.Chunk(s.data, 1000) {
		if err := ss.Send(&adminv1.BackupChunk{Part: &adminv1.BackupChunk_Data{Data: c}}); err != nil {
			return err
		}
	}
	sum := sha256.Sum256(s.data)
	sha := hex.EncodeToString(sum[:])
	switch s.end {
	case "error":
		return status.Error(codes.Unavailable, "store: closed")
	case "eof":
		return nil
	case "bad-sha":
		sha = strings.Repeat("0", 64)
	}
	return ss.Send(&adminv1.BackupChunk{Part: &adminv1.BackupChunk_Summary{Summary: &adminv1.BackupSummary{
		Records: 3, StoreRevision: 9, Bytes: int64(len(s.data)), Sha256: sha}}})
}

func TestBackup(t *testing.T) {
	data := bytes.Repeat([]byte("ciphertext"), 500)
	dir := t.TempDir()
	pass := filepath.Join(dir, "pass")
	os.WriteFile(pass, []byte("twelve bytes or more\r\nsecond line ignored\n"), 0o600)
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte("short\n"), 0o600)
	existing := filepath.Join(dir, "existing")
	os.WriteFile(existing, []byte("keep me"), 0o600)
	tests := map[string]struct {
		end, pass, out string
		code           int
		stderr         string
	}{
		"written":          {end: "ok", pass: pass, code: ExitOK},
		"checksum differs": {end: "bad-sha", pass: pass, code: ExitError, stderr: "the backup is damaged, not kept"},
		"stream error":     {end: "error", pass: pass, code: ExitError, stderr: "store: closed (Unavailable)"},
		"no summary":       {end: "eof", pass: pass, code: ExitError, stderr: "ended without a summary"},
		"short passphrase": {end: "ok", pass: short, code: ExitUsage, stderr: "use at least 12"},
		"file exists":      {end: "ok", pass: pass, out: existing, code: ExitUsage, stderr: "already exists"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			fake := &scriptedBackup{data: data, end: tt.end, got: make(chan []byte, 1)}
			out := tt.out
			if out == "" {
				out = filepath.Join(t.TempDir(), "b.backup")
			}
			var stdout, stderr bytes.Buffer
			env := map[string]string{"HOME": t.TempDir(), envEndpoint: "bufnet:1"}
			app := &App{Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string { return env[k] }, Dial: backupServer(t, fake)}
			code := app.Run(context.Background(), []string{"backup", "-o", out, "--passphrase-file", tt.pass})
			if code != tt.code || !strings.Contains(stderr.String(), tt.stderr) {
				t.Fatalf("exit %d, want %d; stderr %q, want it to say %q", code, tt.code, stderr.String(), tt.stderr)
			}
			if _, err := os.Stat(out + ".partial"); !os.IsNotExist(err) {
				t.Errorf("%s.partial left behind", out)
			}
			got, err := os.ReadFile(out)
			switch {
			case tt.out != "":
				if string(got) != "keep me" {
					t.Errorf("existing file changed: %q", got)
				}
			case code == ExitOK:
				if !bytes.Equal(got, data) {
					t.Errorf("file holds %d bytes, want the %d sent", len(got), len(data))
				}
				if p := <-fake.got; string(p) != "twelve bytes or more" {
					t.Errorf("passphrase sent %q, want the file's first line", p)
				}
				if fi, _ := os.Stat(out); fi.Mode().Perm() != 0o600 {
					t.Errorf("mode %v, want 0600", fi.Mode().Perm())
				}
				if !strings.Contains(stdout.String(), "3 records at store revision 9") {
					t.Errorf("stdout %q", stdout.String())
				}
			case !os.IsNotExist(err):
				t.Errorf("a failed backup left %s (%v)", out, err)
			}
		})
	}
}

func backupServer(t *testing.T, fake *scriptedBackup) func(*clientconfig.Config) (*grpc.ClientConn, error) {
	srv := grpc.NewServer()
	adminv1.RegisterBackupServiceServer(srv, fake)
	lis := bufconn.Listen(1 << 20)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return func(*clientconfig.Config) (*grpc.ClientConn, error) {
		return grpc.NewClient("passthrough:///bufnet",
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
			grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
}
