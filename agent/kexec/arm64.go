package kexec

import (
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
)

// arm64's kexec_file_load(2) (Linux 6.1's arch/arm64/kernel/kexec_image.c)
// takes only a plain Image: it checks the arm64 image header's magic
// "ARM\x64" at offset 56. Debian's arm64 vmlinuz is that Image gzip'd
// (the firmware's EFI stub is inside the Image, and GRUB's linux command
// unpacks the gzip), so the agent unpacks it before loading. kexec_load
// (SegmentsLoad) is x86's zero-page protocol and is not tried there.

// MaxImageSize bounds an unpacked arm64 kernel Image (Debian's is about
// 32 MB): a gzip bomb of a kernel stops there.
const MaxImageSize = 256 << 20

// arm64Magic is the arm64 Image header's magic and its offset.
const (
	arm64MagicOff = 56
	arm64Magic    = "ARM\x64"
)

// ErrNotImage means a kernel is neither an arm64 Image nor a gzip'd one.
var ErrNotImage = errors.New("not an arm64 kernel Image")

// ARM64Image returns kernel as the plain arm64 Image kexec_file_load
// takes: kernel itself (rewound) when it is one, else the gzip it is
// unpacked into an in-memory file of at most MaxImageSize bytes, checked
// for the header's magic. The caller closes a returned file that is not
// kernel.
func ARM64Image(kernel *os.File) (*os.File, error) {
	return arm64Image(kernel, MaxImageSize)
}

func arm64Image(kernel *os.File, limit int64) (*os.File, error) {
	head := make([]byte, 64)
	n, err := kernel.ReadAt(head, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("kernel: %w", err)
	}
	head = head[:n]
	if len(head) >= arm64MagicOff+4 && string(head[arm64MagicOff:arm64MagicOff+4]) == arm64Magic {
		if _, err := kernel.Seek(0, io.SeekStart); err != nil {
			return nil, err
		}
		return kernel, nil
	}
	if len(head) < 2 || head[0] != 0x1f || head[1] != 0x8b {
		return nil, ErrNotImage
	}
	zr, err := gzip.NewReader(bufio.NewReader(io.NewSectionReader(kernel, 0, 1<<62)))
	if err != nil {
		return nil, fmt.Errorf("kernel: gzip: %w", err)
	}
	zr.Multistream(false) // Debian's Image.gz is padded after its one member
	out, err := memFile("image")
	if err != nil {
		return nil, err
	}
	w, err := io.Copy(out, io.LimitReader(zr, limit+1))
	if err == nil && w > limit {
		err = fmt.Errorf("unpacked kernel over %d bytes", limit)
	}
	if err == nil {
		_, err = out.ReadAt(head[:cap(head)][:64], 0)
		if err == nil && string(head[arm64MagicOff:arm64MagicOff+4]) != arm64Magic {
			err = ErrNotImage
		}
	}
	if err == nil {
		_, err = out.Seek(0, io.SeekStart)
	}
	if err != nil {
		out.Close()
		return nil, fmt.Errorf("kernel: %w", err)
	}
	return out, nil
}

// loadARM64 unpacks kernel (ARM64Image) and loads it with file
// (kexec_file_load).
func loadARM64(kernel, initrd *os.File, cmdline string, file loadFunc) error {
	img, err := ARM64Image(kernel)
	if err != nil {
		return err
	}
	if img != kernel {
		defer img.Close()
	}
	return file(img, initrd, cmdline)
}
