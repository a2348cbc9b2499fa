package bolt

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"

	bbolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"github.com/corralhq/corral/store"
)

// The journal makes a commit durable with one small append and one
// fdatasync instead of a bbolt transaction's two (pages, then meta page):
// each batch the committer takes is written as one record to
// <store file>.journal and fdatasync'd before any op of the batch is
// answered or any event published, and kept in memory (the overlay) in
// front of bbolt. Every foldEntries keys, or when the journal passes
// foldBytes, the overlay is folded into bbolt in one ordinary (fully
// synced) transaction **in the background**: the committer freezes the
// overlay, switches its appends to the store's other journal file
// (<store file>.journal and <store file>.journal.1 take turns) and goes on
// committing while a goroutine writes the frozen overlay into bbolt and
// then empties the file that held it. Readers look in the overlay, then in
// the frozen one, then in bbolt. Only one fold runs at a time; if the
// overlay reaches maxOverlayEntries (or the journal maxJournalBytes) while
// one runs, the committer waits for it. Before a batch too big for the
// journal, and at Close, everything is folded in the foreground. Open
// replays what a crash left in both files into bbolt before anything
// reads.
//
// Crash safety rests on three facts. bbolt's file is only ever changed by
// full bbolt commits (the fold), so it is always a valid store at some
// revision R. Journal records carry consecutive revisions (the writes of
// one transaction share one, inside one record), so the records
// above R that Open finds are exactly the batches journaled after the last
// fold, in order; replay reads each file while each record starts at the
// revision after the previous one and its checksum holds, and stops at the
// first that does not (a torn last append, or older records of a previous
// round behind a shorter new one: their revisions are not above R or not
// consecutive). A file is emptied only after the fold of its records has
// committed, and the other file only receives records above the frozen
// overlay's, so the records of both above R, ordered by revision, follow
// each other with no gap. A gap between R and the first journaled revision
// above it, or between two records, is damage and refuses Open with
// store.ErrCorrupt. A record is answered
// only after its fdatasync returned nil; if an append or fdatasync fails,
// the store refuses every later write (the page cache may hold the record
// half-written or not written, and a later fsync cannot say which).
//
// The file starts with a header naming the store it belongs to: magic
// u32 and the store file's id (16 random bytes kept in its meta bucket).
// A journal holding records of another store file (corral.db deleted or
// replaced while the journal stayed) refuses Open rather than be applied
// to the wrong records or silently dropped; a journal without records is
// simply taken over.
//
// Record layout: magic u32, payload length u32, CRC-32C of the payload
// u32; payload: first revision u64, entry count u32, then per entry: kind
// u8 (1 put, 2 delete: at the revision after the entry before it; 3 put,
// 4 delete: at the same revision as the entry before it, the rest of a
// transaction's writes), key length u32, key, value length u32, value.
// All big-endian. A transaction is never split between records, and a
// record is replayed whole or not at all (its checksum), so a crash
// between its append and the fold leaves all of it or none of it. A
// Corral from before transactions reads a record with kinds 3 and 4 as a
// torn one: a journal a crash left is to be replayed by this version
// (Close folds it, leaving nothing to replay).

const (
	journalMagic  = 0x434a524e // "CJRN"
	journalHeader = 12
	// fileMagic and fileHeader: the journal file's own header.
	fileMagic  = 0x434a5246 // "CJRF"
	storeIDLen = 16
	fileHeader = 4 + storeIDLen
	// foldEntries bounds the overlay: at this many keys it is folded.
	foldEntries = 1024
	// maxOverlayEntries and maxJournalBytes bound the overlay and the
	// journal while a background fold runs: past them the committer waits
	// for the fold before it goes on.
	maxOverlayEntries = 16 * foldEntries
	maxJournalBytes   = 4 * foldBytes
	// foldBytes bounds the journal file: past it the overlay is folded and
	// the journal starts over. A batch bigger than this is committed to
	// bbolt directly.
	foldBytes = 8 << 20

	jPut    = 1
	jDelete = 2
	// jSameRev is added to the kind of an entry at the revision of the
	// entry before it: 3 and 4 are a transaction's put and delete after
	// its first write.
	jSameRev = 2
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ovEntry is a journaled change not yet folded into bbolt.
type ovEntry struct {
	rev     int64
	value   []byte
	deleted bool
}

// journal is the append-only file; only the committer (and Open, Close)
// touch it.
type journal struct {
	f   *os.File
	off int64
	buf []byte
}

// journalPath is the store's first journal file; journalPaths both (a
// store written by an older Corral has only the first).
func journalPath(path string) string { return path + ".journal" }

func journalPaths(path string) [2]string { return [2]string{path + ".journal", path + ".journal.1"} }

// openJournal opens (or creates, syncing its directory) the journal file
// jp of the store whose id is id. A journal of another store that holds
// records is refused with store.ErrCorrupt; one without records is
// (re)written with id.
func openJournal(jp, path string, id []byte) (*journal, error) {
	_, statErr := os.Stat(jp)
	f, err := os.OpenFile(jp, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	j := &journal{f: f, off: fileHeader}
	if errors.Is(statErr, os.ErrNotExist) {
		if err := syncDir(filepath.Dir(jp)); err != nil {
			f.Close()
			return nil, fmt.Errorf("journal: sync directory: %w", err)
		}
	}
	info, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("journal: %w", err)
	}
	hdr := make([]byte, fileHeader)
	if info.Size() >= fileHeader {
		if _, err := f.ReadAt(hdr, 0); err != nil {
			f.Close()
			return nil, fmt.Errorf("journal: %w", err)
		}
		switch {
		case binary.BigEndian.Uint32(hdr) != fileMagic:
			f.Close()
			return nil, corruptf("%s is not a Corral store journal: move it aside", jp)
		case string(hdr[4:]) == string(id):
			return j, nil
		case info.Size() > fileHeader:
			f.Close()
			return nil, corruptf("journal %s holds records of another store file (id %x), not of %s (id %x): "+
				"put back the store file it belongs to, or move the journal aside to discard them", jp, hdr[4:], path, id)
		}
	}
	// New, torn at creation (records follow only a synced header), or
	// empty and another store's: write this store's header.
	binary.BigEndian.PutUint32(hdr, fileMagic)
	copy(hdr[4:], id)
	err = f.Truncate(0)
	if err == nil {
		_, err = f.WriteAt(hdr, 0)
	}
	if err == nil {
		err = unix.Fdatasync(int(f.Fd()))
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("journal: write header: %w", err)
	}
	return j, nil
}

// syncDir makes a directory's entries durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// journalScratch is the working space of commitJournal, reused from one
// batch to the next (committer only). reset drops every reference it took
// and keeps the capacity.
type journalScratch struct {
	res     []result
	changes []jChange
	local   map[string]ovEntry // the batch's own changes, by key
}

// results returns n zeroed results.
func (sc *journalScratch) results(n int) []result {
	if cap(sc.res) < n {
		sc.res = make([]result, n)
	}
	sc.res = sc.res[:n]
	if sc.local == nil {
		sc.local = map[string]ovEntry{}
	}
	return sc.res
}

func (sc *journalScratch) reset() {
	clear(sc.res)
	clear(sc.changes)
	sc.changes = sc.changes[:0]
	clear(sc.local)
}

// jChange is one entry of a record. sameRev: it is at the revision of the
// entry before it (a transaction's writes after its first).
type jChange struct {
	key     string
	value   []byte
	deleted bool
	sameRev bool
}

// encode lays out one record of changes with revisions first, first+1,
// ... (an entry marked sameRev at the revision of the one before it).
func (j *journal) encode(first int64, changes []jChange) []byte {
	b := j.buf[:0]
	b = append(b, make([]byte, journalHeader)...)
	b = binary.BigEndian.AppendUint64(b, uint64(first))
	b = binary.BigEndian.AppendUint32(b, uint32(len(changes)))
	for _, c := range changes {
		kind := byte(jPut)
		if c.deleted {
			kind = jDelete
		}
		if c.sameRev {
			kind += jSameRev
		}
		b = append(b, kind)
		b = binary.BigEndian.AppendUint32(b, uint32(len(c.key)))
		b = append(b, c.key...)
		b = binary.BigEndian.AppendUint32(b, uint32(len(c.value)))
		b = append(b, c.value...)
	}
	payload := b[journalHeader:]
	binary.BigEndian.PutUint32(b[0:], journalMagic)
	binary.BigEndian.PutUint32(b[4:], uint32(len(payload)))
	binary.BigEndian.PutUint32(b[8:], crc32.Checksum(payload, castagnoli))
	if cap(b) <= 1<<20 {
		j.buf = b // keep a moderate buffer for the next record
	}
	return b
}

// append writes rec at the end of the journal and fdatasyncs it.
func (j *journal) append(rec []byte) error {
	if err := pwrite(j.f, rec, j.off); err != nil {
		return fmt.Errorf("journal write: %w", err)
	}
	if err := fdatasync(j.f); err != nil {
		return fmt.Errorf("journal fdatasync: %w", err)
	}
	j.off += int64(len(rec))
	return nil
}

// rewind makes the journal empty after a background fold made its
// records durable in bbolt, without truncating it: the next round's
// records overwrite the old ones in place, so once a file has reached its
// usual size an append does not change it, and its fdatasync flushes data
// only. A size change needs a file-system journal commit, which on ext4
// (data=ordered) first writes out every other file's dirty data in that
// transaction: the fold's bbolt pages (the ACK waited up to 11 ms behind
// them, 0.1 % of commits). Records left behind are an older round's: at
// or below bbolt's revision, and not consecutive with the new round's, so
// Open's replay stops at them.
func (j *journal) rewind() { j.off = fileHeader }

// restart makes the journal empty and truncates it (at Open and Close,
// and before a batch too big for it). Whether the truncation reaches the
// disk does not matter: records left behind are at or below bbolt's
// revision.
func (j *journal) restart() error {
	j.off = fileHeader
	if err := j.f.Truncate(fileHeader); err != nil {
		return fmt.Errorf("journal truncate: %w", err)
	}
	return nil
}

// replayRecord is one decoded record: its changes are at revisions first
// to last.
type replayRecord struct {
	first, last int64
	changes     []jChange
}

// readJournal decodes the journal's records from the start while each is
// whole and checksummed and its revisions follow the previous record's.
func readJournal(f *os.File) ([]replayRecord, error) {
	data, err := io.ReadAll(io.NewSectionReader(f, fileHeader, 1<<62))
	if err != nil {
		return nil, fmt.Errorf("journal read: %w", err)
	}
	var out []replayRecord
	var next int64
	for len(data) >= journalHeader {
		if binary.BigEndian.Uint32(data) != journalMagic {
			break
		}
		n := int(binary.BigEndian.Uint32(data[4:]))
		if n < 12 || n > len(data)-journalHeader {
			break
		}
		payload := data[journalHeader : journalHeader+n]
		if crc32.Checksum(payload, castagnoli) != binary.BigEndian.Uint32(data[8:]) {
			break
		}
		rec, ok := decodeJournalPayload(payload)
		if !ok || (len(out) > 0 && rec.first != next) {
			break
		}
		out = append(out, rec)
		next = rec.last + 1
		data = data[journalHeader+n:]
	}
	return out, nil
}

func decodeJournalPayload(p []byte) (replayRecord, bool) {
	rec := replayRecord{first: int64(binary.BigEndian.Uint64(p))}
	rec.last = rec.first - 1
	count := int(binary.BigEndian.Uint32(p[8:]))
	p = p[12:]
	if rec.first <= 0 || count <= 0 || count > len(p) {
		return rec, false
	}
	for range count {
		if len(p) < 5 {
			return rec, false
		}
		kind := p[0]
		kl := int(binary.BigEndian.Uint32(p[1:]))
		p = p[5:]
		same := kind == jPut+jSameRev || kind == jDelete+jSameRev
		if same {
			kind -= jSameRev
		}
		if kind != jPut && kind != jDelete || kl <= 0 || kl > len(p)-4 || same && len(rec.changes) == 0 {
			return rec, false
		}
		if !same {
			rec.last++
		}
		key := string(p[:kl])
		p = p[kl:]
		vl := int(binary.BigEndian.Uint32(p))
		p = p[4:]
		if vl > len(p) || kind == jDelete && vl != 0 {
			return rec, false
		}
		rec.changes = append(rec.changes, jChange{key: key, value: append([]byte(nil), p[:vl]...), deleted: kind == jDelete, sameRev: same})
		p = p[vl:]
	}
	return rec, len(p) == 0
}

// replay applies the records of both journal files above bbolt's
// revision to bbolt in one transaction and empties both files. It returns
// the store revision.
func (s *Store) replay(boltRev int64) (int64, error) {
	var recs []replayRecord
	for _, j := range s.jrs {
		r, err := readJournal(j.f)
		if err != nil {
			return 0, err
		}
		recs = append(recs, r...)
	}
	slices.SortStableFunc(recs, func(a, b replayRecord) int { return cmp.Compare(a.first, b.first) })
	var apply []replayRecord
	next := boltRev + 1
	for _, r := range recs {
		last := r.last
		if last < next {
			continue // folded before the crash, or a stale copy
		}
		if r.first > next {
			if len(apply) == 0 {
				return 0, corruptf("journal files %s and %s start at revision %d but the store file ends at %d: records in between are lost",
					journalPaths(s.path)[0], journalPaths(s.path)[1], r.first, boltRev)
			}
			return 0, corruptf("journal files %s and %s hold revisions up to %d, then from %d: records in between are lost",
				journalPaths(s.path)[0], journalPaths(s.path)[1], next-1, r.first)
		}
		apply = append(apply, r)
		next = last + 1
	}
	rev := boltRev
	if len(apply) > 0 {
		err := s.db.Update(func(tx *bbolt.Tx) error {
			recsB, meta := tx.Bucket(recordsBucket), tx.Bucket(metaBucket)
			if recsB == nil || meta == nil {
				return corruptf("store buckets missing")
			}
			for _, r := range apply {
				// Revisions at or below base were applied before this
				// record: a transaction's entries share theirs, so all of
				// a transaction or none of it is skipped.
				base, at := rev, r.first-1
				for _, c := range r.changes {
					if !c.sameRev {
						at++
					}
					if at <= base {
						continue
					}
					var err error
					if c.deleted {
						err = recsB.Delete([]byte(c.key))
					} else {
						err = recsB.Put([]byte(c.key), encodeRecord(at, c.value))
					}
					if err != nil {
						return err
					}
					rev = at
				}
			}
			return meta.Put(revKey, encodeRev(rev))
		})
		if err != nil {
			return 0, fmt.Errorf("journal replay: %w", err)
		}
		s.log.Info("store journal replayed", "path", journalPath(s.path), "records", len(apply), "from_revision", boltRev, "to_revision", rev)
	}
	for _, j := range s.jrs {
		if err := j.restart(); err != nil {
			return 0, err
		}
	}
	return rev, nil
}

// foldYieldKeys: a fold yields the processor after every this many keys.
const foldYieldKeys = 32

// writeFold writes entries into bbolt in one transaction that leaves
// bbolt at revision rev.
//
// It yields the processor every foldYieldKeys keys. With one P (corrald on
// one core) a background fold otherwise runs 1-4 ms at a stretch (1,024
// keys, every ~0.25 s at 4,000 leases/s) and the packet reader and the
// committer wait behind it: with the commit window on, this was the
// largest part left of the DORA tail (bench/results/2026-11-dhcp.md,
// 24 Nov 2026, the commit window; p99 4.3-10 ms without the yield, 4.3-5.2 ms with it).
func (s *Store) writeFold(entries map[string]ovEntry, rev int64) error {
	err := s.db.Update(func(tx *bbolt.Tx) error {
		recs, meta := tx.Bucket(recordsBucket), tx.Bucket(metaBucket)
		if recs == nil || meta == nil {
			return corruptf("store buckets missing")
		}
		n := 0
		for k, e := range entries {
			if n++; n%foldYieldKeys == 0 {
				runtime.Gosched()
			}
			s.foldKeys.Add(1)
			var err error
			if e.deleted {
				err = recs.Delete([]byte(k))
			} else {
				err = recs.Put([]byte(k), encodeRecord(e.rev, e.value))
			}
			if err != nil {
				return err
			}
		}
		return meta.Put(revKey, encodeRev(rev))
	})
	if err != nil {
		return fmt.Errorf("fold: %w", err)
	}
	s.folds.Add(1)
	return nil
}

// foldFrozen folds the frozen overlay into bbolt, then forgets it and
// empties the journal file j that held it. On error both stay as they were
// (the next fold, or Open's replay, tries again). It runs in the
// background goroutine startFold starts, or in the committer when no
// background fold runs.
func (s *Store) foldFrozen(entries map[string]ovEntry, rev int64, j *journal, hook func(bool)) error {
	if hook != nil {
		hook(false)
	}
	if err := s.writeFold(entries, rev); err != nil {
		return err
	}
	if hook != nil {
		hook(true)
	}
	s.ovMu.Lock()
	s.frozen = nil
	s.ovMu.Unlock()
	j.rewind()
	return nil
}

// startFold freezes the overlay, switches the committer's appends to the
// other journal file and folds the frozen overlay in the background (a
// frozen overlay left by a failed fold is folded again instead). No fold
// may be running. Committer only.
func (s *Store) startFold() {
	if s.frozen == nil {
		if len(s.ov) == 0 {
			return
		}
		s.ovMu.Lock()
		s.frozen, s.frozenRev = s.ov, s.ovRev
		// The next round takes as many keys, as a rule: sized for them,
		// the overlay does not grow (and garbage) its way there again.
		s.ov = make(map[string]ovEntry, len(s.frozen))
		s.ovMu.Unlock()
		s.jr, s.jnext = s.jnext, s.jr
	}
	done := make(chan error, 1)
	s.foldDone = done
	entries, rev, j, hook := s.frozen, s.frozenRev, s.jnext, s.foldHook
	go func() { done <- s.foldFrozen(entries, rev, j, hook) }()
}

// reapFold collects the background fold's outcome: at once if it is done,
// or, with wait, when it is. It reports whether no fold runs any more.
// Committer only.
func (s *Store) reapFold(wait bool) bool {
	if s.foldDone == nil {
		return true
	}
	var err error
	if wait {
		err = <-s.foldDone
	} else {
		select {
		case err = <-s.foldDone:
		default:
			return false
		}
	}
	s.foldDone = nil
	if err != nil {
		// The frozen overlay and its journal file stay: the next fold
		// retries, and a crash meanwhile replays the file.
		s.log.Error("store background fold failed", "path", s.path, "err", err)
	}
	return true
}

// fold folds everything into bbolt in the foreground: it waits for a
// background fold, folds a frozen overlay left by a failed one, then the
// overlay, and empties both journal files. On error the overlays and the
// journal files stay as they were. Committer only (and Close, after it).
func (s *Store) fold() error {
	s.reapFold(true)
	if s.frozen != nil {
		if err := s.foldFrozen(s.frozen, s.frozenRev, s.jnext, nil); err != nil {
			return err
		}
	}
	if len(s.ov) > 0 {
		if err := s.writeFold(s.ov, s.ovRev); err != nil {
			return err
		}
		s.ovMu.Lock()
		s.ov = make(map[string]ovEntry)
		s.ovMu.Unlock()
	}
	for _, j := range s.jrs {
		if err := j.restart(); err != nil {
			return err
		}
	}
	return nil
}

// maybeFold starts a background fold when the overlay or the active
// journal passed its bound (adding entries keys and bytes more). If a
// fold is still running it waits for it only when the hard bounds are
// passed too. Past the hard bounds with the frozen overlay still not in
// bbolt (its fold failed), it folds that in the foreground and returns
// the error if it fails again: the batch is refused rather than the
// overlay and the journal growing without bound while bbolt takes no
// fold (a full disk). Committer only.
func (s *Store) maybeFold(entries int, bytes int64) error {
	if s.jr.off+bytes <= s.foldBytes && len(s.ov)+entries <= foldEntries {
		return nil
	}
	hard := s.jr.off+bytes > max(maxJournalBytes, 4*s.foldBytes) || len(s.ov)+entries > maxOverlayEntries
	if !s.reapFold(false) {
		if !hard {
			return nil // the running fold finishes first
		}
		s.reapFold(true)
	}
	if hard && s.frozen != nil {
		if err := s.foldFrozen(s.frozen, s.frozenRev, s.jnext, nil); err != nil {
			return err
		}
	}
	s.startFold()
	return nil
}

// commitJournal commits batch through the journal. It returns false,
// having answered nothing, when the batch is too big for the journal:
// the caller then commits it to bbolt directly (the overlay folded
// first, so bbolt is the whole truth).
func (s *Store) commitJournal(batch []*op) bool {
	sc := &s.jscratch
	defer sc.reset()
	results := sc.results(len(batch))
	changes := sc.changes[:0]
	var events []store.Event // published: each batch's own
	local := sc.local
	rev := s.ovRev
	// The frozen overlay and bbolt are taken together under ovMu, as
	// readers do: a background fold commits bbolt before it forgets the
	// frozen overlay.
	s.ovMu.RLock()
	frozen := s.frozen
	rtx, err := s.db.Begin(false)
	s.ovMu.RUnlock()
	if err == nil {
		err = func(tx *bbolt.Tx) error {
			recs := tx.Bucket(recordsBucket)
			if recs == nil {
				return corruptf("records bucket missing")
			}
			// current is the record at key as of the ops before this one.
			current := func(key string) (int64, []byte, bool, error) {
				if e, ok := local[key]; ok {
					return e.rev, e.value, !e.deleted, nil
				}
				if e, ok := s.ov[key]; ok {
					return e.rev, e.value, !e.deleted, nil
				}
				if e, ok := frozen[key]; ok {
					return e.rev, e.value, !e.deleted, nil
				}
				raw := recs.Get([]byte(key))
				if raw == nil {
					return 0, nil, false, nil
				}
				r, v, err := decodeRecord(raw)
				return r, v, true, err
			}
			for i, o := range batch {
				if err := o.ctx.Err(); err != nil {
					results[i].err = err
					continue
				}
				if o.kind == opTxn {
					err := txnConflict(o.txn, func(key string) (int64, bool, error) {
						r, _, ok, err := current(key)
						return r, ok, err
					})
					if err != nil {
						results[i].err = err
						continue
					}
					if txnWrites(o.txn) {
						// One revision for all: the entries after the
						// first are marked to share it.
						rev++
						first := true
						for _, t := range o.txn {
							var e ovEntry
							ev := store.Event{Type: store.EventDelete, KV: store.KV{Key: t.Key, Revision: rev}}
							switch t.Kind {
							case store.OpCheck:
								continue
							case store.OpPut:
								val := append([]byte(nil), t.Value...)
								e = ovEntry{rev: rev, value: val}
								ev = store.Event{Type: store.EventPut, KV: store.KV{Key: t.Key, Value: val, Revision: rev}}
							case store.OpDelete:
								e = ovEntry{rev: rev, deleted: true}
							}
							local[t.Key] = e
							changes = append(changes, jChange{key: t.Key, value: e.value, deleted: e.deleted, sameRev: !first})
							events = append(events, ev)
							first = false
						}
					}
					results[i].rev = rev
					continue
				}
				cur, curVal, exists, err := current(o.key)
				if err != nil {
					results[i].err = err
					continue
				}
				switch o.kind {
				case opPut:
					if err := putConflict(o.rev, cur, exists); err != nil {
						results[i].err = err
						continue
					}
					rev++
					val := append([]byte(nil), o.value...) // the overlay keeps it: the caller may reuse its slice
					local[o.key] = ovEntry{rev: rev, value: val}
					changes = append(changes, jChange{key: o.key, value: val})
					events = append(events, store.Event{Type: store.EventPut, KV: store.KV{Key: o.key, Value: val, Revision: rev}})
				case opUpdate:
					val, del, ferr := runUpdate(o, cur, curVal, exists)
					if ferr != nil {
						results[i].err = ferr
						continue
					}
					if del {
						rev++
						local[o.key] = ovEntry{rev: rev, deleted: true}
						changes = append(changes, jChange{key: o.key, deleted: true})
						events = append(events, store.Event{Type: store.EventDelete, KV: store.KV{Key: o.key, Revision: rev}})
						break
					}
					val = append([]byte(nil), val...)
					rev++
					results[i].value = append([]byte(nil), val...) // the caller's own copy: val stays in the overlay
					local[o.key] = ovEntry{rev: rev, value: val}
					changes = append(changes, jChange{key: o.key, value: val})
					events = append(events, store.Event{Type: store.EventPut, KV: store.KV{Key: o.key, Value: val, Revision: rev}})
				case opDelete:
					switch {
					case !exists:
						results[i].err = store.ErrNotFound
						continue
					case cur != o.rev:
						results[i].err = fmt.Errorf("expected revision %d, current is %d: %w", o.rev, cur, store.ErrConflict)
						continue
					}
					rev++
					local[o.key] = ovEntry{rev: rev, deleted: true}
					changes = append(changes, jChange{key: o.key, deleted: true})
					events = append(events, store.Event{Type: store.EventDelete, KV: store.KV{Key: o.key, Revision: rev}})
				case opTxn:
					// Applied above, as a whole.
				}
				results[i].rev = rev
			}
			return nil
		}(rtx)
		_ = rtx.Rollback()
	}
	sc.changes = changes // reset clears and keeps it
	if err == nil && len(changes) > 0 {
		rec := s.jr.encode(s.ovRev+1, changes)
		if int64(len(rec)) > s.foldBytes {
			return false
		}
		err = s.maybeFold(len(local), int64(len(rec)))
		if err == nil {
			if aerr := s.jr.append(rec); aerr != nil {
				s.failed = aerr
				err = aerr
			}
		}
	}
	if err != nil {
		s.log.Error("store commit failed", "path", s.path, "ops", len(batch), "err", err)
		for i := range results {
			results[i] = result{err: fmt.Errorf("commit: %w", err)}
		}
	} else if len(changes) > 0 {
		s.ovMu.Lock()
		for k, e := range local {
			s.ov[k] = e
		}
		s.ovRev = rev
		s.ovMu.Unlock()
		s.commits.Add(1)
		s.writes.Add(int64(len(events)))
		s.hub.Publish(events)
	}
	for i, o := range batch {
		o.done <- results[i]
	}
	return true
}
