// Package backup is the appliance's online backup and its restore: the
// encrypted file format (age, passphrase recipient), BackupService, which
// streams one consistent snapshot of the store with the data directory's
// secrets, and Restore, which writes a fresh data directory from a file
// only once the whole file has authenticated. It takes the store and the
// data directory's layout through Config and RestoreOptions and must not
// import the appliance package that wires it.
package backup

import (
	"bufio"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"filippo.io/age"

	adminv1 "github.com/corralhq/corral/api/admin/v1"
	"github.com/corralhq/corral/auth/pki"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/ipmi/seal"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/grpc"
)

const (
	// MinBackupPassphrase is the shortest passphrase a backup takes.
	MinBackupPassphrase = 12
	// maxBackupPassphrase bounds the passphrase (it is a request field).
	maxBackupPassphrase = 1024
	// MaxChunk is the most ciphertext one BackupChunk carries.
	MaxChunk = 1 << 20
	// backupProgressEvery is how many records pass between progress
	// messages.
	backupProgressEvery = 2000
)

// WorkFactor is the scrypt work factor (log2 N) of the passphrase
// recipient: age's default, about a second of one core to encrypt or
// decrypt. Tests lower it; nothing else may change it.
var WorkFactor = 18

// Config says what a backup carries besides the store's records.
type Config struct {
	// DataDir holds the CA, the BMC seal key and admin.conf.
	DataDir string
	// CatalogDir is the image catalog, listed (not carried) in a manifest.
	CatalogDir string
	// ClusterKeyFile is the fleet's cluster key, carried when set (an
	// appliance on etcd).
	ClusterKeyFile string
	// StoreKind ("bolt", "etcd") and StoreName (where it is) describe the
	// store in the header and in errors.
	StoreKind, StoreName string
	// Appliance and Version name the appliance and the corrald that wrote
	// the backup, in its header.
	Appliance, Version string
	Logger             *slog.Logger
}

// Service serves corral.admin.v1.BackupService (admin role, by the
// method's access option) from a store that can read a snapshot.
type Service struct {
	adminv1.UnimplementedBackupServiceServer
	cfg   Config
	store store.Store
	log   *slog.Logger
	// running allows one backup at a time: each holds the whole store in
	// memory while it streams.
	running atomic.Bool
}

// New returns the backup service of st.
func New(cfg Config, st store.Store) *Service {
	return &Service{cfg: cfg, store: st, log: cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))}
}

// Register serves BackupService on r.
func (s *Service) Register(r grpc.ServiceRegistrar) {
	adminv1.RegisterBackupServiceServer(r, s)
}

// Backup streams the encrypted backup, progress and a closing summary.
func (s *Service) Backup(req *adminv1.BackupRequest, stream grpc.ServerStreamingServer[adminv1.BackupChunk]) error {
	if !s.running.CompareAndSwap(false, true) {
		return apierr.ToStatus(apierr.Unavailablef("a backup is already running on this appliance: try again when it has ended"))
	}
	defer s.running.Store(false)
	start := time.Now()
	sum, err := s.Write(stream.Context(), req.GetPassphrase(), stream.Send)
	if err != nil {
		s.log.Warn("backup failed", "err", err, "elapsed", time.Since(start).Round(time.Millisecond).String())
		return apierr.ToStatus(err)
	}
	s.log.Info("backup streamed", "records", sum.GetRecords(), "store_revision", sum.GetStoreRevision(),
		"bytes", sum.GetBytes(), "sha256", sum.GetSha256(), "elapsed", time.Since(start).Round(time.Millisecond).String())
	return nil
}

// chunkSender is the ciphertext's way out: it hashes and counts every
// byte and sends them in chunks of at most MaxChunk.
type chunkSender struct {
	send  func(*adminv1.BackupChunk) error
	buf   []byte
	h     hash.Hash
	total int64
}

func (c *chunkSender) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := min(len(p), MaxChunk-len(c.buf))
		c.buf = append(c.buf, p[:k]...)
		p = p[k:]
		if len(c.buf) == MaxChunk {
			if err := c.flush(); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

func (c *chunkSender) flush() error {
	if len(c.buf) == 0 {
		return nil
	}
	c.h.Write(c.buf)
	c.total += int64(len(c.buf))
	err := c.send(&adminv1.BackupChunk{Part: &adminv1.BackupChunk_Data{Data: c.buf}})
	c.buf = make([]byte, 0, MaxChunk)
	return err
}

// backupFile is a file of the data directory the backup carries.
type backupFile struct {
	name string
	data []byte
}

// Write reads the store at one revision and the data directory's
// secrets, and sends them encrypted under passphrase: data chunks,
// progress, then the summary. Nothing unencrypted leaves it or is written
// anywhere.
func (s *Service) Write(ctx context.Context, passphrase []byte, send func(*adminv1.BackupChunk) error) (*adminv1.BackupSummary, error) {
	switch {
	case len(passphrase) < MinBackupPassphrase:
		return nil, apierr.Invalidf("backup passphrase is %d bytes: use at least %d", len(passphrase), MinBackupPassphrase)
	case len(passphrase) > maxBackupPassphrase:
		return nil, apierr.Invalidf("backup passphrase is %d bytes: at most %d", len(passphrase), maxBackupPassphrase)
	}
	snap, ok := store.AsSnapshotter(s.store)
	if !ok {
		return nil, apierr.Preconditionf("the store (%s) cannot read a consistent snapshot", s.cfg.StoreName)
	}
	files, err := s.backupFiles()
	if err != nil {
		return nil, err
	}
	rev, kvs, err := snap.Snapshot(ctx)
	if err != nil {
		return nil, fmt.Errorf("backup: snapshot: %w", err)
	}
	if err := send(progressChunk("snapshot", int64(len(kvs)), 0)); err != nil {
		return nil, err
	}

	rcp, err := age.NewScryptRecipient(string(passphrase))
	if err != nil {
		return nil, apierr.Invalidf("backup passphrase: %v", err)
	}
	rcp.SetWorkFactor(WorkFactor)
	out := &chunkSender{send: send, buf: make([]byte, 0, MaxChunk), h: sha256.New()}
	aw, err := age.Encrypt(out, rcp)
	if err != nil {
		return nil, fmt.Errorf("backup: encrypt: %w", err)
	}
	fw := &frameWriter{w: aw}
	hdr := Header{Format: Format, CorralVersion: s.cfg.Version, SchemaVersion: record.SchemaVersion, Store: s.cfg.StoreKind,
		StoreRevision: rev, Records: int64(len(kvs)), Created: time.Now().UTC(), Appliance: s.cfg.Appliance}
	for _, f := range files {
		hdr.Files = append(hdr.Files, f.name)
	}
	if _, err := aw.Write([]byte(backupMagic)); err != nil {
		return nil, err
	}
	if err := fw.json(frameHeader, hdr); err != nil {
		return nil, err
	}
	for _, f := range files {
		if err := fw.named(frameFile, f.name, f.data); err != nil {
			return nil, err
		}
	}
	var recBytes int64
	for i, kv := range kvs {
		if err := fw.named(frameRecord, kv.Key, kv.Value); err != nil {
			return nil, err
		}
		recBytes += int64(len(kv.Value))
		if (i+1)%backupProgressEvery == 0 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			if err := send(progressChunk("records", int64(i+1), out.total)); err != nil {
				return nil, err
			}
		}
	}
	if err := fw.json(frameEnd, backupEnd{Records: int64(len(kvs)), RecordBytes: recBytes, Files: len(files)}); err != nil {
		return nil, err
	}
	if err := aw.Close(); err != nil {
		return nil, err
	}
	if err := out.flush(); err != nil {
		return nil, err
	}
	if err := send(progressChunk("done", int64(len(kvs)), out.total)); err != nil {
		return nil, err
	}
	sum := &adminv1.BackupSummary{Records: int64(len(kvs)), StoreRevision: rev, Bytes: out.total, Sha256: hex.EncodeToString(out.h.Sum(nil))}
	return sum, send(&adminv1.BackupChunk{Part: &adminv1.BackupChunk_Summary{Summary: sum}})
}

func progressChunk(stage string, records, bytes int64) *adminv1.BackupChunk {
	return &adminv1.BackupChunk{Part: &adminv1.BackupChunk_Progress{Progress: &adminv1.BackupProgress{Stage: stage, Records: records, Bytes: bytes}}}
}

// backupFiles reads what the data directory keeps beside the store: the
// CA (required), the boot CA (if made), the BMC seal key, the cluster key (etcd), admin.conf, and
// a manifest of the image catalog (names, sizes, SHA-256; not the
// artifacts).
func (s *Service) backupFiles() ([]backupFile, error) {
	dir := s.cfg.DataDir
	srcs := []struct {
		name, path string
		required   bool
	}{
		{backupCACert, filepath.Join(dir, filepath.FromSlash(path.Dir(backupCACert)), pki.CACertFile), true},
		{backupCAKey, filepath.Join(dir, filepath.FromSlash(path.Dir(backupCAKey)), pki.CAKeyFile), true},
		{backupBootCACert, filepath.Join(dir, filepath.FromSlash(backupBootCACert)), false},
		{backupBootCAKey, filepath.Join(dir, filepath.FromSlash(backupBootCAKey)), false},
		{backupSealKey, filepath.Join(dir, seal.KeyFile), false},
		{backupAdminConf, filepath.Join(dir, backupAdminConf), false},
	}
	if s.cfg.ClusterKeyFile != "" {
		srcs = append(srcs, struct {
			name, path string
			required   bool
		}{backupClusterKey, s.cfg.ClusterKeyFile, true})
	}
	var out []backupFile
	for _, f := range srcs {
		b, err := os.ReadFile(f.path)
		if errors.Is(err, fs.ErrNotExist) && !f.required {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("backup: read %s: %w", f.path, err)
		}
		out = append(out, backupFile{f.name, b})
	}
	m, err := imageManifest(s.cfg.CatalogDir)
	if err != nil {
		return nil, err
	}
	if m != nil {
		out = append(out, backupFile{backupImagesIndex, m})
	}
	return out, nil
}

// imageManifest lists the catalog's artifacts from its SHA256SUMS (nil if
// the catalog has none yet), with their sizes.
func imageManifest(dir string) ([]byte, error) {
	f, err := os.Open(filepath.Join(dir, "SHA256SUMS"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("backup: image catalog: %w", err)
	}
	defer f.Close()
	entries := []ImageManifestEntry{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok || name == "" || name != filepath.Base(name) {
			continue
		}
		e := ImageManifestEntry{Name: name, SHA256: sum}
		if fi, err := os.Stat(filepath.Join(dir, name)); err == nil {
			e.Size = fi.Size()
		}
		entries = append(entries, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("backup: image catalog: %w", err)
	}
	return json.MarshalIndent(entries, "", "  ")
}
