// Package durable writes node-side files so that they survive a power cut
// (a hypervisor node is a machine whose power may go at any moment: the
// BMC, a watchdog, an operator): the data is synced before the rename or
// link that publishes it, and the directory is synced after it.
package durable

import (
	"os"
	"path/filepath"
)

// WriteFile replaces path with data atomically and durably: a temporary
// file in the same directory is written, given perm, synced, renamed over
// path, and the directory synced.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	return SyncDir(filepath.Dir(path))
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

// SyncDir flushes a directory's entries (new, renamed or removed names).
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
