package durable

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestWriteFileReplacesAndLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "spec.json")
	for _, data := range []string{"one", "two"} {
		if err := WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(p)
		if err != nil || string(b) != data {
			t.Fatalf("read %q, %v; want %q", b, err, data)
		}
	}
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v", fi.Mode(), err)
	}
	es, _ := os.ReadDir(dir)
	if len(es) != 1 {
		t.Fatalf("%d entries, want only spec.json", len(es))
	}
	if err := WriteFile(filepath.Join(dir, "missing", "x"), nil, 0o600); err == nil {
		t.Fatal("write into a missing directory succeeded")
	}
	if err := SyncFile(p); err != nil {
		t.Fatal(err)
	}
	if err := SyncDir(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("sync of a missing directory succeeded")
	}
}

// syncSpy records, for every SyncDir, the directory and whether each
// watched path existed at that moment: a sync that happens before the
// change it must make durable is caught.
type syncSpy struct {
	watch []string
	calls []syncCall
}

type syncCall struct {
	Dir    string
	Exists map[string]bool
}

func spyOn(t *testing.T, watch ...string) *syncSpy {
	t.Helper()
	s := &syncSpy{watch: watch}
	testHookSyncDir = func(dir string) {
		c := syncCall{Dir: dir, Exists: map[string]bool{}}
		for _, w := range s.watch {
			_, err := os.Lstat(w)
			c.Exists[filepath.Base(w)] = err == nil
		}
		s.calls = append(s.calls, c)
	}
	t.Cleanup(func() { testHookSyncDir = nil })
	return s
}

func TestRemoveSyncsAfterUnlink(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "vol")
	if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	spy := spyOn(t, p)
	if err := Remove(p); err != nil {
		t.Fatal(err)
	}
	want := []syncCall{{Dir: dir, Exists: map[string]bool{"vol": false}}}
	if diff := cmp.Diff(want, spy.calls); diff != "" {
		t.Errorf("syncs (-want +got):\n%s", diff)
	}
	spy.calls = nil
	if err := Remove(p); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("second Remove: %v, want ErrNotExist", err)
	}
	if len(spy.calls) != 0 {
		t.Errorf("a failed Remove synced: %+v", spy.calls)
	}
}

func TestRenameSyncsBothDirectories(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	from, to := filepath.Join(a, "from"), filepath.Join(b, "to")
	if err := os.WriteFile(from, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	spy := spyOn(t, from, to)
	if err := Rename(from, to); err != nil {
		t.Fatal(err)
	}
	after := map[string]bool{"from": false, "to": true}
	want := []syncCall{{Dir: b, Exists: after}, {Dir: a, Exists: after}}
	if diff := cmp.Diff(want, spy.calls); diff != "" {
		t.Errorf("syncs (-want +got):\n%s", diff)
	}
}

// TestRemoveAll: the tree is moved aside and the move synced before it is
// removed; a missing path is fine; SweepTrash removes what a crash left.
func TestRemoveAll(t *testing.T) {
	dir := t.TempDir()
	vm := filepath.Join(dir, "vm1")
	if err := os.MkdirAll(filepath.Join(vm, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(vm, "spec.json"), []byte("{}"), 0o600)
	var trashSeen []string
	var calls []syncCall
	testHookSyncDir = func(d string) {
		es, _ := os.ReadDir(d)
		for _, e := range es {
			if strings.HasPrefix(e.Name(), TrashPrefix) {
				trashSeen = append(trashSeen, e.Name())
			}
		}
		_, err := os.Lstat(vm)
		calls = append(calls, syncCall{Dir: d, Exists: map[string]bool{"vm1": err == nil}})
	}
	t.Cleanup(func() { testHookSyncDir = nil })
	if err := RemoveAll(vm); err != nil {
		t.Fatal(err)
	}
	want := []syncCall{{Dir: dir, Exists: map[string]bool{"vm1": false}}, {Dir: dir, Exists: map[string]bool{"vm1": false}}}
	if diff := cmp.Diff(want, calls); diff != "" {
		t.Errorf("syncs (-want +got):\n%s", diff)
	}
	if len(trashSeen) != 1 || !strings.HasPrefix(trashSeen[0], TrashPrefix+"vm1-") {
		t.Errorf("at the first sync the tree should sit under one hidden name; saw %v", trashSeen)
	}
	if es, _ := os.ReadDir(dir); len(es) != 0 {
		t.Errorf("left behind: %v", es)
	}
	if err := RemoveAll(filepath.Join(dir, "missing")); err != nil {
		t.Errorf("missing path: %v", err)
	}

	// A crash between the move and the removal leaves trash behind.
	os.MkdirAll(filepath.Join(dir, TrashPrefix+"vm2-0123", "x"), 0o700)
	os.WriteFile(filepath.Join(dir, "keep"), nil, 0o600)
	removed, err := SweepTrash(dir)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{TrashPrefix + "vm2-0123"}, removed); diff != "" {
		t.Errorf("swept (-want +got):\n%s", diff)
	}
	if es, _ := os.ReadDir(dir); len(es) != 1 || es[0].Name() != "keep" {
		t.Errorf("after sweep: %v", es)
	}
}
