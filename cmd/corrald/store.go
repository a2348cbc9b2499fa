package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/corralhq/corral/appliance"
	"github.com/corralhq/corral/auth/pki"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/bolt"
	"github.com/corralhq/corral/store/etcd"
)

// copyLockWait is how long store copy waits for a bolt file's lock: a
// running corrald holds it for as long as it runs, so waiting longer only
// delays the refusal.
const copyLockWait = time.Second

// newStoreCmd is `corrald store`: offline operations on a whole store.
func newStoreCmd() *cobra.Command {
	st := &cobra.Command{Use: "store", Short: "Offline store operations (corrald stopped)"}
	cp := &cobra.Command{
		Use:   "copy --from SRC --to DST",
		Short: "Copy every record of one store into an empty one, and verify the copy",
		Long: `Copy every record of one store into an empty one, then verify it.

SRC and DST are bolt:PATH (a store file, or a data directory holding
corral.db) or etcd://HOST:PORT[,HOST:PORT...][/PREFIX] (members over http;
etcd+https://... over TLS; the default prefix is /corral). --etcd-ca,
--etcd-cert and --etcd-key apply to whichever side is etcd.

The copy is offline: a bolt file is opened with its lock, so a corrald still
running on it makes the copy fail; stop the appliances first. A destination
that already holds records is refused (no merge, no overwrite). Records are
copied in key order, values byte for byte; the destination gives them its own
revisions. The copy is then verified: the same number of records, every key's
value equal, every destination revision present and strictly increasing in
key order, and the source unchanged. A copy that fails is removed from the
destination.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f := cmd.Flags()
			var o copyOptions
			o.from, _ = f.GetString("from")
			o.to, _ = f.GetString("to")
			o.etcd.CAFile, _ = f.GetString("etcd-ca")
			o.etcd.CertFile, _ = f.GetString("etcd-cert")
			o.etcd.KeyFile, _ = f.GetString("etcd-key")
			timeout, _ := f.GetDuration("etcd-timeout")
			if o.from == "" || o.to == "" {
				return apierr.Invalidf("store copy needs --from and --to (bolt:PATH or etcd://HOST:PORT[,...][/PREFIX])")
			}
			if timeout <= 0 {
				return apierr.Invalidf("--etcd-timeout %s: must be positive", timeout)
			}
			o.etcd.DialTimeout, o.etcd.RequestTimeout = timeout, timeout
			log, err := newLogger(cmd)
			if err != nil {
				return err
			}
			o.etcd.Logger = log.With("component", "store")
			sum, err := copyStore(cmd.Context(), o, log)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), sum)
			return nil
		},
	}
	f := cp.Flags()
	f.String("from", "", "the store to copy: bolt:PATH or etcd://HOST:PORT[,HOST:PORT...][/PREFIX] (env CORRAL_FROM)")
	f.String("to", "", "the empty store to copy into, same forms as --from (env CORRAL_TO)")
	f.String("etcd-ca", "", "CA file verifying the etcd members (env CORRAL_ETCD_CA)")
	f.String("etcd-cert", "", "client certificate for etcd (env CORRAL_ETCD_CERT)")
	f.String("etcd-key", "", "client key for etcd (env CORRAL_ETCD_KEY)")
	f.Duration("etcd-timeout", etcd.DefaultRequestTimeout, "bound on connecting to etcd and on each request (env CORRAL_ETCD_TIMEOUT)")
	st.AddCommand(cp)
	return st
}

// copyOptions is one `store copy`.
type copyOptions struct {
	from, to string
	// etcd holds the TLS files and timeouts for an etcd side; its
	// endpoints and prefix come from the address.
	etcd etcd.Options
}

// storeEnd is one side of a copy.
type storeEnd struct {
	addr string // as the operator wrote it
	st   store.Store
	// bolt: the store file, whether this copy created it, and the data
	// directory it sits in.
	path    string
	created bool
	dataDir string
	// etcd: the key prefix the store writes under.
	prefix string
}

func (e *storeEnd) isEtcd() bool { return e.path == "" }

// all is the List prefix that holds every record of the end. In etcd it is
// "/": a key not starting with one would run into the store's prefix
// ("/corral" + "x" is "/corralx", another tenant's prefix), and every
// Corral key starts with one.
func (e *storeEnd) all() string {
	if e.isEtcd() {
		return "/"
	}
	return ""
}

// where names what the end's records are under, for messages.
func (e *storeEnd) where() string {
	if e.isEtcd() {
		return "prefix " + e.prefix
	}
	return e.path
}

// openEnd opens addr as the source (source=true) or the destination.
func openEnd(ctx context.Context, addr string, source bool, eo etcd.Options, log *slog.Logger) (*storeEnd, error) {
	flag := "--to"
	if source {
		flag = "--from"
	}
	if path, ok := strings.CutPrefix(addr, "bolt:"); ok {
		return openBoltEnd(addr, flag, path, source, log)
	}
	if !strings.HasPrefix(addr, "etcd://") && !strings.HasPrefix(addr, "etcd+https://") && !strings.HasPrefix(addr, "etcd+http://") {
		return nil, apierr.Invalidf("%s %q: want bolt:PATH or etcd://HOST:PORT[,HOST:PORT...][/PREFIX] (etcd+https:// for TLS)", flag, addr)
	}
	eps, prefix, err := etcd.ParseURL(addr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	eo.Endpoints, eo.Prefix = eps, prefix
	s, err := etcd.Open(ctx, eo)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", flag, addr, err)
	}
	return &storeEnd{addr: addr, st: s, prefix: s.Prefix()}, nil
}

func openBoltEnd(addr, flag, path string, source bool, log *slog.Logger) (*storeEnd, error) {
	if path == "" {
		return nil, apierr.Invalidf("%s %q: bolt: needs a path (bolt:/var/lib/corral/corral.db)", flag, addr)
	}
	path = filepath.Clean(path)
	fi, err := os.Stat(path)
	if err == nil && fi.IsDir() {
		// A data directory: its store file.
		path = filepath.Join(path, appliance.StoreFile)
		fi, err = os.Stat(path)
	}
	created := false
	switch {
	case err == nil && !fi.Mode().IsRegular():
		return nil, apierr.Invalidf("%s %s: %s is not a regular file", flag, addr, path)
	case errors.Is(err, os.ErrNotExist) && source:
		// bolt.Open would create it: a copy from nothing is a typo.
		return nil, apierr.NotFoundf("%s %s: no store file at %s", flag, addr, path)
	case errors.Is(err, os.ErrNotExist):
		if d, derr := os.Stat(filepath.Dir(path)); derr != nil || !d.IsDir() {
			return nil, apierr.NotFoundf("%s %s: directory %s does not exist", flag, addr, filepath.Dir(path))
		}
		created = true
	case err != nil:
		return nil, fmt.Errorf("%s %s: %w", flag, addr, err)
	}
	s, err := bolt.Open(path, bolt.Options{Logger: log.With("component", "store"), Timeout: copyLockWait})
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, apierr.Preconditionf("%s %s: %v (is corrald still running on it? store copy is offline: stop it first)", flag, addr, err)
	}
	if err != nil {
		if created {
			os.Remove(path)
		}
		return nil, fmt.Errorf("%s %s: %w", flag, addr, err)
	}
	return &storeEnd{addr: addr, st: s, path: path, created: created, dataDir: filepath.Dir(path)}, nil
}

// copyStore copies o.from into o.to and verifies the copy; it returns the
// summary line. On any failure after the first write it removes what it
// wrote (a bolt file it created is deleted), so a failed copy leaves the
// destination as it found it, and says so if it cannot.
func copyStore(ctx context.Context, o copyOptions, log *slog.Logger) (summary string, err error) {
	src, err := openEnd(ctx, o.from, true, o.etcd, log)
	if err != nil {
		return "", err
	}
	defer src.st.Close()
	if !src.isEtcd() && strings.HasPrefix(o.to, "bolt:") {
		// The same file twice would meet its own lock and blame corrald.
		if p := filepath.Clean(strings.TrimPrefix(o.to, "bolt:")); p == src.path || p == src.dataDir {
			return "", apierr.Invalidf("--from and --to are the same store file %s", src.path)
		}
	}
	recs, err := src.st.List(ctx, src.all())
	if err != nil {
		return "", fmt.Errorf("--from %s: list: %w", src.addr, err)
	}
	if len(recs) == 0 {
		return "", apierr.Preconditionf("--from %s holds no records (%s): nothing to copy; is the path or prefix right?", src.addr, src.where())
	}

	dst, err := openEnd(ctx, o.to, false, o.etcd, log)
	if err != nil {
		return "", err
	}
	var written []store.KV // what this copy put, for the roll-back
	defer func() {
		if err != nil {
			err = rollback(dst, written, err)
		} else {
			err = dst.st.Close()
		}
	}()
	if dst.isEtcd() {
		for _, kv := range recs {
			if !strings.HasPrefix(kv.Key, "/") {
				return "", apierr.Invalidf("--from %s: key %q does not start with \"/\", which an etcd prefix cannot hold apart from another prefix's keys", src.addr, kv.Key)
			}
		}
	}
	existing, err := dst.st.List(ctx, dst.all())
	if err != nil {
		return "", fmt.Errorf("--to %s: list: %w", dst.addr, err)
	}
	if n := len(existing); n > 0 {
		return "", apierr.Preconditionf("--to %s already holds %d records (%s, first %q): store copy neither merges nor overwrites; copy into an empty store", dst.addr, n, dst.where(), existing[0].Key)
	}

	var bytesCopied int64
	for i, kv := range recs {
		rev, perr := dst.st.Put(ctx, kv.Key, kv.Value, 0)
		if perr != nil {
			return "", fmt.Errorf("--to %s: copy %q (record %d of %d): %w", dst.addr, kv.Key, i+1, len(recs), perr)
		}
		written = append(written, store.KV{Key: kv.Key, Revision: rev})
		bytesCopied += int64(len(kv.Value))
	}
	if err := verifyCopy(ctx, src, dst, recs, written); err != nil {
		return "", err
	}
	note, err := publishSecrets(ctx, src, dst)
	if err != nil {
		return "", err
	}
	n := len(recs)
	return fmt.Sprintf("copied %d records (%d bytes) from %s to %s; verified %d of %d; destination revisions %d..%d",
		n, bytesCopied, src.addr, dst.addr, n, n, written[0].Revision, written[n-1].Revision) + note, nil
}

// verifyCopy re-reads both sides: the destination holds exactly recs (keys,
// values byte for byte) at the revisions its writes returned, strictly
// increasing in key order, and the source still holds recs unchanged.
func verifyCopy(ctx context.Context, src, dst *storeEnd, recs, written []store.KV) error {
	got, err := dst.st.List(ctx, dst.all())
	if err != nil {
		return fmt.Errorf("verify: --to %s: list: %w", dst.addr, err)
	}
	if len(got) != len(recs) {
		return apierr.DataLossf("verify: --to %s holds %d records after copying %d (is something else writing to it?)", dst.addr, len(got), len(recs))
	}
	for i, kv := range got {
		want := recs[i]
		switch {
		case kv.Key != want.Key:
			return apierr.DataLossf("verify: --to %s: record %d is %q, want %q", dst.addr, i+1, kv.Key, want.Key)
		case !bytes.Equal(kv.Value, want.Value):
			return apierr.DataLossf("verify: --to %s: %q: value differs from the source's (%d bytes, source %d)", dst.addr, kv.Key, len(kv.Value), len(want.Value))
		case kv.Revision != written[i].Revision:
			return apierr.DataLossf("verify: --to %s: %q is at revision %d, the copy wrote it at %d (is something else writing to it?)", dst.addr, kv.Key, kv.Revision, written[i].Revision)
		case i > 0 && kv.Revision <= got[i-1].Revision:
			return apierr.DataLossf("verify: --to %s: %q has revision %d, not above %q's %d", dst.addr, kv.Key, kv.Revision, got[i-1].Key, got[i-1].Revision)
		}
	}
	again, err := src.st.List(ctx, src.all())
	if err != nil {
		return fmt.Errorf("verify: --from %s: list: %w", src.addr, err)
	}
	changed := len(again) != len(recs)
	for i := 0; !changed && i < len(again); i++ {
		changed = again[i].Key != recs[i].Key || again[i].Revision != recs[i].Revision || !bytes.Equal(again[i].Value, recs[i].Value)
	}
	if changed {
		return apierr.Preconditionf("verify: --from %s changed during the copy (%d records before, %d after): is an appliance still running on it? stop them all and copy again", src.addr, len(recs), len(again))
	}
	return nil
}

// rollback undoes a failed copy: it deletes the records this copy wrote
// (compare-and-swap on the revisions it got, so nothing written by anyone
// else is touched) or, for a bolt file the copy created, the file. It
// returns cause, extended with what could not be undone.
func rollback(dst *storeEnd, written []store.KV, cause error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if dst.created {
		dst.st.Close()
		if err := os.Remove(dst.path); err != nil {
			return fmt.Errorf("%w; the partial copy %s could not be removed: %v", cause, dst.path, err)
		}
		return cause
	}
	left := 0
	var first error
	for i := len(written) - 1; i >= 0; i-- {
		kv := written[i]
		if err := dst.st.Delete(ctx, kv.Key, kv.Revision); err != nil && !errors.Is(err, store.ErrNotFound) {
			left++
			if first == nil {
				first = err
			}
		}
	}
	dst.st.Close()
	if left > 0 {
		return fmt.Errorf("%w; %d of the %d records copied into %s could not be removed (%v): remove them (%s) before copying again", cause, left, len(written), dst.addr, first, dst.where())
	}
	return cause
}

// publishSecrets carries what an appliance keeps beside its store into the
// destination: the CA and the seal key live in the data directory of a
// bolt appliance and in the store, sealed under the fleet's cluster key,
// for an etcd fleet. bolt → etcd seals the source data directory's CA and
// seal key under its cluster key (DATA_DIR/cluster.key, created when
// missing: every appliance of the fleet needs a copy). etcd → bolt writes
// the fleet's CA and seal key into the destination's data directory, with
// the cluster key found there.
func publishSecrets(ctx context.Context, src, dst *storeEnd) (note string, err error) {
	switch {
	case !src.isEtcd() && dst.isEtcd():
		keyPath := filepath.Join(src.dataDir, appliance.ClusterKeyFile)
		if _, err := os.Stat(filepath.Join(src.dataDir, appliance.PKIDir, pki.CACertFile)); errors.Is(err, fs.ErrNotExist) {
			return fmt.Sprintf("\nno CA in %s: the first appliance on %s creates the fleet's", src.dataDir, dst.addr), nil
		}
		if _, err := appliance.PublishSecrets(ctx, dst.st, src.dataDir, keyPath, "store copy from "+src.addr, true); err != nil {
			return "", fmt.Errorf("publish the CA and BMC seal key of %s to %s: %w", src.dataDir, dst.addr, err)
		}
		return fmt.Sprintf("\npublished the CA and BMC seal key of %s to %s, sealed under the cluster key %s: copy it to every appliance of the fleet (their DATA_DIR/%s, mode 0600)",
			src.dataDir, dst.addr, keyPath, appliance.ClusterKeyFile), nil
	case src.isEtcd() && !dst.isEtcd():
		keyPath := filepath.Join(dst.dataDir, appliance.ClusterKeyFile)
		ok, err := appliance.WriteSecrets(ctx, dst.st, dst.dataDir, keyPath, src.addr)
		if err != nil {
			return "", fmt.Errorf("write the fleet's CA and BMC seal key into %s: %w", dst.dataDir, err)
		}
		if ok {
			return fmt.Sprintf("\nwrote the fleet's CA and BMC seal key into %s", dst.dataDir), nil
		}
	}
	return "", nil
}
