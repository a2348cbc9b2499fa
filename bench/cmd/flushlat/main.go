// Command flushlat measures the disk's flush latency as corrald's journal
// sees it: it appends a record (-size bytes, default 600, about one lease)
// to a file in -dir and fdatasyncs it, -gap apart, for -d, and prints the
// percentiles and the count of flushes over 10 and 50 ms. A server that
// makes each lease durable before its ACK cannot answer faster than this:
// one 300 ms flush holds every ACK that arrives meanwhile (at 4,000
// leases/s, 1,200 of them, three times the 1 % of a 10 s run).
//
// With -files N, N writers do the same at once, each on its own file,
// and it also prints how many of the slow flushes (over 10 ms) another
// file's flush both started and finished inside of: whether a stall
// holds one request or the whole disk, i.e. whether writing each record
// to two files and answering at the first flush would cut the tail. It
// prints figures; it asserts nothing. See bench/results/2026-11-dhcp.md (24 Nov
// 2026, the disk's flush tail and sysmon).
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// flush is one append + fdatasync.
type flush struct{ start, end time.Time }

func (f flush) took() time.Duration { return f.end.Sub(f.start) }

func main() {
	dir := flag.String("dir", os.TempDir(), "directory of the files (the filesystem under test)")
	d := flag.Duration("d", 10*time.Second, "how long to run")
	gap := flag.Duration("gap", 250*time.Microsecond, "pause between flushes")
	size := flag.Int("size", 600, "bytes appended before each flush")
	files := flag.Int("files", 1, "writers at once, each on its own file")
	flag.Parse()
	if *files < 1 || *size < 1 {
		log.Fatal("-files and -size must be at least 1")
	}
	runs := make([][]flush, *files)
	var wg sync.WaitGroup
	for i := range runs {
		f, err := os.CreateTemp(*dir, "flushlat-")
		if err != nil {
			log.Fatal(err)
		}
		defer os.Remove(f.Name())
		defer f.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			runs[i] = writer(f, *d, *gap, *size)
		}()
	}
	wg.Wait()
	for i, r := range runs {
		lat := make([]time.Duration, len(r))
		for j, f := range r {
			lat[j] = f.took()
		}
		name := *dir
		if *files > 1 {
			name = fmt.Sprintf("%s file %d", *dir, i+1)
		}
		report(name, lat, *d)
	}
	if *files > 1 {
		slow, escaped := escapes(runs, 10*time.Millisecond)
		fmt.Printf("flushes over 10 ms: %d; inside %d of them another file's flush started and finished\n", slow, escaped)
	}
}

// writer appends and flushes f until d has passed.
func writer(f *os.File, d, gap time.Duration, size int) []flush {
	rec := make([]byte, size)
	var out []flush
	for end := time.Now().Add(d); time.Now().Before(end); {
		t := time.Now()
		if _, err := f.Write(rec); err != nil {
			log.Fatal(err)
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			log.Fatal(err)
		}
		out = append(out, flush{t, time.Now()})
		time.Sleep(gap)
	}
	return out
}

// escapes counts the flushes slower than over and, of those, the ones
// inside which another writer's flush started and finished.
func escapes(runs [][]flush, over time.Duration) (slow, escaped int) {
	for i, r := range runs {
		for _, s := range r {
			if s.took() <= over {
				continue
			}
			slow++
			for j, o := range runs {
				if j != i && slices.ContainsFunc(o, func(f flush) bool { return !f.start.Before(s.start) && !f.end.After(s.end) }) {
					escaped++
					break
				}
			}
		}
	}
	return slow, escaped
}

func report(name string, lat []time.Duration, d time.Duration) {
	if len(lat) == 0 {
		fmt.Printf("%s: no flushes\n", name)
		return
	}
	slices.Sort(lat)
	at := func(q float64) time.Duration { return lat[int(q*float64(len(lat)-1))].Round(time.Microsecond) }
	over := func(x time.Duration) int {
		i, _ := slices.BinarySearch(lat, x)
		return len(lat) - i
	}
	fmt.Printf("%s: %d flushes in %s: p50 %s p99 %s p99.9 %s max %s; over 10 ms %d, over 50 ms %d\n",
		name, len(lat), d, at(0.5), at(0.99), at(0.999), lat[len(lat)-1].Round(time.Microsecond), over(10*time.Millisecond), over(50*time.Millisecond))
}
