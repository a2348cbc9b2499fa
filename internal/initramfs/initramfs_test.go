package initramfs

import (
	"bytes"
	"io"
	"testing"

	"github.com/u-root/u-root/pkg/cpio"
)

func build(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := NewWriter(&buf)
	w.Dir("dev")
	w.CharDev("dev/console", 0o600, 5, 1)
	w.File("init", 0o100755, []byte("#!/bin/sh\n"))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestRoundTripAndReproducible(t *testing.T) {
	a, b := build(t), build(t)
	if !bytes.Equal(a, b) {
		t.Fatal("archive is not reproducible")
	}
	r := cpio.Newc.Reader(bytes.NewReader(a))
	recs, err := cpio.ReadAllRecords(r)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		name string
		mode uint64
	}{{"dev", cpio.S_IFDIR | 0o755}, {"dev/console", cpio.S_IFCHR | 0o600}, {"init", cpio.S_IFREG | 0o755}}
	if len(recs) != len(want) {
		t.Fatalf("%d records, want %d", len(recs), len(want))
	}
	for i, w := range want {
		if recs[i].Name != w.name || recs[i].Mode != w.mode {
			t.Errorf("record %d: %s %o, want %s %o", i, recs[i].Name, recs[i].Mode, w.name, w.mode)
		}
	}
	if recs[1].Rmajor != 5 || recs[1].Rminor != 1 {
		t.Errorf("console device %d:%d", recs[1].Rmajor, recs[1].Rminor)
	}
	data, _ := io.ReadAll(io.NewSectionReader(recs[2], 0, int64(recs[2].FileSize)))
	if string(data) != "#!/bin/sh\n" {
		t.Errorf("init contents %q", data)
	}
}
