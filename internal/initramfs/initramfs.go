// Package initramfs writes the small newc cpio archives that Corral's
// test kernels and guest images boot with, on u-root's cpio package. The
// output is reproducible: inode numbers follow the order of entries, and
// times and owners are zero, so equal inputs give equal bytes (callers use
// them as cache keys). It imports only u-root's cpio.
package initramfs

import (
	"io"

	"github.com/u-root/u-root/pkg/cpio"
)

// Writer appends entries to an archive. Errors are sticky: the first one
// is returned by Close.
type Writer struct {
	rw  cpio.RecordWriter
	ino uint64
	err error
}

// NewWriter starts an archive on w.
func NewWriter(w io.Writer) *Writer { return &Writer{rw: cpio.Newc.Writer(w)} }

func (w *Writer) write(r cpio.Record) {
	if w.err != nil {
		return
	}
	w.ino++
	r = cpio.MakeReproducible(r)
	r.Ino, r.NLink = w.ino, 1
	w.err = w.rw.WriteRecord(r)
}

// Dir adds a directory (mode 0755).
func (w *Writer) Dir(name string) { w.write(cpio.Directory(name, 0o755)) }

// File adds a regular file with permission bits perm (type bits in perm
// are ignored).
func (w *Writer) File(name string, perm uint32, data []byte) {
	w.write(cpio.StaticFile(name, string(data), uint64(perm&0o7777)))
}

// CharDev adds a character device node.
func (w *Writer) CharDev(name string, perm uint32, major, minor uint64) {
	w.write(cpio.CharDev(name, uint64(perm&0o7777), major, minor))
}

// Close writes the trailer and returns the first error.
func (w *Writer) Close() error {
	if w.err != nil {
		return w.err
	}
	return cpio.WriteTrailer(w.rw)
}
