package images

import (
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

func sumOf(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// failingReader gives some bytes, then an error (a peer whose stream
// breaks).
type failingReader struct {
	r   io.Reader
	err error
}

func (f *failingReader) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if err == io.EOF {
		return n, f.err
	}
	return n, err
}

// TestReceive: only exactly the announced bytes are stored, by content;
// anything else is an error that leaves nothing in the directory.
func TestReceive(t *testing.T) {
	data := bytes.Repeat([]byte("corral kernel "), 10000)
	good := Artifact{Name: DiscoverKernel, Kind: KindKernel, Size: int64(len(data)), SHA256: sumOf(data)}
	broken := errors.New("stream reset")
	for name, tc := range map[string]struct {
		want     Artifact
		in       io.Reader
		mismatch bool
		says     string
	}{
		"exact":         {want: good, in: bytes.NewReader(data)},
		"empty file":    {want: Artifact{Name: "empty", SHA256: sumOf(nil)}, in: bytes.NewReader(nil)},
		"truncated":     {want: good, in: bytes.NewReader(data[:len(data)-1]), mismatch: true, says: "truncated"},
		"longer":        {want: good, in: io.MultiReader(bytes.NewReader(data), strings.NewReader("x")), mismatch: true, says: "more than"},
		"other bytes":   {want: good, in: bytes.NewReader(bytes.ToUpper(data)), mismatch: true, says: "sha256 " + sumOf(bytes.ToUpper(data))},
		"stream fails":  {want: good, in: &failingReader{r: bytes.NewReader(data[:1000]), err: broken}, says: "after 1000 of"},
		"bad sum":       {want: Artifact{Name: "x", SHA256: "ABC"}, in: bytes.NewReader(data), says: "not a SHA-256"},
		"negative size": {want: Artifact{Name: "x", SHA256: good.SHA256, Size: -1}, in: bytes.NewReader(data), says: "outside"},
		"over the cap":  {want: Artifact{Name: "x", SHA256: good.SHA256, Size: MaxArtifactBytes + 1}, in: bytes.NewReader(data), says: "outside"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			got, err := Receive(dir, tc.want, tc.in)
			if tc.says == "" {
				if err != nil {
					t.Fatal(err)
				}
				b, rerr := os.ReadFile(got.Path)
				if rerr != nil || sumOf(b) != tc.want.SHA256 || got.Path != filepath.Join(dir, ContentDir, tc.want.SHA256) {
					t.Fatalf("stored %+v (%d bytes, %v)", got, len(b), rerr)
				}
				held, herr := Held(dir, tc.want.SHA256)
				if herr != nil || held.Path != got.Path || held.Size != tc.want.Size {
					t.Fatalf("Held = %+v, %v", held, herr)
				}
				return
			}
			if err == nil {
				t.Fatalf("Receive succeeded: %+v", got)
			}
			if errors.Is(err, ErrMismatch) != tc.mismatch || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("error %q: want ErrMismatch=%v saying %q", err, tc.mismatch, tc.says)
			}
			left, _ := filepath.Glob(filepath.Join(dir, ContentDir, "*"))
			hidden, _ := filepath.Glob(filepath.Join(dir, ContentDir, ".*"))
			if len(left)+len(hidden) != 0 {
				t.Errorf("a refused stream left %v %v", left, hidden)
			}
			if _, err := Held(dir, tc.want.SHA256); err == nil {
				t.Error("a refused stream is held")
			}
		})
	}
}

// TestHeldFromCatalog: the catalog's own files are found by content
// through its SHA256SUMS; a fetched one by its name in the content store.
func TestHeldFromCatalog(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "images")
	c, err := Open(Config{Dir: dir, IPXEDirs: []string{fakeIPXEDir(t)}})
	if err != nil {
		t.Fatal(err)
	}
	arts, err := ReadSums(dir)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(c.List(), arts); diff != "" {
		t.Errorf("ReadSums differs from the catalog (-catalog +sums):\n%s", diff)
	}
	k, _ := c.Lookup(DiscoverKernel)
	got, err := Held(dir, k.SHA256)
	if err != nil || got != k {
		t.Errorf("Held(kernel) = %+v, %v; want %+v", got, err, k)
	}
	if _, err := Held(dir, sumOf([]byte("nothing"))); !errors.Is(err, ErrNotFound) {
		t.Errorf("Held(unknown) = %v, want ErrNotFound", err)
	}
	if _, err := Held(dir, "../../etc/passwd"); err == nil || errors.Is(err, ErrNotFound) {
		t.Errorf("Held(path) = %v, want a malformed-sum error", err)
	}
	// A line naming a path outside the directory is ignored.
	sums := filepath.Join(dir, sumsFile)
	b, _ := os.ReadFile(sums)
	outside := sumOf([]byte("passwd"))
	if err := os.WriteFile(sums, append(b, []byte(outside+"  ../passwd\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Held(dir, outside); !errors.Is(err, ErrNotFound) {
		t.Errorf("Held(../passwd line) = %v, want ErrNotFound", err)
	}
	if none, err := ReadSums(t.TempDir()); err != nil || len(none) != 0 {
		t.Errorf("ReadSums(unopened) = %v, %v", none, err)
	}
}

// TestWithFleet: the fleet's boot profile files are taken from the content
// store when held there, unless a file is set explicitly; the catalog then
// serves them under their names.
func TestWithFleet(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "images")
	kernel := []byte("the fleet's kernel")
	initrd := []byte("the fleet's initramfs")
	fleet := []Artifact{
		{Name: DiscoverKernel, Size: int64(len(kernel)), SHA256: sumOf(kernel)},
		{Name: DiscoverInitrd, Size: int64(len(initrd)), SHA256: sumOf(initrd)},
		{Name: HypervisorInitrd, Size: 3, SHA256: sumOf([]byte("abc"))}, // not held
		{Name: UndionlyKPXE, Size: 3, SHA256: sumOf([]byte("abc"))},     // not a profile file
	}
	for i, b := range [][]byte{kernel, initrd} {
		if _, err := Receive(dir, fleet[i], bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
	}
	cfg := Config{Dir: dir, IPXEDirs: []string{fakeIPXEDir(t)}}
	got := cfg.WithFleet(fleet)
	want := cfg
	want.Kernel, want.Initrd = filepath.Join(dir, ContentDir, fleet[0].SHA256), filepath.Join(dir, ContentDir, fleet[1].SHA256)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("WithFleet (-want +got):\n%s", diff)
	}
	explicit := cfg
	explicit.Kernel = "/boot/vmlinuz"
	if k := explicit.WithFleet(fleet).Kernel; k != "/boot/vmlinuz" {
		t.Errorf("explicit kernel replaced by %s", k)
	}
	c, err := Open(got.WithBuiltDiscover())
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range [][]byte{kernel, initrd} {
		a, ok := c.Lookup(fleet[i].Name)
		if !ok || a.SHA256 != sumOf(b) {
			t.Errorf("catalog %s = %+v, want the fleet's", fleet[i].Name, a)
		}
	}
}

func TestCheckSHA256(t *testing.T) {
	for name, tc := range map[string]struct {
		in string
		ok bool
	}{
		"good":       {sumOf(nil), true},
		"upper case": {strings.ToUpper(sumOf(nil)), false},
		"short":      {sumOf(nil)[:63], false},
		"not hex":    {strings.Repeat("g", 64), false},
		"path":       {"../" + sumOf(nil)[3:], false},
		"empty":      {"", false},
	} {
		t.Run(name, func(t *testing.T) {
			if err := CheckSHA256(tc.in); (err == nil) != tc.ok {
				t.Errorf("CheckSHA256(%q) = %v", tc.in, err)
			}
		})
	}
}
