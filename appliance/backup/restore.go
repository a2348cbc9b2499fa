package backup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"filippo.io/age"

	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/internal/progress"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
)

// restoreWriters is how many records restore writes at once: bbolt
// group-commits concurrent writes, so a restore of thousands of records
// takes a few fsyncs, not one each.
const restoreWriters = 32

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
	// OpenLocal opens (creating it) the bbolt store file LocalFile in a
	// directory: the records are written there and checked first.
	OpenLocal func(dir string, log *slog.Logger) (store.Store, error)
	LocalFile string
	// Shared, when set, is where the records go once the whole file has
	// been checked (an etcd cluster whose prefix must hold no records);
	// the local file is then removed. Nil: the data directory's file.
	Shared *SharedStore
}

// SharedStore is a store several appliances share.
type SharedStore struct {
	// Name says where it is, for errors and RestoreResult.Store.
	Name string
	// Open opens it; dir is the data directory being restored, still
	// under its temporary name.
	Open func(ctx context.Context, dir string) (store.Store, error)
}

// RestoreResult is what Restore wrote.
type RestoreResult struct {
	Header  Header
	DataDir string
	// Store names where the records were written.
	Store   string
	Records int64
	Files   []string
	// Images is the catalog the backed-up appliance had; the artifacts
	// are not in the backup.
	Images []ImageManifestEntry
}

// Restore decrypts a backup and writes a new data directory from it: a
// bbolt store holding every record with the same key and value (the
// revisions are the new store's own), the CA, the BMC seal key, the
// cluster key and admin.conf when the backup has them. It is offline (no
// appliance runs on DataDir) and writes into a temporary directory beside
// DataDir, renamed into place only once the whole file has decrypted,
// authenticated and matched its counts: a wrong passphrase or a truncated
// or altered file writes nothing.
func Restore(ctx context.Context, o RestoreOptions) (res *RestoreResult, err error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	dir, err := filepath.Abs(o.DataDir)
	if err != nil {
		return nil, err
	}
	if err := checkFreshDataDir(dir, o.LocalFile); err != nil {
		return nil, err
	}
	f, err := os.Open(o.File)
	if err != nil {
		return nil, apierr.Invalidf("backup file: %v", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	id, err := age.NewScryptIdentity(string(o.Passphrase))
	if err != nil {
		return nil, apierr.Invalidf("passphrase: %v", err)
	}
	o.Progress.Stage("decrypt", fi.Size())
	defer o.Progress.Done()
	plain, err := age.Decrypt(o.Progress.Reader(f), id)
	if err != nil {
		var nomatch *age.NoIdentityMatchError
		if errors.As(err, &nomatch) || errors.Is(err, age.ErrIncorrectIdentity) {
			return nil, apierr.Invalidf("%s: wrong passphrase, or its header is damaged (nothing was written)", o.File)
		}
		return nil, apierr.DataLossf("%s is not a Corral backup or its header is damaged (%v): nothing was written", o.File, err)
	}

	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".restore-")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
			err = fmt.Errorf("%w (nothing was written to %s)", err, dir)
		}
	}()
	res, err = restoreInto(ctx, authReader{plain}, tmp, o.OpenLocal, o.Logger)
	if err != nil {
		if errors.Is(err, errUnauthenticated) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, apierr.DataLossf("%s is truncated or altered: %v", o.File, err)
		}
		return nil, err
	}
	if o.Shared != nil {
		// The whole file has been checked into the temporary bbolt
		// file; only now does anything reach the cluster.
		if err := copyToShared(ctx, tmp, o.OpenLocal, o.Shared, o.Logger); err != nil {
			return nil, err
		}
		if err := os.Remove(filepath.Join(tmp, o.LocalFile)); err != nil {
			return nil, err
		}
		res.Store = o.Shared.Name
	} else {
		res.Store = filepath.Join(dir, o.LocalFile)
	}
	// An empty directory checked above gives way (os.Rename never
	// replaces a directory); a non-empty one makes Remove fail.
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("data directory %s: %w", dir, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return nil, fmt.Errorf("move the restored data directory into place: %w", err)
	}
	if d, err := os.Open(parent); err == nil {
		if err := d.Sync(); err != nil {
			o.Logger.Warn("restore: the rename of the data directory may not be durable yet", "dir", parent, "err", err)
		}
		d.Close()
	}
	res.DataDir = dir
	return res, nil
}

// errUnauthenticated marks an error of the decrypting reader: age found a
// chunk that does not authenticate, or the file ended before its last one.
var errUnauthenticated = errors.New("the encrypted stream does not authenticate")

// authReader tags the decrypting reader's errors with errUnauthenticated.
type authReader struct{ r io.Reader }

func (a authReader) Read(p []byte) (int, error) {
	n, err := a.r.Read(p)
	if err != nil && err != io.EOF {
		err = fmt.Errorf("%w: %w", errUnauthenticated, err)
	}
	return n, err
}

// checkFreshDataDir refuses a data directory that exists and is not empty.
func checkFreshDataDir(dir, storeFile string) error {
	fi, err := os.Stat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return apierr.Invalidf("--data-dir %s is not a directory", dir)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	if len(ents) == 0 {
		return nil
	}
	var names []string
	what := "files"
	for _, e := range ents {
		names = append(names, e.Name())
		switch e.Name() {
		case storeFile:
			what = "a store (" + storeFile + ")"
		case path.Dir(backupCACert):
			if what == "files" {
				what = "a CA (" + path.Dir(backupCACert) + "/)"
			}
		}
	}
	sort.Strings(names)
	if len(names) > 5 {
		names = append(names[:5], "...")
	}
	return apierr.Preconditionf("--data-dir %s already holds %s (%s): restore creates a fresh data directory and never merges or overwrites; name a new directory", dir, what, strings.Join(names, ", "))
}

// restoreInto reads the decrypted stream and writes the data directory
// into dir.
func restoreInto(ctx context.Context, plain io.Reader, dir string, openLocal func(string, *slog.Logger) (store.Store, error), log *slog.Logger) (*RestoreResult, error) {
	fr, err := newFrameReader(plain)
	if err != nil {
		return nil, err
	}
	kind, p, err := fr.next()
	if err != nil {
		return nil, unexpected(err)
	}
	if kind != frameHeader {
		return nil, apierr.DataLossf("backup does not start with its header")
	}
	res := &RestoreResult{}
	if err := json.Unmarshal(p, &res.Header); err != nil {
		return nil, apierr.DataLossf("backup header: %v", err)
	}
	if err := res.Header.check(); err != nil {
		return nil, err
	}
	if res.Header.SchemaVersion > record.SchemaVersion {
		return nil, apierr.Invalidf("the backup's records are at schema version %d, this corrald reads up to %d: restore it with corrald %s or newer",
			res.Header.SchemaVersion, record.SchemaVersion, res.Header.CorralVersion)
	}

	st, err := openLocal(dir, log)
	if err != nil {
		return nil, err
	}
	w := newRecordWriter(ctx, st)
	files := map[string][]byte{}
	var end *backupEnd
	var recBytes int64
	for end == nil {
		kind, p, err := fr.next()
		if err != nil {
			w.close()
			st.Close()
			return nil, unexpected(err)
		}
		switch kind {
		case frameFile:
			name, data, err := splitNamed(p)
			if err == nil {
				err = checkBackupFile(name)
			}
			if err == nil && files[name] != nil {
				err = apierr.DataLossf("backup holds %s twice", name)
			}
			if err != nil {
				w.close()
				st.Close()
				return nil, err
			}
			files[name] = data
		case frameRecord:
			key, val, err := splitNamed(p)
			if err == nil {
				err = checkRecord(key, val)
			}
			if err == nil {
				err = w.put(key, val)
			}
			if err != nil {
				w.close()
				st.Close()
				return nil, err
			}
			res.Records++
			recBytes += int64(len(val))
		case frameEnd:
			end = &backupEnd{}
			if err := json.Unmarshal(p, end); err != nil {
				w.close()
				st.Close()
				return nil, apierr.DataLossf("backup end: %v", err)
			}
		default:
			w.close()
			st.Close()
			return nil, apierr.DataLossf("backup holds an unknown frame %q", kind)
		}
	}
	werr := w.close()
	if cerr := st.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return nil, werr
	}
	// The end frame must be the last thing in the file, and age checks
	// its final chunk when the stream ends.
	if _, _, err := fr.next(); !errors.Is(err, io.EOF) {
		if err == nil {
			return nil, apierr.DataLossf("backup has data after its end")
		}
		return nil, err
	}
	h := res.Header
	switch {
	case res.Records != h.Records || end.Records != h.Records || end.RecordBytes != recBytes:
		return nil, apierr.DataLossf("backup holds %d records (%d bytes); its header says %d, its end %d (%d bytes)", res.Records, recBytes, h.Records, end.Records, end.RecordBytes)
	case len(files) != len(h.Files) || end.Files != len(files):
		return nil, apierr.DataLossf("backup holds %d files; its header names %d, its end %d", len(files), len(h.Files), end.Files)
	case files[backupCACert] == nil || files[backupCAKey] == nil:
		return nil, apierr.DataLossf("backup holds no CA certificate and key")
	}
	for _, name := range h.Files {
		data, ok := files[name]
		if !ok {
			return nil, apierr.DataLossf("backup header names %s, which it does not hold", name)
		}
		if err := writeSynced(filepath.Join(dir, filepath.FromSlash(name)), data, os.FileMode(backupFiles[name])); err != nil {
			return nil, err
		}
		res.Files = append(res.Files, name)
	}
	if m := files[backupImagesIndex]; m != nil {
		if err := json.Unmarshal(m, &res.Images); err != nil {
			return nil, apierr.DataLossf("backup image manifest: %v", err)
		}
	}
	return res, nil
}

// checkRecord refuses a record that is not an envelope this build reads.
func checkRecord(key string, val []byte) error {
	if key == "" {
		return apierr.DataLossf("backup holds a record with an empty key")
	}
	v, err := record.EnvelopeVersion(val)
	switch {
	case err != nil:
		return apierr.DataLossf("backup record %s: %v", key, err)
	case v == 0 || v > record.SchemaVersion:
		return apierr.DataLossf("backup record %s is at schema version %d; this corrald reads 1 to %d", key, v, record.SchemaVersion)
	}
	return nil
}

// writeSynced writes a file and flushes it to disk.
func writeSynced(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// recordWriter writes records with restoreWriters concurrent creates. The
// first error stops it; put and close report it.
type recordWriter struct {
	ctx  context.Context
	st   store.Store
	ch   chan store.KV
	wg   sync.WaitGroup
	mu   sync.Mutex
	err  error
	done bool
}

func newRecordWriter(ctx context.Context, st store.Store) *recordWriter {
	w := &recordWriter{ctx: ctx, st: st, ch: make(chan store.KV, restoreWriters)}
	for range restoreWriters {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			for kv := range w.ch {
				if w.failed() != nil {
					continue
				}
				if _, err := st.Put(ctx, kv.Key, kv.Value, 0); err != nil {
					if errors.Is(err, store.ErrConflict) {
						err = apierr.DataLossf("backup holds record %s twice", kv.Key)
					}
					w.fail(err)
				}
			}
		}()
	}
	return w
}

func (w *recordWriter) failed() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

func (w *recordWriter) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = err
	}
}

func (w *recordWriter) put(key string, val []byte) error {
	if err := w.failed(); err != nil {
		return err
	}
	select {
	case w.ch <- store.KV{Key: key, Value: val}:
		return nil
	case <-w.ctx.Done():
		return w.ctx.Err()
	}
}

func (w *recordWriter) close() error {
	if !w.done {
		w.done = true
		close(w.ch)
		w.wg.Wait()
	}
	return w.failed()
}

// copyToShared writes every record of the verified bbolt file in dir into
// the shared store, whose prefix must hold no records. A failure
// deletes what it wrote (compare-and-swap on the revisions it got, so
// nothing anyone else wrote is touched) and says so if it cannot.
func copyToShared(ctx context.Context, dir string, openLocal func(string, *slog.Logger) (store.Store, error), shared *SharedStore, log *slog.Logger) (err error) {
	src, err := openLocal(dir, log)
	if err != nil {
		return err
	}
	defer src.Close()
	recs, err := src.List(ctx, "")
	if err != nil {
		return err
	}
	dst, err := shared.Open(ctx, dir)
	if err != nil {
		return err
	}
	defer dst.Close()
	where := shared.Name
	if existing, err := dst.List(ctx, ""); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	} else if len(existing) > 0 {
		return apierr.Preconditionf("%s already holds %d records (first %q): restore never merges or overwrites; use an empty prefix", where, len(existing), existing[0].Key)
	}
	var written []store.KV
	defer func() {
		if err == nil {
			return
		}
		left := 0
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, kv := range written {
			if derr := dst.Delete(cctx, kv.Key, kv.Revision); derr != nil && !errors.Is(derr, store.ErrNotFound) {
				left++
			}
		}
		if left > 0 {
			err = fmt.Errorf("%w; %d of the %d records written to %s could not be removed: remove them before restoring again", err, left, len(written), where)
		}
	}()
	for _, kv := range recs {
		rev, err := dst.Put(ctx, kv.Key, kv.Value, 0)
		if err != nil {
			return fmt.Errorf("%s: write %s: %w", where, kv.Key, err)
		}
		written = append(written, store.KV{Key: kv.Key, Revision: rev})
	}
	return nil
}
