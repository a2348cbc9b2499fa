// Compressing the initramfs and the files it carries.

package discovery

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/pierrec/lz4/v4"
)

// gzipFile compresses src to dst with gzip at its default level.
func gzipFile(src, dst string) error {
	return compressFile(src, dst, func(w io.Writer) (io.WriteCloser, error) {
		return gzip.NewWriterLevel(w, gzip.DefaultCompression)
	})
}

// lz4File compresses src to dst in LZ4's legacy frame (8 MiB blocks, no
// end mark), the only LZ4 framing the kernel's initramfs unpacker reads,
// at the highest (HC) level: compression is once per build, unpacking on
// every boot.
func lz4File(src, dst string) error {
	return compressFile(src, dst, func(w io.Writer) (io.WriteCloser, error) {
		zw := lz4.NewWriter(w)
		return zw, zw.Apply(lz4.LegacyOption(true), lz4.CompressionLevelOption(lz4.Level9))
	})
}

// compressFile copies src to dst through the compressor newWriter makes.
func compressFile(src, dst string, newWriter func(io.Writer) (io.WriteCloser, error)) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	zw, err := newWriter(out)
	if err == nil {
		_, err = io.Copy(zw, in)
	}
	if err == nil {
		err = zw.Close()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// trimPCIIDs copies pci.ids from src to dst without what agent/facts never
// reads: comments, and the doubly indented subsystem and programming
// interface lines (43 % of the file; ~0.1 MB of the compressed discovery
// image, whose budget is 10 MB).
func trimPCIIDs(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("pci.ids: %w", err)
	}
	var out bytes.Buffer
	out.Grow(len(b))
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i+1], b[i+1:]
		} else {
			b = nil
		}
		if bytes.HasPrefix(line, []byte("#")) || bytes.HasPrefix(line, []byte("\t\t")) || len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		out.Write(line)
	}
	return os.WriteFile(dst, out.Bytes(), 0o644)
}

// compressInitrd compresses the cpio archive src to dst as rc says and
// returns the format used: zstd falls back to xz when its output is over
// rc.maxSize (the budget check after it then still applies to xz's).
func compressInitrd(log *slog.Logger, rc recipe, src, dst string) (string, error) {
	switch rc.compress {
	case "zstd":
		if err := zstdCompress(src, dst); err != nil {
			return "", err
		}
		st, err := os.Stat(dst)
		if err != nil {
			return "", err
		}
		if rc.maxSize == 0 || st.Size() <= rc.maxSize {
			return "zstd", nil
		}
		log.Warn("zstd initramfs over budget: xz instead (unpacks slower)", "profile", string(rc.profile), "bytes", st.Size(), "budget", rc.maxSize)
		return "xz", xzCompress(src, dst, 16)
	case "xz":
		return "xz", xzCompress(src, dst, 16) // for the kernel's initramfs unpacker
	case "lz4":
		return "lz4", lz4File(src, dst)
	default:
		return "gzip", gzipFile(src, dst)
	}
}

// zstdCompress compresses src to dst, creating dst's directory, with the
// zstd CLI at level 22 and a window of at most 16 MiB (the kernel's
// initramfs unpacker allocates the window), single-threaded so the output
// is the same on every build machine.
func zstdCompress(src, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	cmd := exec.Command("zstd", "-q", "-f", "-T1", "--ultra", "-22", "--zstd=wlog=24", "-o", dst, src)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return fmt.Errorf("zstd not found: install Debian's zstd package")
		}
		return fmt.Errorf("zstd %s: %v %s", src, err, stderr.String())
	}
	return nil
}

// xzCompress compresses src to dst, creating dst's directory, as xz -9
// with a CRC32 check (the kernel's XZ decoder has no CRC64/SHA-256, and
// kernel module compression uses CRC32 too) and a dictMiB MiB dictionary
// (decompressors allocate the whole dictionary).
func xzCompress(src, dst string, dictMiB int) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	cmd := exec.Command("xz", "--check=crc32", fmt.Sprintf("--lzma2=preset=9,dict=%dMiB", dictMiB), "--stdout", src)
	cmd.Stdout = out
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err = cmd.Run()
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return fmt.Errorf("xz not found: install Debian's xz-utils package")
		}
		return fmt.Errorf("xz %s: %v %s", src, err, stderr.String())
	}
	return nil
}
