// Command httpload fetches one URL with N concurrent clients for a while
// and prints MB/s. It prints figures and asserts nothing. See
// bench/README.md.
package main

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	url := flag.String("url", "", "URL to fetch")
	clients := flag.Int("clients", 16, "concurrent clients")
	dur := flag.Duration("duration", 10*time.Second, "keep fetching this long")
	flag.Parse()
	tr := &http.Transport{MaxIdleConnsPerHost: *clients, DisableCompression: true}
	cl := &http.Client{Transport: tr}
	var bytes, files, errs atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range *clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < *dur {
				resp, err := cl.Get(*url)
				if err != nil {
					errs.Add(1)
					continue
				}
				n, err := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				bytes.Add(n)
				if err != nil || resp.StatusCode != http.StatusOK {
					errs.Add(1)
					continue
				}
				files.Add(1)
			}
		}()
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	fmt.Printf("clients %d: %.1f MB/s, %d files, %d errors\n", *clients, float64(bytes.Load())/el/1e6, files.Load(), errs.Load())
	if files.Load() == 0 {
		os.Exit(1)
	}
}
