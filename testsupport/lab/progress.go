package lab

import (
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/corralhq/corral/internal/progress"
	"golang.org/x/term"
)

// upProgress shows corral-lab up's stages through internal/progress: one
// line per stage ("building images: ...", "starting corrald", "booting
// lab-1 (BIOS)", "lab-1: INVENTORIED ...") with the time since up began.
// On a terminal the current stage's line is redrawn every second, so a
// long stage shows it is alive; elsewhere it is written once, and again
// every 30 s while the stage lasts, so a log is neither silent for
// minutes nor flooded. Its methods are safe for concurrent use.
type upProgress struct {
	r    *progress.Reporter
	stop chan struct{}
	once sync.Once
	done sync.WaitGroup
}

func newUpProgress(w io.Writer) *upProgress {
	tick := 30 * time.Second
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		tick = time.Second
	}
	p := &upProgress{r: progress.New(w), stop: make(chan struct{})}
	p.done.Add(1)
	go func() {
		defer p.done.Done()
		t := time.NewTicker(tick)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				p.r.Add(0) // redraw (throttled by the reporter)
			}
		}
	}()
	return p
}

// Stagef starts a stage named by format and args.
func (p *upProgress) Stagef(format string, args ...any) {
	p.r.Stage(fmt.Sprintf(format, args...), 0)
}

// Close ends the current line and stops the redraws; it may be called
// more than once.
func (p *upProgress) Close() {
	p.once.Do(func() {
		close(p.stop)
		p.done.Wait()
		p.r.Done()
	})
}

// childElapsed is the " [1m2.3s]" internal/progress puts after a stage.
var childElapsed = regexp.MustCompile(` \[[0-9.hmµns]+\]$`)

// stageWriter turns the progress lines another command writes (plain
// lines: its output is not a terminal) into stages prefixed by prefix,
// leaving out slog lines and blank ones. It keeps the last 64 KiB of what
// it was given for an error message.
type stageWriter struct {
	prefix string
	p      *upProgress
	mu     sync.Mutex
	part   []byte
	tail   []byte
}

func (s *stageWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tail = append(s.tail, b...)
	if n := len(s.tail) - 64<<10; n > 0 {
		s.tail = s.tail[n:]
	}
	s.part = append(s.part, b...)
	for {
		i := strings.IndexByte(string(s.part), '\n')
		if i < 0 {
			break
		}
		line := strings.TrimSpace(strings.ReplaceAll(string(s.part[:i]), "\r", ""))
		s.part = s.part[i+1:]
		if line == "" || strings.Contains(line, " level=") {
			continue
		}
		s.p.Stagef("%s%s", s.prefix, childElapsed.ReplaceAllString(line, ""))
	}
	if len(s.part) > 4096 { // a line without an end: drop it
		s.part = s.part[:0]
	}
	return len(b), nil
}

// Tail is the end of everything written.
func (s *stageWriter) Tail() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return string(s.tail)
}
