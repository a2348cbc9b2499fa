package node

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

type capacity struct {
	cpuMilli uint32
	memory   uint64
	storage  uint64
}

// measure reads the node's capacity: CPUs, MemTotal, and the size of the
// filesystem holding the data directory.
func measure(dataDir string) capacity {
	c := capacity{cpuMilli: uint32(runtime.NumCPU()) * 1000}
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
				kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				c.memory = kb * 1024
			}
		}
		f.Close()
	}
	var st unix.Statfs_t
	if unix.Statfs(dataDir, &st) == nil {
		c.storage = st.Blocks * uint64(st.Bsize)
	}
	return c
}
