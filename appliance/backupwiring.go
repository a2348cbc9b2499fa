package appliance

import (
	"cmp"
	"context"
	"log/slog"
	"path/filepath"

	"github.com/corralhq/corral/appliance/backup"
	"github.com/corralhq/corral/internal/progress"
	"github.com/corralhq/corral/store"
)

// Version is the corrald version written into backup headers; cmd/corrald
// sets it from its link-time version.
var Version = "dev"

// initBackup serves the online backup (package backup) of this
// appliance's store and data directory.
func (s *Server) initBackup() {
	cfg := backup.Config{DataDir: s.cfg.DataDir, CatalogDir: s.catalogDir(), StoreKind: s.cfg.Store.Kind, StoreName: storeName(s.cfg),
		Appliance: s.cfg.Fleet.Name, Version: Version, Logger: s.log}
	if s.cfg.Store.Kind == StoreEtcd {
		cfg.ClusterKeyFile = s.cfg.Store.ClusterKeyFile
	}
	s.backup = backup.New(cfg, s.store)
	s.backup.Register(s.grpc)
}

// RestoreOptions says what Restore restores where.
type RestoreOptions struct {
	// File is the backup (as `corral backup` wrote it).
	File string
	// DataDir is the data directory to create; it must not exist or be
	// empty.
	DataDir    string
	Passphrase []byte
	// Progress reports decryption (nil: silent).
	Progress *progress.Reporter
	Logger   *slog.Logger
	// Store is where the records go: the data directory's bbolt file
	// (default), or an etcd cluster whose prefix must hold no records.
	Store StoreConfig
}

// RestoreResult is what Restore wrote.
type RestoreResult = backup.RestoreResult

// Restore decrypts a backup and writes a new data directory from it
// (package backup says how): the records go to the data directory's bbolt
// file, or, once the whole file has been checked there, to the etcd
// cluster o.Store names.
func Restore(ctx context.Context, o RestoreOptions) (*RestoreResult, error) {
	bo := backup.RestoreOptions{File: o.File, DataDir: o.DataDir, Passphrase: o.Passphrase, Progress: o.Progress, Logger: o.Logger,
		OpenLocal: OpenStore, LocalFile: StoreFile}
	if o.Store.Kind == StoreEtcd {
		dir, err := filepath.Abs(o.DataDir)
		if err != nil {
			return nil, err
		}
		sc := o.Store
		bo.Shared = &backup.SharedStore{Name: storeName(Config{DataDir: dir, Store: sc}),
			Open: func(ctx context.Context, tmp string) (store.Store, error) {
				return OpenConfiguredStore(ctx, tmp, sc, cmp.Or(o.Logger, slog.New(slog.DiscardHandler)))
			}}
	}
	return backup.Restore(ctx, bo)
}
