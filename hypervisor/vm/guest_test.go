package vm

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/corralhq/corral/testsupport/guestimage"
	"github.com/corralhq/corral/testsupport/require"
)

// tinyGuest returns the tiny test guest for a direct kernel boot: Debian's
// cloud kernel (downloaded once with apt-get and cached) and the tiny
// image's initramfs (testsupport/guestimage/tinyinit as /init, the
// virtio/SCSI/CD-ROM/button modules it loads, busybox and dropbear),
// written under dir.
func tinyGuest(t *testing.T, dir string) (kernel, initrd string) {
	t.Helper()
	require.Tool(t, guestimage.TinyBootTools...)
	cache, err := guestimage.CacheDir()
	if err != nil {
		require.Missing(t, "no cache directory: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	kernel, b, err := guestimage.TinyBoot(ctx, cache)
	if err != nil {
		t.Fatal(err)
	}
	initrd = filepath.Join(dir, "initrd.img")
	if err := os.WriteFile(initrd, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return kernel, initrd
}
