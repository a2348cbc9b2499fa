package osimage

import (
	"bytes"
	"fmt"
	"os"
)

// sparseBlock is the unit the stored copy of an image skips when it is
// all zero: a filesystem block.
const sparseBlock = 4 << 10

// sparseChunk is how much sparseFile gathers before it writes.
const sparseChunk = 1 << 20

var zeroBlock [sparseBlock]byte

// sparseFile writes an image's bytes into a file, leaving every
// sparseBlock-aligned block that is all zero a hole: a mostly empty image
// (a 2 GiB disk with 250 MiB of data) takes the space of its data on the
// appliance, not its size. finish sets the file's size, so a trailing
// run of zeros is a hole too. The bytes read back are the same either way.
type sparseFile struct {
	f   *os.File
	off int64 // of buf[0] in the file
	buf []byte
}

func newSparseFile(f *os.File) *sparseFile {
	return &sparseFile{f: f, buf: make([]byte, 0, sparseChunk)}
}

func (s *sparseFile) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := min(len(p), sparseChunk-len(s.buf))
		s.buf = append(s.buf, p[:k]...)
		p = p[k:]
		if len(s.buf) == sparseChunk {
			if err := s.flush(); err != nil {
				return n - len(p), err
			}
		}
	}
	return n, nil
}

// flush writes buf's runs of blocks that are not all zero at their
// offsets, one write a run.
func (s *sparseFile) flush() error {
	start := -1 // of the current run of data blocks
	for i := 0; i < len(s.buf); i += sparseBlock {
		b := s.buf[i:min(i+sparseBlock, len(s.buf))]
		zero := bytes.Equal(b, zeroBlock[:len(b)])
		switch {
		case !zero && start < 0:
			start = i
		case zero && start >= 0:
			if _, err := s.f.WriteAt(s.buf[start:i], s.off+int64(start)); err != nil {
				return fmt.Errorf("osimage: %w", err)
			}
			start = -1
		}
	}
	if start >= 0 {
		if _, err := s.f.WriteAt(s.buf[start:], s.off+int64(start)); err != nil {
			return fmt.Errorf("osimage: %w", err)
		}
	}
	s.off += int64(len(s.buf))
	s.buf = s.buf[:0]
	return nil
}

// finish writes what is gathered and gives the file its full size.
func (s *sparseFile) finish() error {
	if err := s.flush(); err != nil {
		return err
	}
	if err := s.f.Truncate(s.off); err != nil {
		return fmt.Errorf("osimage: %w", err)
	}
	return nil
}
