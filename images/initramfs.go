package images

import (
	"io"

	"github.com/corralhq/corral/internal/initramfs"
)

// TestInitramfs writes the stand-in discovery initramfs used until the
// real one exists (next step): an uncompressed newc cpio archive holding a
// README that says what it is. It is enough to prove the boot chain up to
// the kernel handoff.
func TestInitramfs(w io.Writer) error {
	cw := initramfs.NewWriter(w)
	cw.File("README", 0o644, []byte("Corral test initramfs: the discovery image is built in a later step.\n"))
	return cw.Close()
}

// WriteInitramfs writes a newc cpio archive with /dev/console (the kernel
// needs it to give init a console), the directories in dirs, and the
// given files (path → content; mode 0755 when exec is true for the path).
// Tests use it to wrap a static /init.
func WriteInitramfs(w io.Writer, dirs []string, files map[string][]byte, exec map[string]bool) error {
	cw := initramfs.NewWriter(w)
	cw.Dir("dev")
	cw.CharDev("dev/console", 0o600, 5, 1)
	for _, d := range dirs {
		if d != "dev" {
			cw.Dir(d)
		}
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sortStrings(names)
	for _, n := range names {
		mode := uint32(0o644)
		if exec[n] {
			mode = 0o755
		}
		cw.File(n, mode, files[n])
	}
	return cw.Close()
}
