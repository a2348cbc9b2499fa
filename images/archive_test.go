package images

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// registered makes a catalog with a discovery and a hypervisor image.
func registered(t *testing.T) Config {
	t.Helper()
	cfg := Config{Dir: filepath.Join(t.TempDir(), "images"), IPXEDirs: []string{fakeIPXEDir(t)}}
	built := t.TempDir()
	k, i, h := filepath.Join(built, "vmlinuz"), filepath.Join(built, "initrd.img"), filepath.Join(built, "hv.img")
	os.WriteFile(k, []byte("real kernel"), 0o644)
	os.WriteFile(i, []byte("real initramfs"), 0o644)
	os.WriteFile(h, []byte("hypervisor initramfs"), 0o644)
	if _, _, err := RegisterDiscover(cfg, k, i, "6.1.0-test", "dkey"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := RegisterHypervisor(cfg, h, "6.1.0-test", "hkey"); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func exportArchive(t *testing.T, cfg Config) []byte {
	t.Helper()
	var buf bytes.Buffer
	if _, err := Export(&buf, cfg, "v-test", nil); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// catalogFiles maps every file under dir (relative) to its content.
func catalogFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, _ := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		out[rel] = string(b)
		return nil
	})
	return out
}

func TestExportImport(t *testing.T) {
	src := registered(t)
	arc := exportArchive(t, src)

	dst := Config{Dir: filepath.Join(t.TempDir(), "images")}
	got, err := Import(bytes.NewReader(arc), dst, "corral-images.tar", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Hypervisor == nil || got.Manifest.KernelRelease != "6.1.0-test" || got.Manifest.DiscoverKey != "dkey" || got.Manifest.HypervisorKey != "hkey" {
		t.Errorf("imported = %+v", got)
	}
	if diff := cmp.Diff([]string{IPXEEFI, UndionlyKPXE}, got.IPXE); diff != "" {
		t.Errorf("iPXE binaries (-want +got):\n%s", diff)
	}
	// What corrald serve does: Open with the defaults. The imported iPXE
	// binaries come before Debian's.
	cat, err := Open(dst.WithBuiltDiscover())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{DiscoverKernel: "real kernel", DiscoverInitrd: "real initramfs", HypervisorInitrd: "hypervisor initramfs",
		UndionlyKPXE: "binary " + UndionlyKPXE, IPXEEFI: "binary " + IPXEEFI}
	for name, w := range want {
		a, ok := cat.Lookup(name)
		if !ok {
			t.Errorf("%s not in the catalog", name)
			continue
		}
		b, _ := os.ReadFile(a.Path)
		if string(b) != w {
			t.Errorf("%s = %q, want %q", name, b, w)
		}
	}
	if _, err := os.Stat(filepath.Join(dst.Dir, ImportRecord)); err != nil {
		t.Errorf("no import record: %v", err)
	}
	// The same bytes as the source catalog.
	srcCat, _ := Open(src.WithBuiltDiscover())
	for name := range want {
		a, _ := srcCat.Lookup(name)
		b, _ := cat.Lookup(name)
		if a.SHA256 != b.SHA256 || a.Size != b.Size {
			t.Errorf("%s: source %+v, imported %+v", name, a, b)
		}
	}
	// An archive exported from the imported catalog imports again.
	if _, err := Import(bytes.NewReader(exportArchive(t, dst)), Config{Dir: filepath.Join(t.TempDir(), "images")}, "", nil); err != nil {
		t.Errorf("re-export: %v", err)
	}
	// A local build afterwards drops the import record.
	k := filepath.Join(t.TempDir(), "k")
	os.WriteFile(k, []byte("k"), 0o644)
	if _, _, err := RegisterDiscover(dst, k, k, "6.1.0-other", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dst.Dir, ImportRecord)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("import record after a local registration: %v", err)
	}
}

func TestExportNothingRegistered(t *testing.T) {
	_, err := Export(io.Discard, Config{Dir: t.TempDir(), IPXEDirs: []string{fakeIPXEDir(t)}}, "", nil)
	if err == nil || !strings.Contains(err.Error(), "corrald images build") {
		t.Errorf("err = %v, want one that says to build first", err)
	}
}

type entry struct {
	name string
	data []byte
	typ  byte
}

// rewrite reads arc and writes it again through edit.
func rewrite(t *testing.T, arc []byte, edit func([]entry) []entry) []byte {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(arc))
	var es []entry
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		es = append(es, entry{h.Name, b, h.Typeflag})
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range edit(es) {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		h := &tar.Header{Name: e.name, Mode: 0o644, Typeflag: typ}
		if typ == tar.TypeReg {
			h.Size = int64(len(e.data))
		} else {
			h.Linkname = "/etc/passwd"
		}
		tw.WriteHeader(h)
		tw.Write(e.data)
	}
	tw.Close()
	return buf.Bytes()
}

func modify(name string, f func([]byte) []byte) func([]entry) []entry {
	return func(es []entry) []entry {
		for i := range es {
			if es[i].name == name {
				es[i].data = f(append([]byte(nil), es[i].data...))
			}
		}
		return es
	}
}

func TestImportRefuses(t *testing.T) {
	arc := exportArchive(t, registered(t))
	flip := func(b []byte) []byte { b[len(b)-1] ^= 1; return b }
	tests := map[string]struct {
		arc     []byte
		wantErr error
		say     []string
	}{
		"tampered initramfs":  {arc: rewrite(t, arc, modify(DiscoverInitrd, flip)), wantErr: ErrMismatch, say: []string{DiscoverInitrd, "SHA256SUMS", "nothing was registered"}},
		"tampered hypervisor": {arc: rewrite(t, arc, modify(HypervisorInitrd, flip)), wantErr: ErrMismatch, say: []string{HypervisorInitrd}},
		"tampered iPXE":       {arc: rewrite(t, arc, modify(UndionlyKPXE, flip)), wantErr: ErrMismatch, say: []string{UndionlyKPXE}},
		"tampered manifest": {arc: rewrite(t, arc, modify(ArchiveManifest, func(b []byte) []byte {
			return bytes.Replace(b, []byte("6.1.0-test"), []byte("6.1.0-evil"), 1)
		})), wantErr: ErrMismatch, say: []string{ArchiveManifest}},
		"file and sums both altered, manifest not": {arc: rewrite(t, arc, func(es []entry) []entry {
			es = modify(DiscoverKernel, func([]byte) []byte { return []byte("evil kernel") })(es)
			return modify(sumsFile, func(b []byte) []byte {
				return []byte(strings.Replace(string(b), sha256Hex("real kernel"), sha256Hex("evil kernel"), 1))
			})(es)
		}), wantErr: ErrMismatch, say: []string{DiscoverKernel, ArchiveManifest}},
		"no SHA256SUMS":   {arc: rewrite(t, arc, func(es []entry) []entry { return drop(es, sumsFile) }), wantErr: ErrArchive, say: []string{"no SHA256SUMS"}},
		"no manifest":     {arc: rewrite(t, arc, func(es []entry) []entry { return drop(es, ArchiveManifest) }), wantErr: ErrArchive, say: []string{"no " + ArchiveManifest}},
		"a file missing":  {arc: rewrite(t, arc, func(es []entry) []entry { return drop(es, HypervisorInitrd) }), wantErr: ErrArchive, say: []string{HypervisorInitrd, "lacks"}},
		"an unknown file": {arc: rewrite(t, arc, func(es []entry) []entry { return append(es, entry{name: "evil.sh", data: []byte("x")}) }), wantErr: ErrArchive, say: []string{`"evil.sh"`}},
		"a path":          {arc: rewrite(t, arc, func(es []entry) []entry { return append(es, entry{name: "../" + DiscoverKernel, data: []byte("x")}) }), wantErr: ErrArchive, say: []string{"../vmlinuz"}},
		"a symlink":       {arc: rewrite(t, arc, func(es []entry) []entry { return append(es, entry{name: IPXEPXE, typ: tar.TypeSymlink}) }), wantErr: ErrArchive, say: []string{"not a regular file"}},
		"a duplicate":     {arc: rewrite(t, arc, func(es []entry) []entry { return append(es, es[len(es)-1]) }), wantErr: ErrArchive, say: []string{"twice"}},
		"truncated":       {arc: arc[:len(arc)/2], wantErr: ErrArchive, say: []string{"truncated"}},
		"not a tar":       {arc: []byte("hello, this is not an archive at all, but it is long enough to be read as a header block? no."), wantErr: ErrArchive},
		"empty":           {arc: nil, wantErr: ErrArchive, say: []string{"no SHA256SUMS"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			// A catalog that holds an earlier import: it must stay as it was.
			dst := registered(t)
			before := catalogFiles(t, dst.Dir)
			_, err := Import(bytes.NewReader(tc.arc), dst, "", nil)
			t.Log(err)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			for _, s := range tc.say {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("err = %v, want it to say %q", err, s)
				}
			}
			if diff := cmp.Diff(before, catalogFiles(t, dst.Dir)); diff != "" {
				t.Errorf("catalog changed by a refused import (-before +after):\n%s", diff)
			}
		})
	}
}

func drop(es []entry, name string) []entry {
	var out []entry
	for _, e := range es {
		if e.name != name {
			out = append(out, e)
		}
	}
	return out
}

func sha256Hex(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}
