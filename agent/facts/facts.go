package facts

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/jaypipes/ghw"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
)

// Options configure Collect.
type Options struct {
	// Root is the directory holding sys/, proc/ and usr/share; "" means "/".
	Root string
	// PCIIDs is the pci.ids file used to name PCI devices. "" searches
	// usr/share/misc/pci.ids and usr/share/hwdata/pci.ids under Root;
	// without one, devices carry IDs only.
	PCIIDs string
	// Logger receives one line per section that could not be read; nil
	// discards.
	Logger *slog.Logger
}

func (o Options) root() string {
	if o.Root == "" {
		return "/"
	}
	return o.Root
}

// path joins elements under the root.
// live reports whether o reads the running machine ("" or "/", as the
// discovery agent passes it) rather than a captured fixture root.
func (o Options) live() bool {
	return o.Root == "" || filepath.Clean(o.Root) == "/"
}

func (o Options) path(elem ...string) string {
	return filepath.Join(append([]string{o.root()}, elem...)...)
}

// ghwOpts are the ghw options every section uses: the root as chroot, no
// external tools, no warnings on stderr.
func (o Options) ghwOpts() []any {
	return []any{ghw.WithChroot(o.root()), ghw.WithDisableTools(), ghw.WithDisableWarnings()}
}

// Collect reads the facts of the machine whose files are under opts.Root.
// It reads only files, never blocks on the network, and returns non-nil
// Facts capped by Cap even when some sections fail; the error then joins
// one error per failed section. It returns ctx.Err() if ctx ends first
// (checked between sections).
func Collect(ctx context.Context, opts Options) (*inventoryv1.Facts, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := &inventoryv1.Facts{}
	var errs []error
	sections := []struct {
		name string
		fn   func() error
	}{
		{"dmi", func() error { return collectDMI(opts, f) }},
		{"cpu", func() error { return collectCPU(opts, f) }},
		{"memory", func() error { return collectMemory(opts, f) }},
		{"disks", func() error { return collectDisks(opts, f) }},
		{"nics", func() error { return collectNICs(opts, f) }},
		{"pci", func() error { return collectPCI(opts, f) }},
		{"secure_boot", func() error { return collectSecureBoot(opts, f) }},
		{"kernel", func() error {
			b, err := os.ReadFile(opts.path("proc/sys/kernel/osrelease"))
			f.Kernel = strings.TrimSpace(string(b))
			if opts.live() {
				// The live machine's: the agent runs as its
				// architecture (a captured fixture root has none).
				f.Architecture = runtime.GOARCH
			}
			return err
		}},
	}
	// Each section's time is logged: under emulation facts are a visible
	// part of power-on → INVENTORIED (bench/README.md, "Virtual rack").
	start := time.Now()
	took := make([]any, 0, 2*len(sections)+2)
	for _, s := range sections {
		if err := ctx.Err(); err != nil {
			return Cap(f), err
		}
		t := time.Now()
		if err := s.fn(); err != nil {
			log.Warn("facts section incomplete", "section", s.name, "err", err)
			errs = append(errs, fmt.Errorf("%s: %w", s.name, err))
		}
		took = append(took, s.name+"_ms", time.Since(t).Milliseconds())
	}
	log.Info("facts collected", append(took, "took_ms", time.Since(start).Milliseconds())...)
	return Cap(f), errors.Join(errs...)
}

// clean turns ghw's "unknown" and sysfs padding into "".
func clean(s string) string {
	s = strings.TrimSpace(strings.Trim(s, "\x00"))
	if s == "unknown" {
		return ""
	}
	return s
}

// readAttr returns the trimmed content of a sysfs attribute, "" if absent.
func readAttr(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return clean(string(b))
}
