// Package progress reports how far long work is: a stage, bytes done of a
// total when known, and the time elapsed. On a terminal it redraws one line
// (at most every 200 ms); anywhere else it writes plain lines, one per stage
// and at most one every 5 s within a stage, so logs stay readable.
package progress

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/term"
)

// Reporter prints progress to one writer. The zero value is not usable; a
// nil *Reporter is, and prints nothing.
type Reporter struct {
	mu       sync.Mutex
	w        io.Writer
	tty      bool
	start    time.Time
	stage    string
	stageAt  time.Time
	done     int64
	total    int64
	last     time.Time
	drawn    int
	printed  string
	now      func() time.Time
	interval time.Duration
}

// New reports to w; it redraws a line when w is a terminal.
func New(w io.Writer) *Reporter {
	tty := false
	if f, ok := w.(*os.File); ok {
		tty = term.IsTerminal(int(f.Fd()))
	}
	return newReporter(w, tty, time.Now)
}

func newReporter(w io.Writer, tty bool, now func() time.Time) *Reporter {
	r := &Reporter{w: w, tty: tty, now: now, interval: 5 * time.Second}
	if tty {
		r.interval = 200 * time.Millisecond
	}
	r.start = now()
	return r
}

// Stage starts a named stage; total is its size in bytes (0 = unknown).
func (r *Reporter) Stage(name string, total int64) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.endLine()
	r.stage, r.total, r.done = name, total, 0
	r.stageAt = r.now()
	r.print(true)
}

// Add counts n more bytes done in the current stage.
func (r *Reporter) Add(n int64) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.done += n
	r.print(false)
}

// Set sets the bytes done in the current stage.
func (r *Reporter) Set(done int64) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.done = done
	r.print(false)
}

// Done ends the current stage with a final line.
func (r *Reporter) Done() {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.print(true)
	r.endLine()
	r.stage = ""
}

// Writer wraps w so that every byte written through it counts as done.
func (r *Reporter) Writer(w io.Writer) io.Writer { return &counter{w: w, r: r} }

// Reader wraps rd so that every byte read through it counts as done.
func (r *Reporter) Reader(rd io.Reader) io.Reader { return &counter{rd: rd, r: r} }

type counter struct {
	w  io.Writer
	rd io.Reader
	r  *Reporter
}

func (c *counter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.r.Add(int64(n))
	return n, err
}

func (c *counter) Read(p []byte) (int, error) {
	n, err := c.rd.Read(p)
	c.r.Add(int64(n))
	return n, err
}

func (r *Reporter) print(force bool) {
	now := r.now()
	if !force && now.Sub(r.last) < r.interval {
		return
	}
	r.last = now
	line := r.line(now)
	if line == r.printed {
		return
	}
	r.printed = line
	if r.tty {
		pad := ""
		if n := r.drawn - len(line); n > 0 {
			pad = fmt.Sprintf("%*s", n, "")
		}
		fmt.Fprintf(r.w, "\r%s%s", line, pad)
		r.drawn = len(line)
		return
	}
	fmt.Fprintln(r.w, line)
}

func (r *Reporter) endLine() {
	if r.tty && r.drawn > 0 {
		fmt.Fprintln(r.w)
		r.drawn = 0
	}
}

func (r *Reporter) line(now time.Time) string {
	s := r.stage
	switch {
	case r.total > 0:
		s += fmt.Sprintf(": %s / %s (%d%%)", Bytes(r.done), Bytes(r.total), r.done*100/r.total)
	case r.done > 0:
		s += ": " + Bytes(r.done)
	}
	return fmt.Sprintf("%s [%s]", s, now.Sub(r.start).Round(100*time.Millisecond))
}

// Bytes formats n in binary units: 512 B, 1.5 KiB, 48.2 MiB.
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
