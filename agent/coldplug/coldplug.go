// Package coldplug loads kernel modules for the devices present at boot,
// as udev would, in a discovery image that has no udev: it reads every
// modalias under sys/devices, resolves it through modules.alias (glob
// patterns, as modprobe does) and loads the modules through u-root's
// kmodule (dependencies from modules.dep), repeating while new devices
// appear (a bus driver such as virtio_pci creates the devices its
// children bind to). On the running system it learns of those devices
// from the kernel's uevents (their MODALIAS) instead of walking sysfs
// again. Boot stages wait for the device they need (Watch), not for the
// whole coldplug. It must not import store/, boot/ or ipmi/.
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
	// new devices to appear; the next round starts as soon as one does.
	// With uevents (default 300 ms) every device the kernel adds in the
	// meantime (an asynchronous disk scan still running) extends it, up
	// to four times; polling sysfs (default 500 ms) it is fixed.
	Settle    time.Duration
	MaxRounds int // default 10
	// Parallel bounds the modules loaded at once (default 4).
	Parallel int
	// Events are the kernel's device events. Nil means the uevent socket
	// (ListenUevents) when Root is "/", else (or when it cannot be
	// opened) sysfs is walked again after every round.
	Events Events
	// Watch, when set, is signalled after every round's loads and when
	// Run returns.
	Watch *Watch
	// Hold, when set, names modules a device needs that Run must not
	// load: they are reported in Result.Held for the caller to load
	// later (the hypervisor boot holds the kvm modules back until the
	// node has registered).
	Hold   func(module string) bool
	Logger *slog.Logger
}

// Events is a source of kernel device events.
type Events interface {
	// Next returns the next event, ErrNoEvent once deadline passes
	// without one, or ErrOverflow when events were lost.
	Next(deadline time.Time) (Uevent, error)
	Close() error
}

// ErrNoEvent means no event before the deadline.
var ErrNoEvent = errors.New("no uevent before the deadline")

// ErrOverflow means the kernel dropped events (the socket's queue was full).
var ErrOverflow = errors.New("uevents lost: queue overflow")

// Uevent is one kernel device event.
type Uevent struct {
	Action   string // add, remove, bind, change, ...
	DevPath  string // under /sys
	Modalias string // "" when the device has none
}

// ParseUevent reads a kernel uevent message: "ACTION@DEVPATH" and
// KEY=VALUE fields, NUL-separated. ok is false for anything else (udev's
// "libudev" messages, a truncated header).
func ParseUevent(b []byte) (Uevent, bool) {
	fields := strings.Split(string(b), "\x00")
	action, devpath, ok := strings.Cut(fields[0], "@")
	if !ok || action == "" || devpath == "" {
		return Uevent{}, false
	}
	ev := Uevent{Action: action, DevPath: devpath}
	for _, f := range fields[1:] {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			continue
		}
		switch k {
		case "ACTION":
			ev.Action = v
		case "DEVPATH":
			ev.DevPath = v
		case "MODALIAS":
			ev.Modalias = v
		}
	}
	return ev, true
}

// Watch lets boot stages wait for the device they need (the boot NIC,
// the data disk) rather than for the whole coldplug, whose last wait for
// late devices they then overlap. The zero value is not usable: use
// NewWatch. A nil *Watch is finished from the start.
type Watch struct {
	mu   sync.Mutex
	tick chan struct{} // closed and replaced at every signal
	done bool
}

// NewWatch returns a Watch for one Run.
func NewWatch() *Watch { return &Watch{tick: make(chan struct{})} }

// Signal tells waiters to look again: Run calls it after every round's
// loads (a fake coldplug in tests does too).
func (w *Watch) Signal() { w.signal(false) }

func (w *Watch) signal(final bool) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return
	}
	close(w.tick)
	w.tick = make(chan struct{})
	if final {
		w.done = true
		close(w.tick)
	}
}

// Finish marks coldplug as over (Run does; a caller that does not run it
// calls Finish so waiters go on). It is idempotent.
func (w *Watch) Finish() { w.signal(true) }

// Wait returns nil once ready reports true or coldplug has finished
// (ready may then still be false: the caller goes on and reports what is
// missing), or ctx's error. ready is called at once and after every
// round; it must be cheap and safe to call from any goroutine.
func (w *Watch) Wait(ctx context.Context, ready func() bool) error {
	for {
		if w == nil {
			return ctx.Err()
		}
		w.mu.Lock()
		tick, done := w.tick, w.done
		w.mu.Unlock()
		if ready() || done {
			return nil
		}
		select {
		case <-tick:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Result reports what Run did.
type Result struct {
	Rounds int
	Loaded []string          // modules loaded, in order
	Failed map[string]string // module → error
	Held   []string          // modules Config.Hold kept back, in order
}

// hold reports whether cfg.Hold keeps mod back, recording and logging it.
func hold(cfg Config, log *slog.Logger, res *Result, mod, modalias string) bool {
	if cfg.Hold == nil || !cfg.Hold(mod) {
		return false
	}
	res.Held = append(res.Held, mod)
	log.Info("module held back", "module", mod, "modalias", modalias)
	return true
}

// Run loads modules until a round finds no modalias it has not tried, or
// MaxRounds is reached, or ctx ends (then it returns ctx.Err() with what it
// did so far). A module that fails to load is recorded and not retried.
func Run(ctx context.Context, cfg Config) (Result, error) {
	defer cfg.Watch.Finish()
	res := Result{Failed: map[string]string{}}
	if cfg.Loader == nil {
		return res, errors.New("coldplug: Loader is required")
	}
	if cfg.Root == "" {
		cfg.Root = "/"
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
	start := time.Now()
	// Listen before the first scan: a device added after it is announced.
	events := cfg.Events
	if events == nil && cfg.Root == "/" {
		ev, err := ListenUevents()
		if err != nil {
			log.Warn("uevents unavailable: polling sysfs", "err", err)
		} else {
			events = ev
		}
	}
	if events != nil {
		defer events.Close()
	}
	if cfg.Settle <= 0 {
		cfg.Settle = 500 * time.Millisecond
		if events != nil {
			cfg.Settle = 300 * time.Millisecond
		}
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
	parsed := time.Now()
	fresh, err := scan()
	if err != nil {
		return res, err
	}
	log.Info("coldplug started", "aliases_ms", ms(parsed.Sub(start)), "scan_ms", ms(time.Since(parsed)), "modaliases", len(fresh))
	if events != nil {
		err := pipeline(ctx, cfg, log, events, aliases, seenAlias, scan, fresh, &res)
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
					if !hold(cfg, log, &res, mod, m) {
						jobs = append(jobs, job{mod, m})
					}
				}
			}
		}
		errs := make([]error, len(jobs))
		took := make([]time.Duration, len(jobs))
		roundStart := time.Now()
		var wg sync.WaitGroup
		sem := make(chan struct{}, cfg.Parallel)
		for i, j := range jobs {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				t := time.Now()
				errs[i] = cfg.Loader.Load(j.mod)
				took[i] = time.Since(t)
			}()
		}
		wg.Wait()
		loaded := 0
		for i, j := range jobs {
			if errs[i] != nil {
				res.Failed[j.mod] = errs[i].Error()
				log.Warn("module load failed", "module", j.mod, "modalias", j.alias, "took_ms", ms(took[i]), "err", errs[i])
				continue
			}
			loaded++
			res.Loaded = append(res.Loaded, j.mod)
			log.Info("module loaded", "module", j.mod, "modalias", j.alias, "took_ms", ms(took[i]))
		}
		loadedAt := time.Now()
		cfg.Watch.Signal()
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
		log.Info("coldplug round", "round", res.Rounds, "modules", len(jobs), "load_ms", ms(loadedAt.Sub(roundStart)),
			"wait_ms", ms(time.Since(loadedAt)), "new_modaliases", len(fresh))
	}
	return res, nil
}

// ms is d in milliseconds, for log lines.
func ms(d time.Duration) int64 { return d.Milliseconds() }

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
		// An unreadable modalias is skipped like an unreadable subtree.
		if b, err := os.ReadFile(p); err == nil {
			if m := strings.TrimSpace(string(b)); m != "" {
				set[m] = true
			}
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
