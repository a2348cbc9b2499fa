// Package durable writes and removes node-side files so that the change
// survives a power cut (a hypervisor node is a machine whose power may go
// at any moment: the BMC, a watchdog, an operator): the data is synced
// before the rename or link that publishes it, and the directory is synced
// after any name in it is created, renamed or removed, so that a call that
// returned nil is not undone by the next boot. It imports only the
// standard library and renameio (pure Go, a few hundred lines).
package durable

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/renameio/v2"
)

// TrashPrefix starts the hidden name RemoveAll renames a tree to before
// removing it; SweepTrash removes what a crash left under such names.
const TrashPrefix = ".trash-"

// WriteFile replaces path with data atomically and durably: a temporary
// file in the same directory is written, given perm, synced and renamed
// over path (renameio), and the directory synced.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := renameio.NewPendingFile(path, renameio.WithTempDir(dir), renameio.WithStaticPermissions(perm))
	if err != nil {
		return err
	}
	defer f.Cleanup()
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.CloseAtomicallyReplace(); err != nil {
		return err
	}
	return SyncDir(dir)
}

// Remove removes the file (or empty directory) path and syncs its
// directory: once it returns nil the name stays gone after a power cut. A
// missing path is an error for which errors.Is(err, fs.ErrNotExist) holds,
// and nothing is synced.
func Remove(path string) error {
	if err := os.Remove(path); err != nil {
		return err
	}
	if err := SyncDir(filepath.Dir(path)); err != nil {
		return fmt.Errorf("removed %s, but syncing its directory failed: %w", path, err)
	}
	return nil
}

// Rename renames oldpath to newpath (replacing newpath, like os.Rename)
// and syncs the directory of each, so the new name survives a power cut
// and the old one does not come back.
func Rename(oldpath, newpath string) error {
	if err := os.Rename(oldpath, newpath); err != nil {
		return err
	}
	dirs := []string{filepath.Dir(newpath)}
	if d := filepath.Dir(oldpath); d != dirs[0] {
		dirs = append(dirs, d)
	}
	for _, d := range dirs {
		if err := SyncDir(d); err != nil {
			return fmt.Errorf("renamed %s to %s, but syncing %s failed: %w", oldpath, newpath, d, err)
		}
	}
	return nil
}

// RemoveAll removes the tree at path so that a power cut leaves either all
// of it under its name or none of it: the tree is first renamed to a
// hidden sibling (TrashPrefix + base + random) and the directory synced —
// the point where the removal is durable —, then the hidden tree is
// removed. If that last step fails, or the power goes during it, the
// hidden tree is left for SweepTrash and RemoveAll still returns nil: the
// name is gone. A missing path is not an error (like os.RemoveAll).
func RemoveAll(path string) error {
	if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	var r [6]byte
	if _, err := rand.Read(r[:]); err != nil {
		return err
	}
	dir := filepath.Dir(path)
	trash := filepath.Join(dir, TrashPrefix+filepath.Base(path)+"-"+hex.EncodeToString(r[:]))
	if err := os.Rename(path, trash); err != nil {
		return err
	}
	if err := SyncDir(dir); err != nil {
		return fmt.Errorf("moved %s aside, but syncing %s failed: %w", path, dir, err)
	}
	if os.RemoveAll(trash) == nil {
		_ = SyncDir(dir) // the name is already durably gone
	}
	return nil
}

// SweepTrash removes the hidden trees RemoveAll left in dir (a crash or
// an error during the removal) and returns the names it removed. Call it
// when the owner of dir starts, before anything else writes there.
func SweepTrash(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), TrashPrefix) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, e.Name())
	}
	if len(removed) > 0 {
		if err := SyncDir(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return removed, errors.Join(errs...)
}

// SyncFile flushes a file's data and metadata to the disk.
func SyncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// testHookSyncDir, when set (tests only), is called with the directory
// before each SyncDir, so a test can check what is synced and when.
var testHookSyncDir func(dir string)

// SyncDir flushes a directory's entries (new, renamed or removed names).
func SyncDir(dir string) error {
	if testHookSyncDir != nil {
		testHookSyncDir(dir)
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
