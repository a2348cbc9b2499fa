package appliance

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	fleetv1 "github.com/corralhq/corral/api/fleet/v1"
	"github.com/corralhq/corral/auth/pki"
	"github.com/corralhq/corral/ipmi/seal"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/etcd"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Store kinds.
const (
	StoreBolt = "bolt"
	StoreEtcd = "etcd"
)

// ClusterKeyFile is the fleet's cluster key inside the data directory: 32
// random bytes that seal the CA key and the BMC seal key in a shared store.
const ClusterKeyFile = "cluster.key"

// clusterSecretsKey holds the fleet's fleetv1.ClusterSecrets.
const clusterSecretsKey = store.ClusterSecretsKey

// StoreConfig chooses the store: the bbolt file in the data directory
// (default, one appliance) or an etcd cluster shared by several appliances.
type StoreConfig struct {
	// Kind is StoreBolt (default) or StoreEtcd.
	Kind string
	// Etcd configures the cluster when Kind is StoreEtcd (Endpoints,
	// Prefix, CAFile/CertFile/KeyFile).
	Etcd etcd.Options
	// ClusterKeyFile is the fleet's cluster key (default
	// DataDir/cluster.key). The first appliance on an empty store creates
	// it; every other appliance of the fleet needs a copy.
	ClusterKeyFile string
	// LeaseTTL is the leader's lease (default 15s): a leader that dies or
	// is cut off is replaced within it.
	LeaseTTL time.Duration
}

func (c *StoreConfig) fill(dataDir string) error {
	switch c.Kind {
	case "", StoreBolt:
		c.Kind = StoreBolt
	case StoreEtcd:
		if len(c.Etcd.Endpoints) == 0 {
			return errors.New("--store etcd needs --etcd-endpoints")
		}
	default:
		return fmt.Errorf("--store %q: use %s or %s", c.Kind, StoreBolt, StoreEtcd)
	}
	if c.ClusterKeyFile == "" {
		c.ClusterKeyFile = filepath.Join(dataDir, ClusterKeyFile)
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = etcd.DefaultLeaseTTL
	}
	if c.LeaseTTL < 2*time.Second || c.LeaseTTL%time.Second != 0 {
		return fmt.Errorf("--leader-lease-ttl %s: want whole seconds, at least 2s", c.LeaseTTL)
	}
	return nil
}

// openStore opens the configured store: the data directory's bbolt file or
// the etcd cluster.
func openStore(ctx context.Context, cfg Config) (store.Store, error) {
	return OpenConfiguredStore(ctx, cfg.DataDir, cfg.Store, cfg.Logger)
}

// OpenConfiguredStore opens the store sc names: dataDir's bbolt file, or
// the etcd cluster (for offline commands such as `corrald token create`).
func OpenConfiguredStore(ctx context.Context, dataDir string, sc StoreConfig, log *slog.Logger) (store.Store, error) {
	if sc.Kind != StoreEtcd {
		return OpenStore(dataDir, log)
	}
	if len(sc.Etcd.Endpoints) == 0 {
		return nil, errors.New("--store etcd needs --etcd-endpoints")
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	o := sc.Etcd
	o.Logger = log.With("component", "store")
	return etcd.Open(ctx, o)
}

// storeName says where the store is, for logs and errors.
func storeName(cfg Config) string {
	if cfg.Store.Kind != StoreEtcd {
		return filepath.Join(cfg.DataDir, StoreFile)
	}
	p := cfg.Store.Etcd.Prefix
	if p == "" {
		p = etcd.DefaultPrefix
	}
	return "etcd " + strings.Join(cfg.Store.Etcd.Endpoints, ",") + " prefix " + p
}

// shareSecrets makes the data directory's CA and BMC seal key the fleet's:
// on an empty shared store it publishes this appliance's (creating them
// and the cluster key if need be); otherwise it opens the store's with the
// cluster key and writes them into the data directory, refusing a data
// directory that already holds different ones. The rest of the appliance
// then reads the files as it always has.
func shareSecrets(ctx context.Context, st store.Store, cfg Config, log *slog.Logger) error {
	var sec fleetv1.ClusterSecrets
	_, err := record.Get(ctx, st, clusterSecretsKey, &sec)
	if errors.Is(err, store.ErrNotFound) {
		created, perr := PublishSecrets(ctx, st, cfg.DataDir, cfg.Store.ClusterKeyFile, cfg.Fleet.Name, false)
		if perr == nil {
			log.Info("first appliance of the fleet: CA and BMC seal key published to the store, sealed under the cluster key",
				"store", storeName(cfg), "cluster_key", cfg.Store.ClusterKeyFile)
			return nil
		}
		if !errors.Is(perr, store.ErrConflict) {
			return perr
		}
		// Another appliance initialised the fleet at the same moment:
		// drop what this start created and take theirs.
		for _, p := range created {
			os.Remove(p)
		}
		_, err = record.Get(ctx, st, clusterSecretsKey, &sec)
	}
	if err != nil {
		return fmt.Errorf("fleet secrets: %w", err)
	}
	if err := adoptSecrets(&sec, cfg.DataDir, cfg.Store.ClusterKeyFile, storeName(cfg)); err != nil {
		return err
	}
	log.Info("joined the fleet: CA and BMC seal key taken from the store", "store", storeName(cfg), "initialised_by", sec.GetInitialisedBy())
	return nil
}

// WriteSecrets opens the fleet secrets in st with the cluster key at
// keyPath and writes the CA and BMC seal key into dataDir (`corrald store
// copy` from a fleet to one appliance's bbolt file). It reports false when
// st holds no fleet secrets.
func WriteSecrets(ctx context.Context, st store.Store, dataDir, keyPath, where string) (bool, error) {
	var sec fleetv1.ClusterSecrets
	if _, err := record.Get(ctx, st, clusterSecretsKey, &sec); errors.Is(err, store.ErrNotFound) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	return true, adoptSecrets(&sec, dataDir, keyPath, where)
}

// PublishSecrets seals the data directory's CA key and BMC seal key under
// the cluster key at keyPath and writes them to the store (which must not
// hold any yet: a conflict is store.ErrConflict). With existing set, the CA
// and keys must already exist (`corrald store copy` of an appliance); else
// missing ones are created. It returns the files it created.
func PublishSecrets(ctx context.Context, st store.Store, dataDir, keyPath, by string, existing bool) (created []string, err error) {
	pkiDir := filepath.Join(dataDir, PKIDir)
	sealPath := filepath.Join(dataDir, seal.KeyFile)
	for _, p := range []string{keyPath, filepath.Join(pkiDir, pki.CACertFile), filepath.Join(pkiDir, pki.CAKeyFile), sealPath} {
		if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
			if existing && p != keyPath {
				return nil, fmt.Errorf("%s is missing: nothing to publish", p)
			}
			created = append(created, p)
		}
	}
	key, err := ensureClusterKey(keyPath)
	if err != nil {
		return created, err
	}
	ca, err := pki.EnsureCA(pkiDir)
	if err != nil {
		return created, err
	}
	if _, err := seal.Ensure(sealPath); err != nil {
		return created, err
	}
	caKey, err := os.ReadFile(filepath.Join(pkiDir, pki.CAKeyFile))
	if err != nil {
		return created, err
	}
	sealKey, err := os.ReadFile(sealPath)
	if err != nil {
		return created, err
	}
	sl, err := seal.New(key)
	if err != nil {
		return created, err
	}
	sec := &fleetv1.ClusterSecrets{CaCertPem: string(ca.CertPEM()), ClusterKeySha256: keyID(key), InitialisedBy: by, InitialisedAt: timestamppb.Now()}
	if sec.CaKeySealed, err = sl.Seal(caKey, []byte("corral:fleet:ca-key")); err != nil {
		return created, err
	}
	if sec.BmcSealKeySealed, err = sl.Seal(sealKey, []byte("corral:fleet:bmc-seal-key")); err != nil {
		return created, err
	}
	if _, err := record.Put(ctx, st, clusterSecretsKey, sec, 0); err != nil {
		return created, err
	}
	return created, nil
}

// adoptSecrets opens the fleet's secrets and writes them into the data
// directory.
func adoptSecrets(sec *fleetv1.ClusterSecrets, dataDir, keyPath, where string) error {
	key, err := os.ReadFile(keyPath)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s was initialised by appliance %q at %s and its CA and BMC seal key are sealed under that fleet's cluster key: copy %s from an appliance of the fleet to %s (mode 0600), or name it with --cluster-key",
			where, sec.GetInitialisedBy(), sec.GetInitialisedAt().AsTime().UTC().Format(time.RFC3339), ClusterKeyFile, keyPath)
	}
	if err != nil {
		return fmt.Errorf("cluster key: %w", err)
	}
	if id := keyID(key); id != sec.GetClusterKeySha256() {
		return fmt.Errorf("cluster key %s is sha256:%s but %s is sealed under sha256:%s: this is another fleet's key", keyPath, id[:16], where, sec.GetClusterKeySha256()[:min(16, len(sec.GetClusterKeySha256()))])
	}
	sl, err := seal.New(key)
	if err != nil {
		return fmt.Errorf("cluster key %s: %w", keyPath, err)
	}
	caKey, err := sl.Open(sec.GetCaKeySealed(), []byte("corral:fleet:ca-key"))
	if err != nil {
		return fmt.Errorf("fleet CA key in %s: %w", where, err)
	}
	sealKey, err := sl.Open(sec.GetBmcSealKeySealed(), []byte("corral:fleet:bmc-seal-key"))
	if err != nil {
		return fmt.Errorf("fleet BMC seal key in %s: %w", where, err)
	}
	pkiDir := filepath.Join(dataDir, PKIDir)
	for _, f := range []struct {
		path string
		data []byte
		mode fs.FileMode
		what string
	}{
		{filepath.Join(pkiDir, pki.CACertFile), []byte(sec.GetCaCertPem()), 0o644, "CA certificate"},
		{filepath.Join(pkiDir, pki.CAKeyFile), caKey, 0o600, "CA key"},
		{filepath.Join(dataDir, seal.KeyFile), sealKey, 0o600, "BMC seal key"},
	} {
		if err := writeOnce(f.path, f.data, f.mode); err != nil && !errors.Is(err, errDiffers) {
			return fmt.Errorf("write the fleet's %s to %s: %w", f.what, f.path, err)
		} else if err != nil {
			return fmt.Errorf("%s: the data directory holds another %s than the fleet's (%s): an appliance joins a fleet with an empty data directory, or is migrated into it with `corrald store copy`", f.path, f.what, where)
		}
	}
	return nil
}

// errDiffers: an existing file holds other bytes than writeOnce's.
var errDiffers = errors.New("differs")

// writeOnce writes data to path unless it exists; an existing file must
// hold exactly data (else errDiffers).
func writeOnce(path string, data []byte, mode fs.FileMode) error {
	cur, err := os.ReadFile(path)
	if err == nil {
		if bytes.Equal(cur, data) {
			return nil
		}
		return errDiffers
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// ensureClusterKey reads the cluster key at path, creating it (0600) if it
// does not exist.
func ensureClusterKey(path string) ([]byte, error) {
	key, err := os.ReadFile(path)
	if err == nil {
		if len(key) != 32 {
			return nil, fmt.Errorf("cluster key %s is %d bytes, want 32", path, len(key))
		}
		if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
			return nil, fmt.Errorf("cluster key %s is readable by others (mode %s): chmod 600 it", path, fi.Mode().Perm())
		}
		return key, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	key = make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return ensureClusterKey(path)
	}
	if err != nil {
		return nil, err
	}
	if _, err := f.Write(key); err != nil {
		f.Close()
		os.Remove(path)
		return nil, err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, err
	}
	return key, f.Close()
}

// keyID names a cluster key: the hex SHA-256 of it.
func keyID(key []byte) string {
	sum := sha256.Sum256(key)
	return hex.EncodeToString(sum[:])
}

// bootCAPurpose binds the sealed boot CA key to its field.
const bootCAPurpose = "corral:fleet:boot-ca-key"

// shareBootCA makes the boot CA in the data directory (BootCADir) the
// fleet's, so that firmware given one CA trusts every appliance's HTTPS
// boot certificate. If the fleet's secrets hold a boot CA it is written
// into the directory (one that already holds another is refused, as the
// API CA is). Otherwise this appliance's boot CA (made now if need be) is
// sealed under the cluster key and added by compare-and-swap; an
// appliance that loses the race drops the CA it made and takes the
// winner's. Fleets initialised before the boot CA was shared gain it the
// same way. A standalone appliance does nothing here.
func (s *Server) shareBootCA(ctx context.Context) error {
	if s.cfg.Store.Kind != StoreEtcd {
		return nil
	}
	dir := filepath.Join(s.cfg.DataDir, BootCADir)
	certPath, keyPath := filepath.Join(dir, pki.CACertFile), filepath.Join(dir, pki.CAKeyFile)
	key, err := os.ReadFile(s.cfg.Store.ClusterKeyFile)
	if err != nil {
		return fmt.Errorf("boot CA: cluster key: %w", err)
	}
	sl, err := seal.New(key)
	if err != nil {
		return fmt.Errorf("boot CA: cluster key %s: %w", s.cfg.Store.ClusterKeyFile, err)
	}
	for attempt := 0; attempt < 5; attempt++ {
		var sec fleetv1.ClusterSecrets
		rev, err := record.Get(ctx, s.store, clusterSecretsKey, &sec)
		if err != nil {
			return fmt.Errorf("boot CA: fleet secrets: %w", err)
		}
		if sec.GetBootCaCertPem() != "" {
			caKey, err := sl.Open(sec.GetBootCaKeySealed(), []byte(bootCAPurpose))
			if err != nil {
				return fmt.Errorf("fleet boot CA key: %w", err)
			}
			for _, f := range []struct {
				path string
				data []byte
				mode fs.FileMode
			}{{certPath, []byte(sec.GetBootCaCertPem()), 0o644}, {keyPath, caKey, 0o600}} {
				if err := writeOnce(f.path, f.data, f.mode); errors.Is(err, errDiffers) {
					return fmt.Errorf("%s: the data directory holds another boot CA than the fleet's: firmware enrolled with the fleet's would refuse this appliance; remove %s (and re-enrol firmware that trusted it) to take the fleet's", f.path, dir)
				} else if err != nil {
					return fmt.Errorf("write the fleet's boot CA to %s: %w", f.path, err)
				}
			}
			return nil
		}
		var created []string
		for _, p := range []string{certPath, keyPath} {
			if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
				created = append(created, p)
			}
		}
		ca, err := pki.EnsureBootCA(dir)
		if err != nil {
			return err
		}
		caKey, err := os.ReadFile(keyPath)
		if err != nil {
			return err
		}
		sec.BootCaCertPem = string(ca.CertPEM())
		if sec.BootCaKeySealed, err = sl.Seal(caKey, []byte(bootCAPurpose)); err != nil {
			return err
		}
		_, err = record.Put(ctx, s.store, clusterSecretsKey, &sec, rev)
		if err == nil {
			s.log.Info("boot CA published to the fleet, sealed under the cluster key", "dir", dir)
			return nil
		}
		if !errors.Is(err, store.ErrConflict) {
			return fmt.Errorf("boot CA: publish: %w", err)
		}
		// Another appliance changed the secrets first (perhaps with its
		// boot CA): drop what this attempt made and read them again.
		for _, p := range created {
			os.Remove(p)
		}
	}
	return errors.New("boot CA: the fleet's secrets kept changing: try again")
}
