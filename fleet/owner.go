package fleet

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"sync"

	fleetv1 "github.com/corralhq/corral/api/fleet/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
)

// Owner follows the assignments and answers which machines this appliance
// holds: the per-machine work (power polling, the boot watchdog) asks it
// before touching a machine. Its cache is kept by a store watch and listed
// again whenever the watch ends; it holds at most MaxMachines entries.
//
// Until its first list, an Owner owns nothing (unless Solo).
type Owner struct {
	Store store.Store
	// Self is this appliance's name.
	Self string
	// Solo: this appliance is alone on its store (bbolt) and owns every
	// machine, whatever the assignments say.
	Solo   bool
	Logger *slog.Logger
	// MaxMachines bounds the assignments kept (default
	// DefaultMaxMachines).
	MaxMachines int

	once sync.Once
	m    *mirror[string] // machine -> runner
}

func decodeRunner(b []byte) (string, error) {
	var a fleetv1.Assignment
	if err := record.Unmarshal(b, &a); err != nil {
		return "", err
	}
	return a.GetRunner(), nil
}

func (o *Owner) mirror() *mirror[string] {
	o.once.Do(func() {
		log := o.Logger
		if log == nil {
			log = slog.New(slog.DiscardHandler)
		}
		o.m = newMirror(o.Store, AssignmentPrefix, "assignment", cmp.Or(max(o.MaxMachines, 0), DefaultMaxMachines), log.With("component", "owner"), decodeRunner)
	})
	return o.m
}

// Run follows the assignments until ctx ends, then returns nil. It returns
// an error only when Store is missing. Call it once.
func (o *Owner) Run(ctx context.Context) error {
	if o.Store == nil {
		return errors.New("fleet: Owner.Store is required")
	}
	return o.mirror().run(ctx)
}

// Owns reports whether machine's per-machine work is this appliance's:
// always when Solo, otherwise when the machine's assignment names Self.
// It never blocks on the store; safe for concurrent use.
func (o *Owner) Owns(machine string) bool {
	if o.Solo {
		return true
	}
	it, ok := o.mirror().get(machine)
	return ok && !it.bad && it.v == o.Self
}

// Runner returns the appliance the assignments give machine's per-machine
// work to: Self when Solo; "" and false when none is assigned (or the
// assignment could not be read).
func (o *Owner) Runner(machine string) (string, bool) {
	if o.Solo {
		return o.Self, true
	}
	it, ok := o.mirror().get(machine)
	if !ok || it.bad {
		return "", false
	}
	return it.v, true
}

// Count returns how many machines the assignments give this appliance (the
// runner's load).
func (o *Owner) Count() int {
	return o.mirror().count(func(runner string) bool { return runner == o.Self })
}

// Synced reports whether the first list of assignments has been applied.
func (o *Owner) Synced() bool { return o.mirror().isSynced() }
