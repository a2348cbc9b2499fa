package bolt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"

	bbolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"github.com/corralhq/corral/store"
)

// The journal makes a commit durable with one small append and one
// fdatasync instead of a bbolt transaction's two (pages, then meta page):
// each batch the committer takes is written as one record to
// <store file>.journal and fdatasync'd before any op of the batch is
// answered or any event published, and kept in memory (the overlay) in
// front of bbolt. Every foldEntries records, when the journal passes
// foldBytes, before a batch that would not fit, and at Close, the overlay
// is folded into bbolt in one ordinary (fully synced) transaction, and the
// journal starts over. Open replays what a crash left in the journal into
// bbolt before anything reads.
//
// Crash safety rests on three facts. bbolt's file is only ever changed by
// full bbolt commits (the fold), so it is always a valid store at some
// revision R. Journal records carry consecutive revisions, so the records
// above R that Open finds are exactly the batches journaled after the last
// fold, in order; replay takes records while each starts at the revision
// after the previous one and its checksum holds, and stops at the first
// that does not (a torn last append, or older records of a previous round
// behind a shorter new one: their revisions are not above R or not
// consecutive). A gap between R and the first journaled revision above it
// is damage and refuses Open with store.ErrCorrupt. A record is answered
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
// u8 (1 put, 2 delete), key length u32, key, value length u32, value.
// All big-endian.

const (
	journalMagic  = 0x434a524e // "CJRN"
	journalHeader = 12
	// fileMagic and fileHeader: the journal file's own header.
	fileMagic  = 0x434a5246 // "CJRF"
	storeIDLen = 16
	fileHeader = 4 + storeIDLen
	// foldEntries bounds the overlay: at this many keys it is folded.
	foldEntries = 1024
	// foldBytes bounds the journal file: past it the overlay is folded and
	// the journal starts over. A batch bigger than this is committed to
	// bbolt directly.
	foldBytes = 8 << 20

	jPut    = 1
	jDelete = 2
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

func journalPath(path string) string { return path + ".journal" }

// openJournal opens (or creates, syncing its directory) the journal file
// of the store whose id is id. A journal of another store that holds
// records is refused with store.ErrCorrupt; one without records is
// (re)written with id.
func openJournal(path string, id []byte) (*journal, error) {
	jp := journalPath(path)
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
	if err := f.Truncate(0); err == nil {
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

// jChange is one entry of a record.
type jChange struct {
	key     string
	value   []byte
	deleted bool
}

// encode lays out one record of changes with revisions first, first+1, ...
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
	if _, err := j.f.WriteAt(rec, j.off); err != nil {
		return fmt.Errorf("journal write: %w", err)
	}
	if err := unix.Fdatasync(int(j.f.Fd())); err != nil {
		return fmt.Errorf("journal fdatasync: %w", err)
	}
	j.off += int64(len(rec))
	return nil
}

// restart makes the journal empty after a fold made its records durable
// in bbolt. Whether the truncation reaches the disk does not matter:
// records left behind are at or below bbolt's revision.
func (j *journal) restart() error {
	j.off = fileHeader
	if err := j.f.Truncate(fileHeader); err != nil {
		return fmt.Errorf("journal truncate: %w", err)
	}
	return nil
}

// replayRecord is one decoded record.
type replayRecord struct {
	first   int64
	changes []jChange
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
		next = rec.first + int64(len(rec.changes))
		data = data[journalHeader+n:]
	}
	return out, nil
}

func decodeJournalPayload(p []byte) (replayRecord, bool) {
	rec := replayRecord{first: int64(binary.BigEndian.Uint64(p))}
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
		if kind != jPut && kind != jDelete || kl <= 0 || kl > len(p)-4 {
			return rec, false
		}
		key := string(p[:kl])
		p = p[kl:]
		vl := int(binary.BigEndian.Uint32(p))
		p = p[4:]
		if vl > len(p) || kind == jDelete && vl != 0 {
			return rec, false
		}
		rec.changes = append(rec.changes, jChange{key: key, value: append([]byte(nil), p[:vl]...), deleted: kind == jDelete})
		p = p[vl:]
	}
	return rec, len(p) == 0
}

// replay applies the journal's records above bbolt's revision to bbolt in
// one transaction and empties the journal. It returns the store revision.
func (s *Store) replay(boltRev int64) (int64, error) {
	recs, err := readJournal(s.jr.f)
	if err != nil {
		return 0, err
	}
	var apply []replayRecord
	for _, r := range recs {
		last := r.first + int64(len(r.changes)) - 1
		if last <= boltRev {
			continue // folded before the crash
		}
		if len(apply) == 0 && r.first > boltRev+1 {
			return 0, corruptf("journal %s starts at revision %d but the store file ends at %d: records in between are lost",
				journalPath(s.path), r.first, boltRev)
		}
		apply = append(apply, r)
	}
	rev := boltRev
	if len(apply) > 0 {
		err := s.db.Update(func(tx *bbolt.Tx) error {
			recsB, meta := tx.Bucket(recordsBucket), tx.Bucket(metaBucket)
			if recsB == nil || meta == nil {
				return corruptf("store buckets missing")
			}
			for _, r := range apply {
				for i, c := range r.changes {
					at := r.first + int64(i)
					if at <= boltRev {
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
	if err := s.jr.restart(); err != nil {
		return 0, err
	}
	return rev, nil
}

// fold writes the overlay into bbolt in one transaction and empties the
// journal. On error the overlay and the journal stay as they were (the
// next fold, or Open's replay, tries again). Committer only.
func (s *Store) fold() error {
	if len(s.ov) == 0 {
		if s.jr.off > fileHeader {
			return s.jr.restart()
		}
		return nil
	}
	err := s.db.Update(func(tx *bbolt.Tx) error {
		recs, meta := tx.Bucket(recordsBucket), tx.Bucket(metaBucket)
		if recs == nil || meta == nil {
			return corruptf("store buckets missing")
		}
		for k, e := range s.ov {
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
		return meta.Put(revKey, encodeRev(s.ovRev))
	})
	if err != nil {
		return fmt.Errorf("fold: %w", err)
	}
	s.ovMu.Lock()
	s.ov = make(map[string]ovEntry)
	s.ovMu.Unlock()
	s.folds.Add(1)
	return s.jr.restart()
}

// commitJournal commits batch through the journal. It returns false,
// having answered nothing, when the batch is too big for the journal:
// the caller then commits it to bbolt directly (the overlay folded
// first, so bbolt is the whole truth).
func (s *Store) commitJournal(batch []*op) bool {
	results := make([]result, len(batch))
	var changes []jChange
	var events []store.Event
	local := map[string]ovEntry{}
	rev := s.ovRev
	err := s.db.View(func(tx *bbolt.Tx) error {
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
				var curKV store.KV
				if exists {
					curKV = store.KV{Key: o.key, Value: append([]byte(nil), curVal...), Revision: cur}
				}
				val, del, ferr := callUpdate(o.fn, curKV, exists)
				if ferr != nil {
					results[i].err = ferr
					continue
				}
				if del {
					if !exists {
						results[i].err = store.ErrNotFound
						continue
					}
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
			}
			results[i].rev = rev
		}
		return nil
	})
	if err == nil && len(changes) > 0 {
		rec := s.jr.encode(s.ovRev+1, changes)
		if int64(len(rec)) > s.foldBytes {
			return false
		}
		if s.jr.off+int64(len(rec)) > s.foldBytes || len(s.ov)+len(local) > foldEntries {
			if ferr := s.fold(); ferr != nil {
				err = ferr
			}
		}
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
