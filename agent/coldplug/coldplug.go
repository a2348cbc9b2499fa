// Package coldplug loads kernel modules for the devices present at boot,
// as udev would, in a discovery image that has no udev: it reads every
// modalias under sys/devices, resolves it through modules.alias (glob
// patterns, as modprobe does) and loads the modules through u-root's
// kmodule (dependencies from modules.dep), repeating while new devices
// appear (a bus driver such as virtio_pci creates the devices its
// children bind to). It must not import store/, boot/ or ipmi/.
package coldplug

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// Loader loads one module by name, with its dependencies. Loading a
// module that is already loaded must succeed.
//
// Run calls Load from several goroutines at once.
type Loader interface {
	Load(name string) error
}

// Config configures Run.
type Config struct {
	Root       string // "" means "/"; sys/devices is read under it
	ModulesDir string // holds modules.alias; "" means Root/lib/modules/$(uname -r)
	Loader     Loader // required
	// Settle is how long to wait after a round that loaded modules for
	// new devices to appear (default 500 ms); the next round starts as
	// soon as one does.
	Settle    time.Duration
	MaxRounds int // default 10
	// Parallel bounds the modules loaded at once (default 4).
	Parallel int
	Logger   *slog.Logger
}

// Result reports what Run did.
type Result struct {
	Rounds int
	Loaded []string          // modules loaded, in order
	Failed map[string]string // module → error
}

// Run loads modules until a round finds no modalias it has not tried, or
// MaxRounds is reached, or ctx ends (then it returns ctx.Err() with what it
// did so far). A module that fails to load is recorded and not retried.
func Run(ctx context.Context, cfg Config) (Result, error) {
	res := Result{Failed: map[string]string{}}
	if cfg.Loader == nil {
		return res, errors.New("coldplug: Loader is required")
	}
	if cfg.Root == "" {
		cfg.Root = "/"
	}
	if cfg.Settle <= 0 {
		cfg.Settle = 500 * time.Millisecond
	}
	if cfg.MaxRounds <= 0 {
		cfg.MaxRounds = 10
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = 4
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f, err := os.Open(filepath.Join(cfg.ModulesDir, "modules.alias"))
	if err != nil {
		return res, fmt.Errorf("coldplug: %w", err)
	}
	aliases, err := ParseAliases(f)
	f.Close()
	if err != nil {
		return res, fmt.Errorf("coldplug: %w", err)
	}
	seenAlias := map[string]bool{}
	tried := map[string]bool{}
	// scan returns the modaliases not seen before.
	scan := func() ([]string, error) {
		mods, err := Modaliases(filepath.Join(cfg.Root, "sys/devices"))
		if err != nil {
			return nil, fmt.Errorf("coldplug: %w", err)
		}
		var fresh []string
		for _, m := range mods {
			if !seenAlias[m] {
				seenAlias[m] = true
				fresh = append(fresh, m)
			}
		}
		return fresh, nil
	}
	fresh, err := scan()
	if err != nil {
		return res, err
	}
	for len(fresh) > 0 && res.Rounds < cfg.MaxRounds {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		res.Rounds++
		// A round's modules load in parallel (as udev does): each
		// driver's init (probing its devices) is most of the time, and
		// the kernel makes a second load of a shared dependency wait for
		// the first. Results are recorded in modalias order.
		type job struct{ mod, alias string }
		var jobs []job
		for _, m := range fresh {
			for _, mod := range aliases.Match(m) {
				if !tried[mod] {
					tried[mod] = true
					jobs = append(jobs, job{mod, m})
				}
			}
		}
		errs := make([]error, len(jobs))
		var wg sync.WaitGroup
		sem := make(chan struct{}, cfg.Parallel)
		for i, j := range jobs {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				errs[i] = cfg.Loader.Load(j.mod)
			}()
		}
		wg.Wait()
		loaded := 0
		for i, j := range jobs {
			if errs[i] != nil {
				res.Failed[j.mod] = errs[i].Error()
				log.Warn("module load failed", "module", j.mod, "modalias", j.alias, "err", errs[i])
				continue
			}
			loaded++
			res.Loaded = append(res.Loaded, j.mod)
			log.Info("module loaded", "module", j.mod, "modalias", j.alias)
		}
		if loaded == 0 {
			break
		}
		// New devices (a bus driver's children) mostly exist when
		// init_module returns: look at once, then every Settle/5 until
		// Settle has passed without any.
		deadline := time.Now().Add(cfg.Settle)
		for {
			if fresh, err = scan(); err != nil || len(fresh) > 0 {
				break
			}
			left := time.Until(deadline)
			if left <= 0 {
				break
			}
			select {
			case <-ctx.Done():
				return res, ctx.Err()
			case <-time.After(min(left, cfg.Settle/5)):
			}
		}
		if err != nil {
			return res, err
		}
	}
	return res, nil
}

// Aliases is a parsed modules.alias, indexed by the bus prefix before ':'.
type Aliases map[string][]alias

type alias struct{ pattern, module string }

// ParseAliases reads "alias PATTERN MODULE" lines; other lines are
// ignored.
func ParseAliases(r io.Reader) (Aliases, error) {
	a := Aliases{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 3 || fields[0] != "alias" {
			continue
		}
		bus, _, _ := strings.Cut(fields[1], ":")
		a[bus] = append(a[bus], alias{pattern: fields[1], module: fields[2]})
	}
	return a, sc.Err()
}

// Match returns the modules whose patterns match modalias, sorted and
// without duplicates.
func (a Aliases) Match(modalias string) []string {
	bus, _, _ := strings.Cut(modalias, ":")
	set := map[string]bool{}
	for _, al := range a[bus] {
		if ok, err := path.Match(al.pattern, modalias); ok && err == nil {
			set[al.module] = true
		}
	}
	out := make([]string, 0, len(set))
	for m := range set {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// Modaliases returns the distinct contents of the modalias files under
// dir (normally /sys/devices), sorted. Symlinks are not followed.
func Modaliases(dir string) ([]string, error) {
	set := map[string]bool{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == dir {
				return err
			}
			return nil // unreadable subtree: skip
		}
		if d.Name() != "modalias" || !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		if m := strings.TrimSpace(string(b)); m != "" {
			set[m] = true
		}
		return nil
	})
	out := make([]string, 0, len(set))
	for m := range set {
		out = append(out, m)
	}
	sort.Strings(out)
	return out, err
}
