package commission

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/u-root/u-root/pkg/cpio"
)

// overlay is a gzip'd newc cpio of usr/, usr/sbin/ and usr/sbin/tool,
// and etc/keep.
func overlay(t *testing.T) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	w := cpio.Newc.Writer(zw)
	for _, r := range []cpio.Record{
		cpio.Directory("usr", 0o755), cpio.Directory("usr/sbin", 0o755),
		cpio.StaticFile("usr/sbin/tool", "#!/bin/sh\necho tool\n", 0o755),
		cpio.Directory("etc", 0o755), cpio.StaticFile("etc/keep", "from the overlay", 0o644),
	} {
		if err := w.WriteRecord(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := cpio.WriteTrailer(w); err != nil {
		t.Fatal(err)
	}
	zw.Close()
	return b.Bytes()
}

// TestUnpackOverlay: an overlay whose size or SHA-256 differs from the
// plan's is refused before anything is unpacked; a good one is unpacked
// into the root, keeping a file the root already has.
func TestUnpackOverlay(t *testing.T) {
	body := overlay(t)
	sum := sha256.Sum256(body)
	good := hex.EncodeToString(sum[:])
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	os.WriteFile(filepath.Join(root, "etc/keep"), []byte("the image's"), 0o644)
	r := New(Config{Root: root, Fetch: func(context.Context, string) (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(body)), nil
	}})
	ctx := context.Background()
	if err := r.unpackOverlay(ctx, "http://x/o", strings.Repeat("0", 64), int64(len(body))); err == nil || !strings.Contains(err.Error(), "SHA-256") {
		t.Fatalf("wrong hash: %v", err)
	}
	if err := r.unpackOverlay(ctx, "http://x/o", good, int64(len(body))-1); err == nil {
		t.Fatal("wrong size accepted")
	}
	if _, err := os.Stat(filepath.Join(root, "usr/sbin/tool")); err == nil {
		t.Fatal("a refused overlay was unpacked")
	}
	if err := r.unpackOverlay(ctx, "http://x/o", good, int64(len(body))); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(root, "usr/sbin/tool")); err != nil || st.Mode()&0o111 == 0 {
		t.Fatalf("tool: %v %v", st, err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "etc/keep")); string(b) != "the image's" {
		t.Fatalf("etc/keep rewritten: %q", b)
	}
}
