package facts

import (
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/testsupport/fixture"
)

// TestCapture writes testdata/$CORRAL_CAPTURE.txtar from this machine's
// /sys and /proc: the trimmed subset Collect reads. It is how the captured
// fixtures were made:
//
//	CORRAL_CAPTURE=firecracker-vm go test ./agent/facts -run TestCapture
func TestCapture(t *testing.T) {
	name := os.Getenv("CORRAL_CAPTURE")
	if name == "" {
		t.Skip("set CORRAL_CAPTURE=name to capture this machine into testdata/name.txtar")
	}
	c := &capturer{root: "/", seen: map[string]bool{}}
	c.w.Comment("Captured by TestCapture on " + time.Now().UTC().Format("2006-01-02") + " (" + runtime.GOARCH + "); trimmed to what facts.Collect reads.")
	c.files("proc/cpuinfo", "proc/meminfo", "proc/sys/kernel/osrelease")
	c.glob("sys/class/dmi/id/*")
	c.glob("sys/firmware/dmi/tables/*")
	c.files("sys/devices/system/cpu/online", "sys/devices/system/cpu/possible", "sys/devices/system/cpu/present")
	for _, cpu := range c.list("sys/devices/system/cpu/cpu[0-9]*") {
		c.files(cpu+"/online", cpu+"/topology/core_id", cpu+"/topology/physical_package_id",
			cpu+"/topology/die_id", cpu+"/topology/thread_siblings_list", cpu+"/topology/core_cpus_list")
	}
	c.files("sys/devices/system/memory/block_size_bytes")
	c.glob("sys/devices/system/memory/memory*/state")
	for _, b := range c.list("sys/block/*") {
		dir := c.link(b)
		c.files(attrs(dir, "size", "removable", "ro", "dev", "serial", "wwid", "range", "ext_range", "capability",
			"queue/rotational", "queue/logical_block_size", "queue/physical_block_size")...)
		for _, part := range c.list(dir + "/*/partition") {
			p := filepath.Dir(part)
			c.files(attrs(p, "size", "partition", "dev", "start")...)
		}
		if dev := c.link(dir + "/device"); dev != "" {
			c.files(attrs(dev, "model", "vendor", "serial", "wwid", "rev", "firmware_rev", "vpd_pg80", "vpd_pg83", "modalias", "numa_node", "transport")...)
			c.link(dev + "/driver")
			c.link(dev + "/subsystem")
		}
	}
	for _, n := range c.list("sys/class/net/*") {
		dir := c.link(n)
		c.files(attrs(dir, "address", "addr_assign_type", "carrier", "speed", "duplex", "operstate", "mtu", "type", "ifindex")...)
		if dev := c.link(dir + "/device"); dev != "" {
			c.files(attrs(dev, "modalias", "vendor", "device")...)
			c.link(dev + "/driver")
			c.link(dev + "/subsystem")
		}
	}
	for _, p := range c.list("sys/bus/pci/devices/*") {
		dir := c.link(p)
		c.files(attrs(dir, "vendor", "device", "class", "subsystem_vendor", "subsystem_device", "revision", "modalias", "numa_node")...)
		c.link(dir + "/driver")
	}
	out := filepath.Join("testdata", name+".txtar")
	if err := os.WriteFile(out, c.w.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s (%d entries)", out, len(c.seen))
}

type capturer struct {
	root string
	w    fixture.Writer
	seen map[string]bool
}

func attrs(dir string, names ...string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = dir + "/" + n
	}
	return out
}

// list returns the root-relative paths matching pattern, sorted.
func (c *capturer) list(pattern string) []string {
	m, _ := filepath.Glob(filepath.Join(c.root, pattern))
	var out []string
	for _, p := range m {
		rel, _ := filepath.Rel(c.root, p)
		out = append(out, filepath.ToSlash(rel))
	}
	sort.Strings(out)
	return out
}

func (c *capturer) glob(pattern string) { c.files(c.list(pattern)...) }

// files records the readable regular files among rels.
func (c *capturer) files(rels ...string) {
	for _, rel := range rels {
		if c.seen[rel] {
			continue
		}
		fi, err := os.Lstat(filepath.Join(c.root, rel))
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o444 == 0 {
			continue
		}
		b, err := os.ReadFile(filepath.Join(c.root, rel))
		if err != nil || len(b) > 1<<20 {
			continue
		}
		c.seen[rel] = true
		c.w.File(rel, b)
	}
}

// link records the symlink rel (if it is one) and returns the
// root-relative path it resolves to; for a plain directory it returns rel.
// A link to a driver directory also records that directory.
func (c *capturer) link(rel string) string {
	fi, err := os.Lstat(filepath.Join(c.root, rel))
	if err != nil {
		return ""
	}
	if fi.Mode()&os.ModeSymlink == 0 {
		return rel
	}
	target, err := os.Readlink(filepath.Join(c.root, rel))
	if err != nil {
		return ""
	}
	if !c.seen[rel] {
		c.seen[rel] = true
		c.w.Symlink(rel, target)
	}
	resolved := filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(rel), target)))
	if strings.Contains(resolved, "/drivers/") || strings.HasPrefix(resolved, "sys/bus/") || strings.HasPrefix(resolved, "sys/class/") {
		if !c.seen[resolved] {
			c.seen[resolved] = true
			c.w.Dir(resolved)
		}
	}
	return resolved
}
