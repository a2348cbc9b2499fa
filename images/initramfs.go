package images

import (
	"fmt"
	"io"
)

// TestInitramfs writes the stand-in discovery initramfs used until the
// real one exists (next step): an uncompressed newc cpio archive holding a
// README that says what it is. It is enough to prove the boot chain up to
// the kernel handoff.
func TestInitramfs(w io.Writer) error {
	cw := &cpioWriter{w: w}
	cw.file("README", 0o100644, []byte("Corral test initramfs: the discovery image is built in a later step.\n"))
	cw.trailer()
	return cw.err
}

// cpioWriter writes the newc ("070701") format the kernel unpacks.
type cpioWriter struct {
	w   io.Writer
	n   int64
	ino int
	err error
}

func (c *cpioWriter) write(b []byte) {
	if c.err != nil {
		return
	}
	k, err := c.w.Write(b)
	c.n += int64(k)
	c.err = err
}

func (c *cpioWriter) pad() {
	if r := c.n % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

func (c *cpioWriter) entry(name string, mode uint32, data []byte) { c.node(name, mode, data, 0, 0) }

func (c *cpioWriter) node(name string, mode uint32, data []byte, rmajor, rminor int) {
	c.ino++
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, 1, 0, len(data), 0, 0, rmajor, rminor, len(name)+1, 0)
	c.write([]byte(hdr))
	c.write(append([]byte(name), 0))
	c.pad()
	c.write(data)
	c.pad()
}

func (c *cpioWriter) file(name string, mode uint32, data []byte) { c.entry(name, mode, data) }

// Dir adds a directory entry.
func (c *cpioWriter) dir(name string) { c.entry(name, 0o040755, nil) }

func (c *cpioWriter) trailer() { c.entry("TRAILER!!!", 0, nil) }

// WriteInitramfs writes a newc cpio archive with /dev/console (the kernel
// needs it to give init a console), the directories in dirs, and the
// given files (path → content; mode 0755 when exec is true for the path).
// Tests use it to wrap a static /init.
func WriteInitramfs(w io.Writer, dirs []string, files map[string][]byte, exec map[string]bool) error {
	cw := &cpioWriter{w: w}
	cw.dir("dev")
	cw.node("dev/console", 0o020600, nil, 5, 1)
	for _, d := range dirs {
		if d != "dev" {
			cw.dir(d)
		}
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sortStrings(names)
	for _, n := range names {
		mode := uint32(0o100644)
		if exec[n] {
			mode = 0o100755
		}
		cw.file(n, mode, files[n])
	}
	cw.trailer()
	return cw.err
}
