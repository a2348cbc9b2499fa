// Package imagecache names the machine-wide boot-image build cache that
// `corrald images build` and corral-lab share, so one machine builds (and
// downloads kernel packages for) each image once. It imports nothing of
// ours.
package imagecache

import (
	"os"
	"path/filepath"
	"syscall"
)

// System is the machine-wide cache for root (and for anyone allowed to
// write it).
const System = "/var/cache/corral/images"

// legacy is where corral-lab cached images before System existed; it is
// kept in use while it exists and System does not, so an upgrade does not
// rebuild.
const legacy = "/var/cache/corral/discovery"

// Default is the image build cache to use when none is given (the
// CORRAL_IMAGE_CACHE environment variable and --image-cache override it
// through the flags): System (or the older /var/cache/corral/discovery
// while only that exists) when this process may write there, else
// $XDG_CACHE_HOME/corral/images (~/.cache/corral/images), else System.
// It only looks; it creates nothing.
func Default() string {
	return choose(env{euid: os.Geteuid(), writable: writable, exists: exists, userCache: os.UserCacheDir})
}

type env struct {
	euid      int
	writable  func(dir string) bool
	exists    func(dir string) bool
	userCache func() (string, error)
}

func choose(e env) string {
	sys := System
	if !e.exists(sys) && e.exists(legacy) {
		sys = legacy
	}
	if e.euid == 0 || e.writable(sys) || (!e.exists(sys) && e.writable(filepath.Dir(sys))) {
		return sys
	}
	if uc, err := e.userCache(); err == nil && uc != "" {
		return filepath.Join(uc, "corral", "images")
	}
	return sys
}

func exists(dir string) bool {
	fi, err := os.Stat(dir)
	return err == nil && fi.IsDir()
}

// writable reports whether this process may create files in dir.
func writable(dir string) bool {
	return syscall.Access(dir, 0x2 /* W_OK */) == nil
}
