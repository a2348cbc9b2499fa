package bolt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"time"

	bbolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/corralhq/corral/store"
)

// bbolt on-disk constants (file format version 2). The meta page is a
// 16-byte page header followed by: magic u32, version u32, pageSize u32,
// flags u32, root bucket {root pgid u64, sequence u64}, freelist pgid u64,
// high-water-mark pgid u64, txid u64, checksum u64 (FNV-64a of the preceding
// meta fields). Integers are in the machine's byte order.
const (
	boltMagic       = 0xED0CDAED
	boltVersion     = 2
	pageHeaderSize  = 16
	metaSize        = 64
	metaSumOffset   = 56
	noFreelist      = ^uint64(0)
	minPageSize     = 512
	maxPageSize     = 1 << 24
	maxCheckReports = 5
)

type metaPage struct {
	pageSize uint32
	root     uint64
	freelist uint64
	pgid     uint64
	txid     uint64
	sumOK    bool
}

// readMeta decodes the meta page at off. It fails only when the bytes there
// are not a bbolt meta page at all (short read, bad magic or version); a
// checksum mismatch is reported through sumOK, because a write torn by a
// crash can legitimately leave one of the two meta pages stale, and bbolt
// then falls back to the other.
func readMeta(f *os.File, off int64, which int) (metaPage, error) {
	buf := make([]byte, pageHeaderSize+metaSize)
	if _, err := f.ReadAt(buf, off); err != nil {
		if errors.Is(err, io.EOF) {
			return metaPage{}, corruptf("meta page %d at offset %d is cut short", which, off)
		}
		return metaPage{}, fmt.Errorf("read meta page %d: %w", which, err)
	}
	m := buf[pageHeaderSize:]
	ne := binary.NativeEndian
	if magic := ne.Uint32(m[0:]); magic != boltMagic {
		return metaPage{}, corruptf("meta page %d has bad magic %#x: not a bbolt file, or overwritten", which, magic)
	}
	if v := ne.Uint32(m[4:]); v != boltVersion {
		return metaPage{}, corruptf("meta page %d has unsupported bbolt format version %d", which, v)
	}
	h := fnv.New64a()
	h.Write(m[:metaSumOffset])
	return metaPage{
		pageSize: ne.Uint32(m[8:]),
		root:     ne.Uint64(m[16:]),
		freelist: ne.Uint64(m[32:]),
		pgid:     ne.Uint64(m[40:]),
		txid:     ne.Uint64(m[48:]),
		sumOK:    h.Sum64() == ne.Uint64(m[metaSumOffset:]),
	}, nil
}

// checkMetaPages reads both bbolt meta pages straight from the file, before
// bbolt maps it, and checks that they are meta pages and that the file is
// at least as long as the newest valid one says. bbolt itself would map a
// truncated file and fault on the missing pages, and it would silently use
// the second meta page if the first was overwritten.
func checkMetaPages(path string, size int64, log *slog.Logger) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()

	m0, err := readMeta(f, 0, 0)
	if err != nil {
		return err
	}
	ps := m0.pageSize
	if ps < minPageSize || ps > maxPageSize || ps&(ps-1) != 0 {
		return corruptf("meta page 0 has invalid page size %d", ps)
	}
	m1, err := readMeta(f, int64(ps), 1)
	if err != nil {
		return err
	}
	if m1.pageSize != ps {
		return corruptf("meta pages disagree on page size (%d and %d)", ps, m1.pageSize)
	}

	var valid []metaPage
	for i, m := range []metaPage{m0, m1} {
		if !m.sumOK {
			log.Warn("store file meta page has a bad checksum; using the other one", "path", path, "page", i)
			continue
		}
		valid = append(valid, m)
	}
	if len(valid) == 0 {
		return corruptf("both meta pages have bad checksums")
	}
	m := slices.MaxFunc(valid, func(a, b metaPage) int {
		switch {
		case a.txid < b.txid:
			return -1
		case a.txid > b.txid:
			return 1
		}
		return 0
	})
	if m.pgid < 2 || m.root >= m.pgid || (m.freelist != noFreelist && m.freelist >= m.pgid) {
		return corruptf("meta page (txid %d) has out-of-range page ids (root %d, freelist %d, high water mark %d)",
			m.txid, m.root, m.freelist, m.pgid)
	}
	if need := m.pgid * uint64(ps); uint64(size) < need {
		return corruptf("file is truncated: %d bytes, but its metadata needs at least %d", size, need)
	}
	return nil
}

// validate opens the file read-only and checks it from top to bottom
// without writing to it. It reports fresh when the file is a valid bbolt
// file with no buckets at all. Any inconsistency, and any panic or memory
// fault inside bbolt while reading, is returned as an error wrapping
// store.ErrCorrupt.
func validate(path string, timeout time.Duration) (fresh bool, err error) {
	// bbolt reads the file through mmap; damage can make it touch pages
	// past the end of the file (SIGBUS) or trip its internal assertions.
	// Turn both into errors for this goroutine.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))

	db, err := openDB(path, &bbolt.Options{ReadOnly: true, PreLoadFreelist: true, Timeout: timeout})
	if err != nil {
		switch {
		case errors.Is(err, berrors.ErrTimeout):
			return false, lockErr(err, timeout)
		case errors.Is(err, store.ErrCorrupt):
			return false, err
		}
		return false, corruptf("bbolt cannot open it: %v", err)
	}
	defer db.Close()

	err = db.View(func(tx *bbolt.Tx) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = corruptf("bbolt panicked while reading: %v", r)
			}
		}()
		names := bucketNames(tx)
		if len(names) == 0 {
			fresh = true
		} else if err := checkContent(tx, names); err != nil {
			return err
		}
		return checkStructure(tx)
	})
	return fresh, err
}

// checkContent checks that the file holds exactly our two buckets and that
// every record decodes.
func checkContent(tx *bbolt.Tx, names []string) error {
	for _, n := range names {
		if n != string(recordsBucket) && n != string(metaBucket) {
			return corruptf("not a Corral store file: unexpected bucket %q", n)
		}
	}
	meta := tx.Bucket(metaBucket)
	recs := tx.Bucket(recordsBucket)
	if meta == nil || recs == nil {
		return corruptf("not a Corral store file: buckets %q present, want %q and %q", names, metaBucket, recordsBucket)
	}
	if f := meta.Get(formatKey); !bytes.Equal(f, []byte(formatV1)) {
		return corruptf("not a Corral store file: format marker %q, want %q", f, formatV1)
	}
	storeRev, err := decodeRev(meta.Get(revKey))
	if err != nil {
		return err
	}
	var touch byte
	c := recs.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if v == nil {
			return corruptf("record %q is a nested bucket", k)
		}
		rev, val, err := decodeRecord(v)
		if err != nil {
			return fmt.Errorf("record %q: %w", k, err)
		}
		if rev > storeRev {
			return corruptf("record %q has revision %d, above the store revision %d", k, rev, storeRev)
		}
		// Read the first and last byte so a value on pages past the end
		// of the file faults here, where it is recovered, and not later.
		if len(val) > 0 {
			touch ^= val[0] ^ val[len(val)-1]
		}
	}
	runtime.KeepAlive(touch)
	return nil
}

// checkStructure runs bbolt's own page-level consistency check (reachable
// pages, freelist, key order).
func checkStructure(tx *bbolt.Tx) error {
	var problems []error
	n := 0
	for err := range tx.Check() {
		n++
		if len(problems) < maxCheckReports {
			problems = append(problems, err)
		}
	}
	if n == 0 {
		return nil
	}
	return corruptf("bbolt consistency check found %d problem(s): %v", n, errors.Join(problems...))
}
