package lab

import (
	"regexp"
	"strings"
	"testing"

	"github.com/corralhq/corral/testsupport/syncbuf"
	"github.com/google/go-cmp/cmp"
)

// TestUpProgress: off a terminal every stage is one plain line with the
// elapsed time; a child command's progress lines become stages without
// its own elapsed time, slog lines and blank lines are left out, a line
// split across writes is put together.
func TestUpProgress(t *testing.T) {
	var out syncbuf.Buffer
	p := newUpProgress(&out)
	p.Stagef("starting corrald in %s", "corral-lab-ab12")
	sw := &stageWriter{prefix: "building images: ", p: p}
	for _, w := range []string{
		"resolve inputs (kernel package, u-root, agent source) [0.1s]\n",
		"time=2026-01-01T00:00:00Z level=INFO msg=\"cache hit\"\n\n",
		"fetch and unpack linux-image-amd64 6.1 [1m2.5s]\nstage kernel ",
		"modules\n",
		"unterminated",
	} {
		if _, err := sw.Write([]byte(w)); err != nil {
			t.Fatal(err)
		}
	}
	p.Stagef("%s: %s", "lab-1", "INVENTORIED")
	p.Close()
	p.Close()

	elapsed := regexp.MustCompile(` \[[0-9.hmµns]+\]$`)
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if !elapsed.MatchString(l) {
			t.Errorf("line %q has no elapsed time", l)
		}
		got = append(got, elapsed.ReplaceAllString(l, ""))
	}
	want := []string{
		"starting corrald in corral-lab-ab12",
		"building images: resolve inputs (kernel package, u-root, agent source)",
		"building images: fetch and unpack linux-image-amd64 6.1",
		"building images: stage kernel modules",
		// Close's final line of the last stage is not printed again
		// when it would read the same (no time has passed here).
		"lab-1: INVENTORIED",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("progress lines (-want +got):\n%s", diff)
	}
	if tail := sw.Tail(); !strings.HasSuffix(tail, "unterminated") || !strings.Contains(tail, "level=INFO") {
		t.Errorf("tail %q", tail)
	}
}

func TestStageWriterBoundsTail(t *testing.T) {
	p := newUpProgress(&syncbuf.Buffer{})
	defer p.Close()
	sw := &stageWriter{p: p}
	line := strings.Repeat("x", 1000) + "\n"
	for range 200 {
		sw.Write([]byte(line))
	}
	if n := len(sw.Tail()); n > 64<<10 {
		t.Errorf("tail holds %d bytes, want at most 64 KiB", n)
	}
	sw.Write([]byte(strings.Repeat("y", 10000)))
	if len(sw.part) > 4096 {
		t.Errorf("a line without an end is kept whole (%d bytes)", len(sw.part))
	}
}
