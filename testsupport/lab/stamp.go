package lab

import (
	"bytes"
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
// split on one clock. It returns a stop function that copies what is left
// and waits for the copier.
func StampConsoles(dir, outDir string) (stop func(), err error) {
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		type source struct {
			off  int64
			part []byte // a line without its end yet
			out  *os.File
		}
		srcs := map[string]*source{}
		defer func() {
			for _, s := range srcs {
				if len(s.part) > 0 {
					s.out.WriteString(time.Now().UTC().Format("15:04:05.000") + " ")
					s.out.Write(append(s.part, '\n'))
				}
				s.out.Close()
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
					data := append(s.part, buf[:n]...)
					s.part = nil
					for {
						i := bytes.IndexByte(data, '\n')
						if i < 0 {
							break
						}
						s.out.WriteString(now + " ")
						s.out.Write(data[:i+1])
						data = data[i+1:]
					}
					if len(data) > stampMaxLine {
						s.out.WriteString(now + " ")
						s.out.Write(append(data, '\n'))
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
	return func() { once.Do(func() { close(done); wg.Wait() }) }, nil
}
