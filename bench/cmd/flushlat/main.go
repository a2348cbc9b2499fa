// Command flushlat measures the disk's flush latency as corrald's journal
// sees it: it appends a record (-size bytes, default 600, about one lease)
// to a file in -dir and fdatasyncs it, -gap apart, for -d, and prints the
// percentiles and the count of flushes over 10 and 50 ms. A server that
// makes each lease durable before its ACK cannot answer faster than this:
// one 300 ms flush holds every ACK that arrives meanwhile (at 4,000
// leases/s, 1,200 of them, three times the 1 % of a 10 s run). It prints
// figures; it asserts nothing. See bench/README.md (DHCP, fifth session).
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	dir := flag.String("dir", os.TempDir(), "directory of the file (the filesystem under test)")
	d := flag.Duration("d", 10*time.Second, "how long to run")
	gap := flag.Duration("gap", 250*time.Microsecond, "pause between flushes")
	size := flag.Int("size", 600, "bytes appended before each flush")
	flag.Parse()
	f, err := os.CreateTemp(*dir, "flushlat-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	rec := make([]byte, *size)
	var lat []time.Duration
	for end := time.Now().Add(*d); time.Now().Before(end); {
		t := time.Now()
		if _, err := f.Write(rec); err != nil {
			log.Fatal(err)
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			log.Fatal(err)
		}
		lat = append(lat, time.Since(t))
		time.Sleep(*gap)
	}
	slices.Sort(lat)
	at := func(q float64) time.Duration { return lat[int(q*float64(len(lat)-1))].Round(time.Microsecond) }
	over := func(x time.Duration) int {
		return len(lat) - func() int { i, _ := slices.BinarySearch(lat, x); return i }()
	}
	fmt.Printf("%s: %d flushes in %s: p50 %s p99 %s p99.9 %s max %s; over 10 ms %d, over 50 ms %d\n",
		*dir, len(lat), *d, at(0.5), at(0.99), at(0.999), lat[len(lat)-1].Round(time.Microsecond), over(10*time.Millisecond), over(50*time.Millisecond))
}
