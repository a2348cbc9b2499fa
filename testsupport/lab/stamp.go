package lab

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// stampEvery is how often the consoles are read: the resolution of the
// stamps (the guests' own printk and log times are finer, but the
// kernel's count from its boot, and u-root's in whole seconds).
const stampEvery = 20 * time.Millisecond

// stampMaxLine bounds a line held while waiting for its end.
const stampMaxLine = 64 << 10

// StampConsoles copies every machine's console under dir (the lab's
// run/machines/*/console.log, which may appear later or be recreated) to
// outDir/<machine>.console.log as it is written, each line prefixed with
// the host's wall clock (UTC, milliseconds), so a round's boots can be
// split on one clock. It returns a stop function that copies what is left,
// waits for the copier and returns the copies' write errors (a copy
// stops at its first).
func StampConsoles(dir, outDir string) (stop func() error, err error) {
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	var (
		wg      sync.WaitGroup
		copyErr error // the copier's, read after wg.Wait
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		type source struct {
			off  int64
			part []byte // a line without its end yet
			out  *os.File
			err  error // the first write error; the copy stops there
		}
		// write writes one stamped line (ending in '\n').
		write := func(s *source, stamp string, line []byte) {
			if s.err == nil {
				_, s.err = s.out.Write(append([]byte(stamp+" "), line...))
			}
		}
		srcs := map[string]*source{}
		defer func() {
			for _, s := range srcs {
				if len(s.part) > 0 {
					write(s, time.Now().UTC().Format("15:04:05.000"), append(s.part, '\n'))
				}
				if err := s.out.Close(); err != nil && s.err == nil {
					s.err = err
				}
				if s.err != nil {
					copyErr = errors.Join(copyErr, s.err)
				}
			}
		}()
		buf := make([]byte, 256<<10)
		poll := func() {
			paths, _ := filepath.Glob(filepath.Join(dir, "run", "machines", "*", "console.log"))
			now := time.Now().UTC().Format("15:04:05.000")
			for _, p := range paths {
				name := filepath.Base(filepath.Dir(p))
				s := srcs[name]
				if s == nil {
					out, err := os.OpenFile(filepath.Join(outDir, name+".console.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
					if err != nil {
						continue
					}
					s = &source{out: out}
					srcs[name] = s
				}
				f, err := os.Open(p)
				if err != nil {
					continue
				}
				if st, err := f.Stat(); err == nil && st.Size() < s.off {
					s.off, s.part = 0, nil // recreated by a new round's up
				}
				for {
					n, err := f.ReadAt(buf, s.off)
					s.off += int64(n)
					s.part = append(s.part, buf[:n]...)
					data := s.part
					s.part = nil
					for {
						i := bytes.IndexByte(data, '\n')
						if i < 0 {
							break
						}
						write(s, now, data[:i+1])
						data = data[i+1:]
					}
					if len(data) > stampMaxLine {
						write(s, now, append(data, '\n'))
						data = nil
					}
					s.part = append([]byte(nil), data...)
					if err == io.EOF || n == 0 || err != nil {
						break
					}
				}
				f.Close()
			}
		}
		t := time.NewTicker(stampEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				poll()
				return
			case <-t.C:
				poll()
			}
		}
	}()
	var once sync.Once
	return func() error {
		once.Do(func() { close(done); wg.Wait() })
		return copyErr
	}, nil
}
