package erase

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
)

// Progress steps, as api/node/v1 ErasePlan documents them.
const (
	StepErase  = "erase"
	StepErased = "erased"
)

// Errors Erase wraps.
var (
	// ErrRefused: a disk may not be erased, or not at this level (the
	// message says why).
	ErrRefused = errors.New("erase refused")
	// ErrNotZero: a region read back non-zero after the erase.
	ErrNotZero = errors.New("read back non-zero")
)

// refusal is an ErrRefused whose message is the disk and the reason
// ("/dev/sda: the ATA security feature set is frozen").
type refusal struct{ msg string }

func (r *refusal) Error() string        { return r.msg }
func (r *refusal) Is(target error) bool { return target == ErrRefused }

func refuse(format string, args ...any) error {
	return &refusal{msg: fmt.Sprintf(format, args...)}
}

// Config configures an Eraser.
type Config struct {
	// Logger receives a line per disk and every NVMe and ATA command sent
	// with the device's answer; nil discards.
	Logger *slog.Logger
	// Console receives the same in words for whoever watches the
	// machine's screen; nil discards.
	Console io.Writer
	// Root is where dev/, sys/ and proc/ are read ("" means "/").
	Root string
	// ProgressEvery is the least time between two progress reports during
	// long work on one disk; 2 s when zero.
	ProgressEvery time.Duration
	// Samples is how many random 4 KiB blocks full and secure read back,
	// besides the first and last MiB; 64 when zero.
	Samples int

	sys system // tests replace the kernel
}

// Eraser carries out erase plans. Its methods may be called from several
// goroutines; plans run one at a time.
type Eraser struct {
	cfg Config
	mu  sync.Mutex
}

// New returns an Eraser with cfg's defaults filled in.
func New(cfg Config) *Eraser {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Console == nil {
		cfg.Console = io.Discard
	}
	if cfg.Root == "" {
		cfg.Root = "/"
	}
	if cfg.ProgressEvery <= 0 {
		cfg.ProgressEvery = 2 * time.Second
	}
	if cfg.Samples <= 0 {
		cfg.Samples = 64
	}
	if cfg.sys == nil {
		cfg.sys = kernel{root: cfg.Root}
	}
	return &Eraser{cfg: cfg}
}

// Erase erases every disk of plan at plan's level, in order, and reports
// on progress (never nil): Progress{step "erase", detail "<disk>: <how>
// (<N> of <M>)"} as each disk starts and ends and at most every
// ProgressEvery during long work, then Progress{step "erased", done} or
// Progress{step "erase", done, error}. Every Progress carries the plan's
// erase_id in install_id. It checks every disk before it writes to any,
// stops at the first disk that fails, and its error names the disks erased
// before it. It blocks until done or ctx ends (between chunks of work;
// an NVMe format or ATA erase in flight is not interrupted).
func (e *Eraser) Erase(ctx context.Context, plan *nodev1.ErasePlan, progress func(*nodev1.Progress)) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	cfg := e.cfg
	id := plan.GetEraseId()
	level := plan.GetLevel()
	log := cfg.Logger.With("erase", id)
	fail := func(err error) error {
		log.Error("erase failed", "err", err)
		fmt.Fprintf(cfg.Console, "corral: erase failed: %v\n", err)
		progress(&nodev1.Progress{Step: StepErase, Done: true, Error: err.Error(), InstallId: id})
		return err
	}
	var how string
	switch level {
	case inventoryv1.EraseLevel_ERASE_LEVEL_QUICK:
		how = "quick"
	case inventoryv1.EraseLevel_ERASE_LEVEL_FULL:
		how = "full"
	case inventoryv1.EraseLevel_ERASE_LEVEL_SECURE:
		how = "secure"
	case inventoryv1.EraseLevel_ERASE_LEVEL_NONE:
		log.Info("erase level none: nothing erased")
		progress(&nodev1.Progress{Step: StepErased, Detail: "level none: nothing erased", Done: true, InstallId: id})
		return nil
	default:
		return fail(fmt.Errorf("%w: erase level %v is not one the agent carries out (quick, full, secure or none)", ErrRefused, level))
	}

	// Every disk is checked before any is written: a plan with one bad
	// name erases nothing.
	disks := make([]disk, 0, len(plan.GetDisks()))
	for _, p := range plan.GetDisks() {
		d, err := cfg.sys.disk(p)
		if err != nil {
			return fail(err)
		}
		for _, o := range disks {
			if o.name == d.name {
				return fail(refuse("%s: named twice in the plan", d.show()))
			}
		}
		if level == inventoryv1.EraseLevel_ERASE_LEVEL_SECURE && d.kind == kindOther {
			return fail(fmt.Errorf("erase %s: %w (no disk erased)", d.show(), noSecureErase(d)))
		}
		disks = append(disks, d)
	}
	if len(disks) == 0 {
		log.Warn("erase plan names no disks")
		progress(&nodev1.Progress{Step: StepErased, Detail: "no disks to erase", Done: true, InstallId: id})
		return nil
	}

	var erased []string
	for i, d := range disks {
		n := fmt.Sprintf("(%d of %d)", i+1, len(disks))
		report := func(what string) {
			detail := fmt.Sprintf("%s: %s %s", d.show(), what, n)
			fmt.Fprintf(cfg.Console, "corral: %s\n", detail)
			progress(&nodev1.Progress{Step: StepErase, Detail: detail, InstallId: id})
		}
		report(how + " erase of " + humanSize(d.size))
		start := time.Now()
		what, err := e.eraseDisk(ctx, log.With("disk", d.name), level, d, report)
		if err != nil {
			before := "no disk erased before it"
			if len(erased) > 0 {
				before = "erased before it: " + strings.Join(erased, ", ")
			}
			return fail(fmt.Errorf("erase %s: %w (%s)", d.show(), err, before))
		}
		log.Info("disk erased", "disk", d.name, "level", how, "how", what, "bytes", d.size, "seconds", time.Since(start).Seconds())
		report(what)
		erased = append(erased, d.show())
	}
	log.Info("erased", "disks", strings.Join(erased, ","), "level", how)
	fmt.Fprintf(cfg.Console, "corral: erased %s (%s)\n", strings.Join(erased, ", "), how)
	progress(&nodev1.Progress{Step: StepErased, Detail: fmt.Sprintf("%s erase of %s", how, strings.Join(erased, ", ")), Done: true, InstallId: id})
	return nil
}

// eraseDisk erases d at level and says how, in words.
func (e *Eraser) eraseDisk(ctx context.Context, log *slog.Logger, level inventoryv1.EraseLevel, d disk, report func(string)) (string, error) {
	dev, err := e.cfg.sys.open(d)
	if err != nil {
		return "", err
	}
	defer dev.Close()
	w := &work{cfg: &e.cfg, log: log, d: d, dev: dev, report: report}
	switch level {
	case inventoryv1.EraseLevel_ERASE_LEVEL_QUICK:
		return w.quick(ctx)
	case inventoryv1.EraseLevel_ERASE_LEVEL_FULL:
		return w.full(ctx, d.discard)
	default:
		return w.secure(ctx)
	}
}

// noSecureErase refuses secure on a disk with no erase of its own.
func noSecureErase(d disk) error {
	return refuse("%s has no secure erase of its own; use --erase full", d.show())
}

// work is one disk's erase.
type work struct {
	cfg    *Config
	log    *slog.Logger
	d      disk
	dev    device
	report func(string)
	last   time.Time // last progress report during long work
}

// tick reports what at most every ProgressEvery.
func (w *work) tick(what string) {
	if now := time.Now(); now.Sub(w.last) >= w.cfg.ProgressEvery {
		w.last = now
		w.report(what)
	}
}

const (
	kib = int64(1) << 10
	mib = int64(1) << 20
	gib = int64(1) << 30
)

// humanSize is "512 MiB", "1.5 GiB", "2 TiB".
func humanSize(n int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}
	f, u := float64(n), 0
	for f >= 1024 && u < len(units)-1 {
		f /= 1024
		u++
	}
	if f == float64(int64(f)) {
		return fmt.Sprintf("%d %s", int64(f), units[u])
	}
	return fmt.Sprintf("%.1f %s", f, units[u])
}
