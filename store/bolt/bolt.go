// Package bolt is the default implementation of the store contract: an
// embedded, single-file store on go.etcd.io/bbolt. It owns the on-disk
// format of that file (a records bucket whose values are an 8-byte
// big-endian revision followed by the value bytes, and a meta bucket with
// the format marker and the store-wide revision), the open-time integrity
// check, the group-commit writer and the watcher fan-out.
//
// It imports nothing of Corral's except the store contract
// (github.com/corralhq/corral/store).
//
// Writes are group-committed: concurrent Put, Delete, Update and Txn
// calls queue to a single committer goroutine, which applies everything
// already queued as one batch, made durable by one journal append and one
// fdatasync (journal.go) before any of it is answered; the journal is
// folded into bbolt in large transactions. A lone writer is committed at
// once. A Txn is one op of a batch: its writes share one revision and
// one journal record.
//
// Open never modifies a file it cannot fully validate: a truncated,
// corrupt or foreign file yields an error that names the path and wraps
// store.ErrCorrupt.
package bolt

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	bbolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/internal/watch"
)

// DefaultTimeout is how long Open waits for the file lock when
// Options.Timeout is not set.
const DefaultTimeout = 2 * time.Second

const (
	// maxBatch bounds how many queued writes one commit takes.
	maxBatch = 256
	// watchBuffer is how many events a watcher may have pending before it
	// is disconnected.
	watchBuffer = 256
	// formatV1 marks a file written by this package.
	formatV1 = "corral-store-v1"
)

var (
	recordsBucket = []byte("records")
	metaBucket    = []byte("meta")
	formatKey     = []byte("format")
	revKey        = []byte("rev")
	idKey         = []byte("id")
)

// Options configures Open.
type Options struct {
	// Logger receives operational messages. Nil discards them.
	Logger *slog.Logger
	// Timeout is how long to wait for the exclusive file lock held by
	// another process (or another Store in this one) before giving up.
	// Zero or negative means DefaultTimeout.
	Timeout time.Duration
	// HistoryEvents and HistoryBytes bound the in-memory history of recent
	// changes that WatchFrom resumes from (defaults 16384 events and 64
	// MiB of keys and values). bbolt keeps no history of its own: the ring
	// starts empty at Open, so a resume from before Open is refused with
	// store.ErrCompacted.
	HistoryEvents, HistoryBytes int
	// NoJournal commits every batch as its own bbolt transaction (two
	// fdatasyncs) instead of through the journal (one append and one
	// fdatasync, folded into bbolt in large transactions).
	NoJournal bool
	// CommitWindow, if positive, is the shortest time between two
	// batches while writes made under store.WithCommitWindow keep coming: the
	// committer waits out the rest of it and takes every write that
	// queued meanwhile into one batch, one flush (window.go). Other
	// writes never wait for it. Zero: every batch is taken at once.
	// corrald sets DefaultCommitWindow.
	CommitWindow time.Duration
}

// DefaultCommitWindow is corrald's commit window (Options.CommitWindow):
// under a sustained DHCP load at most ~1,000 flushes a second, each lease
// waiting at most about a millisecond more (bench/results/2026-11-dhcp.md,
// 24 Nov 2026, the commit window).
const DefaultCommitWindow = time.Millisecond

// Store is a bbolt-backed store.Store. Create it with Open.
type Store struct {
	path string
	db   *bbolt.DB
	log  *slog.Logger
	hub  *watch.Hub

	// closeMu is held shared by every call for its whole duration and
	// exclusively by Close, so Close waits for in-flight calls and no
	// write is left queued when the committer stops.
	closeMu sync.RWMutex
	closed  bool

	// ops is the queue of writes; pending counts ops queued (or being
	// queued) and not yet taken. committing is set by the one goroutine
	// committing a batch (commit.go); wake wakes the committer goroutine.
	ops        chan *op
	pending    atomic.Int64
	committing atomic.Bool
	wake       chan struct{}
	batch      []*op // committer only
	// jscratch is commitJournal's working space, kept between batches so
	// that a lease's commit does not allocate it anew (committer only).
	jscratch      journalScratch
	committerDone chan struct{}

	// The commit window (window.go): window is Options.CommitWindow;
	// lastFlush is when the last batch was taken; windowSkip and lonely
	// are the adaptation to a sequential writer (committer only). urgent
	// counts queued ops that may not wait; waiting is set while the
	// committer waits, and windowTimer is kicked to end the wait.
	window      time.Duration
	windowTimer *windowTimer
	lastFlush   time.Time
	windowSkip  int
	lonely      int
	urgent      atomic.Int64
	waiting     atomic.Bool

	// The journal files (nil with Options.NoJournal) and the overlay:
	// changes journaled and not yet folded into bbolt. jr is the file the
	// committer appends to, jnext the other one: empty, or holding the
	// records of the frozen overlay a background fold is writing into
	// bbolt (journal.go). Only the committer writes ov and ovRev, and
	// freezes ov into frozen (under ovMu); the fold forgets frozen (under
	// ovMu) once bbolt has it. Readers read them under ovMu.RLock, held
	// until their bbolt read has begun, so a fold cannot slip between.
	jr, jnext *journal
	jrs       [2]*journal // both files, in name order
	ovMu      sync.RWMutex
	ov        map[string]ovEntry
	ovRev     int64 // the store revision: the last one journaled or committed
	frozen    map[string]ovEntry
	frozenRev int64
	foldDone  chan error // a background fold runs (committer only)
	failed    error      // a journal append failed: writes are refused (committer only)
	// foldBytes is the journal's size bound (foldBytes; tests lower it).
	foldBytes int64
	// foldHook, set by tests only, is called by a fold of the frozen
	// overlay before (false) and after (true) its bbolt commit.
	foldHook func(committed bool)

	// Counters for tests and diagnostics.
	commits atomic.Int64 // successful commits that changed something
	writes  atomic.Int64 // successful Put and Delete operations
	folds   atomic.Int64 // overlay folds into bbolt
	// windowWaits counts waits for the commit window.
	windowWaits atomic.Int64
	// foldKeys counts keys written by folds (tests: a fold yields).
	foldKeys atomic.Int64
}

var (
	_ store.Store          = (*Store)(nil)
	_ store.HistoryWatcher = (*Store)(nil)
)

// Open opens or creates the store file at path. A missing file is created;
// an existing file must be a valid store file (or a bbolt file with no
// buckets at all, which is initialised). A zero-length, truncated, corrupt
// or foreign file is refused, left untouched, and reported with an error
// wrapping store.ErrCorrupt. If another process holds the file, Open fails
// after opts.Timeout.
func Open(path string, opts Options) (*Store, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}

	fresh := false
	switch info, err := os.Stat(path); {
	case errors.Is(err, os.ErrNotExist):
		fresh = true
	case err != nil:
		return nil, fmt.Errorf("bolt: open %s: %w", path, err)
	case !info.Mode().IsRegular():
		return nil, fmt.Errorf("bolt: open %s: not a regular file", path)
	case info.Size() == 0:
		// bbolt would silently initialise an empty file. A store file is
		// never empty once created, so this is damage, not a new store.
		return nil, fmt.Errorf("bolt: open %s: %w", path, corruptf("file is empty (0 bytes)"))
	default:
		if err := checkMetaPages(path, info.Size(), log); err != nil {
			return nil, fmt.Errorf("bolt: open %s: %w", path, err)
		}
		var err error
		fresh, err = validate(path, timeout)
		if err != nil {
			return nil, fmt.Errorf("bolt: open %s: %w", path, err)
		}
	}

	db, err := openDB(path, &bbolt.Options{Timeout: timeout})
	if err != nil {
		return nil, fmt.Errorf("bolt: open %s: %w", path, lockErr(err, timeout))
	}
	if fresh {
		err = db.Update(func(tx *bbolt.Tx) error {
			if len(bucketNames(tx)) != 0 {
				// Someone wrote to the file between validation and now.
				return corruptf("file changed while opening")
			}
			meta, err := tx.CreateBucket(metaBucket)
			if err != nil {
				return err
			}
			if _, err := tx.CreateBucket(recordsBucket); err != nil {
				return err
			}
			if err := meta.Put(formatKey, []byte(formatV1)); err != nil {
				return err
			}
			return meta.Put(revKey, encodeRev(0))
		})
		if err != nil {
			_ = db.Close()
			return nil, fmt.Errorf("bolt: open %s: initialise: %w", path, err)
		}
	}

	var openRev int64
	err = db.View(func(tx *bbolt.Tx) error {
		meta := tx.Bucket(metaBucket)
		if meta == nil {
			return corruptf("meta bucket missing")
		}
		openRev, err = decodeRev(meta.Get(revKey))
		return err
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("bolt: open %s: %w", path, err)
	}
	s := &Store{
		path:          path,
		db:            db,
		log:           log,
		hub:           watch.NewHub(watchBuffer, log),
		ops:           make(chan *op, maxBatch),
		wake:          make(chan struct{}, 1),
		committerDone: make(chan struct{}),
		ov:            map[string]ovEntry{},
		foldBytes:     foldBytes,
	}
	if opts.CommitWindow > 0 {
		s.window = opts.CommitWindow
		s.windowTimer = newWindowTimer()
	}
	id, err := storeID(db)
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("bolt: open %s: %w", path, err)
	}
	// A journal left by a crash is replayed even with NoJournal.
	left := false
	for _, jp := range journalPaths(path) {
		if _, serr := os.Stat(jp); serr == nil {
			left = true
		}
	}
	if !opts.NoJournal || left {
		for i, jp := range journalPaths(path) {
			if s.jrs[i], err = openJournal(jp, path, id); err != nil {
				break
			}
		}
		if err == nil {
			openRev, err = s.replay(openRev)
		}
		if err != nil {
			s.closeJournals()
			_ = db.Close()
			return nil, fmt.Errorf("bolt: open %s: %w", path, err)
		}
		s.jr, s.jnext = s.jrs[0], s.jrs[1]
		if opts.NoJournal {
			s.closeJournals()
		}
	}
	s.ovRev = openRev
	s.hub.SetHistory(opts.HistoryEvents, opts.HistoryBytes, openRev)
	go s.commitLoop()
	log.Info("store opened", "path", path, "fresh", fresh)
	return s, nil
}

// storeID returns the store file's id (meta "id", 16 random bytes),
// creating it in a store that has none yet. The journal names it, so a
// journal is never applied to another store file.
func storeID(db *bbolt.DB) ([]byte, error) {
	var id []byte
	err := db.View(func(tx *bbolt.Tx) error {
		if v := tx.Bucket(metaBucket).Get(idKey); len(v) == storeIDLen {
			id = append([]byte(nil), v...)
		}
		return nil
	})
	if err != nil || id != nil {
		return id, err
	}
	id = make([]byte, storeIDLen)
	if _, err := rand.Read(id); err != nil {
		return nil, err
	}
	err = db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(metaBucket).Put(idKey, id) })
	if err != nil {
		return nil, fmt.Errorf("store id: %w", err)
	}
	return id, nil
}

// openDB calls bbolt.Open, converting a panic inside it into an error and
// making sure the file descriptor (and with it the file lock) is released
// if bbolt gave up half-way.
func openDB(path string, o *bbolt.Options) (db *bbolt.DB, err error) {
	var f *os.File
	o.OpenFile = func(name string, flag int, perm os.FileMode) (*os.File, error) {
		file, err := os.OpenFile(name, flag, perm)
		f = file
		return file, err
	}
	defer func() {
		if r := recover(); r != nil {
			if f != nil {
				_ = f.Close()
			}
			db, err = nil, corruptf("bbolt panicked while opening: %v", r)
		}
	}()
	return bbolt.Open(path, 0o600, o)
}

func lockErr(err error, timeout time.Duration) error {
	if errors.Is(err, berrors.ErrTimeout) {
		return fmt.Errorf("file is locked by another process (waited %s): %w", timeout, err)
	}
	return err
}

// corruptf returns an error wrapping store.ErrCorrupt.
func corruptf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", store.ErrCorrupt, fmt.Sprintf(format, args...))
}

func bucketNames(tx *bbolt.Tx) []string {
	var names []string
	_ = tx.ForEach(func(name []byte, _ *bbolt.Bucket) error {
		names = append(names, string(name))
		return nil
	})
	return names
}

// encodeRecord lays out a record value: 8-byte big-endian revision, then the
// value bytes.
func encodeRecord(rev int64, value []byte) []byte {
	buf := make([]byte, 8+len(value))
	binary.BigEndian.PutUint64(buf, uint64(rev))
	copy(buf[8:], value)
	return buf
}

// decodeRecord splits a stored record. The returned value aliases raw.
func decodeRecord(raw []byte) (int64, []byte, error) {
	if len(raw) < 8 {
		return 0, nil, corruptf("record is %d bytes, shorter than its 8-byte revision", len(raw))
	}
	rev := int64(binary.BigEndian.Uint64(raw))
	if rev <= 0 {
		return 0, nil, corruptf("record has invalid revision %d", rev)
	}
	return rev, raw[8:], nil
}

func encodeRev(rev int64) []byte {
	return binary.BigEndian.AppendUint64(nil, uint64(rev))
}

func decodeRev(raw []byte) (int64, error) {
	if len(raw) != 8 {
		return 0, corruptf("store revision is %d bytes, want 8", len(raw))
	}
	rev := int64(binary.BigEndian.Uint64(raw))
	if rev < 0 {
		return 0, corruptf("store revision %d is negative", rev)
	}
	return rev, nil
}

// enter takes the shared close lock; the caller must call s.closeMu.RUnlock
// when it returns nil.
func (s *Store) enter() error {
	s.closeMu.RLock()
	if s.closed {
		s.closeMu.RUnlock()
		return store.ErrClosed
	}
	return nil
}

// Get returns the record at key, or store.ErrNotFound.
func (s *Store) Get(ctx context.Context, key string) (store.KV, error) {
	if err := ctx.Err(); err != nil {
		return store.KV{}, err
	}
	if err := s.enter(); err != nil {
		return store.KV{}, err
	}
	defer s.closeMu.RUnlock()

	// The overlay is consulted and the bbolt read begun under ovMu, then
	// the lock is let go: a fold commits bbolt before it clears the
	// overlay, so the pair is one consistent picture, and a slow read
	// never holds up the committer (which takes ovMu after each append).
	s.ovMu.RLock()
	e, ok := s.ov[key]
	if !ok {
		e, ok = s.frozen[key]
	}
	if ok {
		s.ovMu.RUnlock()
		if e.deleted {
			return store.KV{}, fmt.Errorf("bolt: get %q: %w", key, store.ErrNotFound)
		}
		return store.KV{Key: key, Value: append([]byte{}, e.value...), Revision: e.rev}, nil
	}
	tx, err := s.db.Begin(false)
	s.ovMu.RUnlock()
	if err != nil {
		return store.KV{}, fmt.Errorf("bolt: get %q: %w", key, err)
	}
	defer func() { _ = tx.Rollback() }()
	var kv store.KV
	err = func() error {
		b := tx.Bucket(recordsBucket)
		if b == nil {
			return corruptf("records bucket missing")
		}
		raw := b.Get([]byte(key))
		if raw == nil {
			return store.ErrNotFound
		}
		rev, val, err := decodeRecord(raw)
		if err != nil {
			return err
		}
		kv = store.KV{Key: key, Value: append([]byte{}, val...), Revision: rev}
		return nil
	}()
	if err != nil {
		return store.KV{}, fmt.Errorf("bolt: get %q: %w", key, err)
	}
	return kv, nil
}

// List returns every record whose key starts with prefix, in key order.
func (s *Store) List(ctx context.Context, prefix string) ([]store.KV, error) {
	kvs, _, err := s.ListRevision(ctx, prefix)
	return kvs, err
}

// ListRevision implements store.HistoryWatcher: List, and the store
// revision read in the same transaction.
func (s *Store) ListRevision(ctx context.Context, prefix string) ([]store.KV, int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	if err := s.enter(); err != nil {
		return nil, 0, err
	}
	defer s.closeMu.RUnlock()

	out := []store.KV{}
	var cur int64
	tx, ov, ovRev, err := s.beginRead(prefix)
	if err != nil {
		return nil, 0, fmt.Errorf("bolt: list %q: %w", prefix, err)
	}
	defer func() { _ = tx.Rollback() }()
	err = func() error {
		b := tx.Bucket(recordsBucket)
		meta := tx.Bucket(metaBucket)
		if b == nil || meta == nil {
			return corruptf("store buckets missing")
		}
		var err error
		if cur, err = decodeRev(meta.Get(revKey)); err != nil {
			return err
		}
		c := b.Cursor()
		for k, raw := c.Seek([]byte(prefix)); k != nil && strings.HasPrefix(string(k), prefix); k, raw = c.Next() {
			rev, val, err := decodeRecord(raw)
			if err != nil {
				return fmt.Errorf("key %q: %w", k, err)
			}
			out = append(out, store.KV{Key: string(k), Value: append([]byte{}, val...), Revision: rev})
		}
		return nil
	}()
	if err != nil {
		return nil, 0, fmt.Errorf("bolt: list %q: %w", prefix, err)
	}
	out, cur = mergeOverlay(ov, ovRev, out, cur)
	return out, cur, nil
}

// Revision implements store.HistoryWatcher.
func (s *Store) Revision(ctx context.Context) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.closeMu.RUnlock()
	rev, err := s.revision()
	if err != nil {
		return 0, fmt.Errorf("bolt: revision: %w", err)
	}
	return rev, nil
}

// revision is the store revision: the last one committed, journaled
// included.
func (s *Store) revision() (int64, error) {
	s.ovMu.RLock()
	defer s.ovMu.RUnlock()
	rev, err := s.boltRevision()
	return max(rev, s.ovRev), err
}

// beginRead begins a bbolt read transaction and copies the overlay's
// entries under prefix, both under ovMu, and lets the lock go: a fold
// commits bbolt before it clears the overlay, so the two are one
// consistent picture, and a long scan of the transaction never holds up
// the committer. The caller rolls tx back.
func (s *Store) beginRead(prefix string) (*bbolt.Tx, map[string]ovEntry, int64, error) {
	s.ovMu.RLock()
	defer s.ovMu.RUnlock()
	tx, err := s.db.Begin(false)
	if err != nil {
		return nil, nil, 0, err
	}
	var ov map[string]ovEntry
	for _, m := range []map[string]ovEntry{s.frozen, s.ov} { // the newer last
		for k, e := range m {
			if strings.HasPrefix(k, prefix) {
				if ov == nil {
					ov = make(map[string]ovEntry)
				}
				ov[k] = e // values in the overlay are never changed in place
			}
		}
	}
	return tx, ov, s.ovRev, nil
}

// mergeOverlay merges overlay entries ov (already limited to a prefix)
// into out (in key order, as read from bbolt at revision cur) and returns
// the merged records and revision.
func mergeOverlay(ov map[string]ovEntry, ovRev int64, out []store.KV, cur int64) ([]store.KV, int64) {
	cur = max(cur, ovRev)
	if len(ov) == 0 {
		return out, cur
	}
	keys := slices.Sorted(maps.Keys(ov))
	merged := make([]store.KV, 0, len(out)+len(keys))
	i := 0
	for _, k := range keys {
		for i < len(out) && out[i].Key < k {
			merged = append(merged, out[i])
			i++
		}
		if i < len(out) && out[i].Key == k {
			i++ // replaced (or deleted) by the overlay
		}
		if e := ov[k]; !e.deleted {
			merged = append(merged, store.KV{Key: k, Value: append([]byte{}, e.value...), Revision: e.rev})
		}
	}
	merged = append(merged, out[i:]...)
	return merged, cur
}

// boltRevision reads the revision committed to bbolt.
func (s *Store) boltRevision() (int64, error) {
	var cur int64
	err := s.db.View(func(tx *bbolt.Tx) error {
		meta := tx.Bucket(metaBucket)
		if meta == nil {
			return corruptf("meta bucket missing")
		}
		var err error
		cur, err = decodeRev(meta.Get(revKey))
		return err
	})
	return cur, err
}

// WatchFrom implements store.HistoryWatcher from the in-memory ring of
// recent events (Options.HistoryEvents, HistoryBytes). The ring starts
// empty at Open: only revisions at or after the store's revision at Open,
// and not yet pushed out of the ring, can be resumed from.
func (s *Store) WatchFrom(ctx context.Context, prefix string, afterRev int64) (<-chan store.Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.closeMu.RUnlock()
	cur, err := s.revision()
	if err != nil {
		return nil, fmt.Errorf("bolt: watch %q: %w", prefix, err)
	}
	if afterRev > cur || afterRev < 0 {
		return nil, fmt.Errorf("bolt: watch %q: revision %d is beyond the store's current revision %d (a different or restored store?); re-list with from_revision 0: %w", prefix, afterRev, cur, store.ErrCompacted)
	}
	ch, err := s.hub.AddFrom(ctx, prefix, afterRev)
	if err != nil {
		return nil, fmt.Errorf("bolt: watch %q: %w", prefix, err)
	}
	return ch, nil
}

// Put writes value at key if the record's current revision equals rev
// (rev 0: the key must not exist) and returns the new revision. The write
// has been fsynced when Put returns nil.
func (s *Store) Put(ctx context.Context, key string, value []byte, rev int64) (int64, error) {
	if err := checkKey(key); err != nil {
		return 0, fmt.Errorf("bolt: put: %w", err)
	}
	o := newOp(opPut, key, rev)
	o.value = value
	res, err := s.submit(ctx, o)
	if err != nil {
		return 0, fmt.Errorf("bolt: put %q: %w", key, err)
	}
	return res, nil
}

// checkKey refuses a key bbolt cannot hold. The journal takes any key,
// so a longer one would be answered and then fail every fold, and the
// replay at Open, for good.
func checkKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("empty key")
	case len(key) > bbolt.MaxKeySize:
		return fmt.Errorf("key is %d bytes, longer than the %d a key may have", len(key), bbolt.MaxKeySize)
	}
	return nil
}

// Delete removes key if its current revision equals rev. The delete has
// been fsynced when Delete returns nil.
func (s *Store) Delete(ctx context.Context, key string, rev int64) error {
	if _, err := s.submit(ctx, newOp(opDelete, key, rev)); err != nil {
		return fmt.Errorf("bolt: delete %q: %w", key, err)
	}
	return nil
}

// Watch streams changes to keys with the given prefix that commit after
// Watch returns. Events are sent only after their commit reached disk. The
// channel is closed when ctx ends, the store closes, or the watcher falls
// more than a fixed number of events behind.
func (s *Store) Watch(ctx context.Context, prefix string) (<-chan store.Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.closeMu.RUnlock()
	return s.hub.Add(ctx, prefix), nil
}

// closeJournals closes the journal files that are open.
func (s *Store) closeJournals() {
	for i, j := range s.jrs {
		if j != nil {
			j.f.Close()
		}
		s.jrs[i] = nil
	}
	s.jr, s.jnext = nil, nil
}

// Close waits for in-flight calls, stops the committer, closes every watch
// channel and closes the file. Calls after Close return store.ErrClosed.
func (s *Store) Close() error {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed {
		return store.ErrClosed
	}
	s.closed = true
	// No call holds the shared lock, so nothing is queued or in flight.
	close(s.wake)
	<-s.committerDone
	s.windowTimer.close()
	s.hub.CloseAll()
	var foldErr error
	if s.jr != nil {
		if s.failed == nil {
			if foldErr = s.fold(); foldErr != nil {
				// The journal keeps what was not folded: the next Open
				// replays it.
				s.log.Error("store fold at close failed", "path", s.path, "err", foldErr)
				foldErr = fmt.Errorf("bolt: close %s: the journal was not folded (the next open replays it): %w", s.path, foldErr)
			}
		} else {
			s.reapFold(true)
		}
		s.closeJournals()
	}
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("bolt: close %s: %w", s.path, err)
	}
	if foldErr != nil {
		return foldErr
	}
	s.log.Info("store closed", "path", s.path)
	return nil
}
