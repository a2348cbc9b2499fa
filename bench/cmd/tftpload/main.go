// Command tftpload fetches one file over TFTP with N concurrent clients
// (github.com/pin/tftp/v3's client, the same for every server) and prints
// MB/s. It prints figures and asserts nothing. See bench/README.md.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pin/tftp/v3"
)

func main() {
	server := flag.String("server", "", "host:port")
	file := flag.String("file", "", "file name")
	clients := flag.Int("clients", 1, "concurrent clients")
	blksize := flag.Int("blksize", 512, "block size option (512 = none)")
	dur := flag.Duration("duration", 10*time.Second, "keep fetching this long")
	flag.Parse()
	var bytes, files, errs atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range *clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < *dur {
				c, err := tftp.NewClient(*server)
				if err != nil {
					errs.Add(1)
					return
				}
				c.SetTimeout(2 * time.Second)
				if *blksize != 512 {
					c.SetBlockSize(*blksize)
				}
				wt, err := c.Receive(*file, "octet")
				if err != nil {
					errs.Add(1)
					continue
				}
				n, err := wt.WriteTo(io.Discard)
				bytes.Add(n)
				if err != nil {
					errs.Add(1)
					continue
				}
				files.Add(1)
			}
		}()
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	fmt.Printf("clients %d blksize %d file %s: %.2f MB/s, %d files, %d errors, %d blocks\n", *clients, *blksize, *file,
		float64(bytes.Load())/el/1e6, files.Load(), errs.Load(), bytes.Load()/int64(*blksize))
	if files.Load() == 0 {
		os.Exit(1)
	}
}
