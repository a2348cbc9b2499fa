package progress

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"time"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func TestPlainLinesAreThrottled(t *testing.T) {
	var out bytes.Buffer
	c := &clock{t: time.Unix(1000, 0)}
	r := newReporter(&out, false, c.now)
	r.Stage("download kernel", 2048)
	for i := 0; i < 10; i++ {
		c.t = c.t.Add(time.Second)
		r.Add(100)
	}
	c.t = c.t.Add(time.Second)
	r.Done()
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	// The stage line, one line after 5 s and one after 10 s, the final line.
	want := []string{
		"download kernel: 0 B / 2.0 KiB (0%) [0s]",
		"download kernel: 500 B / 2.0 KiB (24%) [5s]",
		"download kernel: 1000 B / 2.0 KiB (48%) [10s]",
		"download kernel: 1000 B / 2.0 KiB (48%) [11s]",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s", out.String(), strings.Join(want, "\n"))
	}
}

func TestTerminalRedrawsOneLine(t *testing.T) {
	var out bytes.Buffer
	c := &clock{t: time.Unix(1000, 0)}
	r := newReporter(&out, true, c.now)
	r.Stage("pack initramfs", 0)
	c.t = c.t.Add(time.Second)
	if _, err := io.Copy(r.Writer(io.Discard), strings.NewReader(strings.Repeat("x", 3000))); err != nil {
		t.Fatal(err)
	}
	r.Done()
	r.Stage("next", 0)
	got := out.String()
	if strings.Count(got, "\n") != 1 || !strings.Contains(got, "\rpack initramfs: 2.9 KiB [1s]") || !strings.HasSuffix(got, "\rnext [1s]") {
		t.Fatalf("terminal output %q", got)
	}
}

func TestNilReporterIsQuiet(t *testing.T) {
	var r *Reporter
	r.Stage("x", 1)
	r.Add(1)
	r.Done()
}

func TestBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1536: "1.5 KiB", 48 << 20: "48.0 MiB", 3 << 30: "3.0 GiB"} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}
