package inventory

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/internal/lograte"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Store key prefixes.
const (
	machinePrefix  = store.MachinesPrefix
	macPrefix      = store.MACsPrefix
	timelinePrefix = store.TimelinePrefix
)

// Config configures an Inventory. Zero values take the defaults.
type Config struct {
	Store  store.Store
	Logger *slog.Logger
	// TimelineLimit is how many entries are kept per MAC (default 2000).
	TimelineLimit int
	// TimelineQueue is how many entries may wait to be written before
	// Record starts dropping (default DefaultTimelineQueue, 65,536, and
	// never more than 64 MB of them); drops are counted and logged.
	TimelineQueue int
	// TimelineMaxEntries bounds the entries of all MACs together (default
	// 1,000,000; at least TimelineLimit): past it the timelines of the MACs
	// written to least recently are deleted. TimelineDetailBytes,
	// TimelineAttrs and TimelineAttrBytes cap each entry (defaults 4096,
	// 16, 256). See the inventory/timeline package.
	TimelineMaxEntries, TimelineDetailBytes, TimelineAttrs, TimelineAttrBytes int
	// TimelineBootLAN bounds the entries of the boot LAN's unauthenticated
	// requests apart from the rest (timeline.go).
	TimelineBootLAN TimelineBootLAN
	// Now is the clock (default time.Now).
	Now func() time.Time
	// MaxDiscovered caps the placeholder machines EnsureMachineForMAC
	// creates for unknown MACs (placeholders.go): at the cap it creates
	// none and fails with ErrDiscoveredCap. 0 means DefaultMaxDiscovered,
	// negative no cap.
	MaxDiscovered int
	// MaxUnaccepted caps the machines registered and not accepted
	// (INVENTORIED or parked in CONFLICT): at the cap, a report that would
	// make a new machine is refused with ErrUnacceptedCap. 0 means
	// MaxDiscovered's value, negative no cap.
	MaxUnaccepted int
	// FactCaps cap a report and a machine's fact history (zero fields:
	// DefaultFactCaps). ReportRefused, when set, hears of each report
	// CheckReport or the unaccepted cap refuses, with one of
	// RefusalReasons (a metrics counter).
	FactCaps      FactCaps
	ReportRefused func(reason string)
	// Warm, when set, says whether a machine is booted and waiting (its
	// discovery agent connected: a standby pool's booted machine). An
	// allocation takes warm machines first, so a booted pool gives its
	// instant deploy; it asks about at most warmScan candidates.
	Warm func(machine string) bool
	// LLDPLabels, when set, makes every landed report set the machine's
	// switch labels (LabelSwitch, LabelSwitchPort, LabelSwitchVLAN) from
	// the LLDP neighbour its agent heard (lldp.go); off, LLDP neighbours
	// are facts only.
	LLDPLabels bool
}

// Inventory keeps machines and their timelines. Its methods are safe for
// concurrent use; Run must be running for Record to persist entries.
type Inventory struct {
	cfg Config
	log *slog.Logger
	tl  *timeline
	ph  placeholders
	// refusals bounds the log lines of refused reports (a flood of forged
	// reports is not a flood of log lines); each refusal is on the
	// machine's timeline anyway, which inventory bounds.
	refusals *lograte.Gate
	// deleteMu guards onDelete (OnDelete).
	deleteMu sync.Mutex
	onDelete []func(context.Context, *inventoryv1.Machine)
}

// New validates cfg and returns an Inventory.
func New(cfg Config) (*Inventory, error) {
	if cfg.Store == nil {
		return nil, errors.New("inventory: Config.Store is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.TimelineLimit <= 0 {
		cfg.TimelineLimit = 2000
	}
	if cfg.TimelineQueue <= 0 {
		cfg.TimelineQueue = DefaultTimelineQueue
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.FactCaps = cfg.FactCaps.withDefaults()
	if cfg.MaxDiscovered == 0 {
		cfg.MaxDiscovered = DefaultMaxDiscovered
	}
	if cfg.MaxUnaccepted == 0 {
		cfg.MaxUnaccepted = cfg.MaxDiscovered
	}
	inv := &Inventory{cfg: cfg, log: cfg.Logger, refusals: lograte.NewGate(time.Second, 10)}
	inv.ph.max, inv.ph.umax = cfg.MaxDiscovered, cfg.MaxUnaccepted
	inv.tl = newTimeline(inv)
	return inv, nil
}

// Run writes timeline entries until ctx ends, then flushes what is queued.
func (i *Inventory) Run(ctx context.Context) error { return i.tl.run(ctx) }

var nameRE = regexp.MustCompile(`^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,126}[A-Za-z0-9])?$`)

// validName says whether name is a well-formed machine name (CheckName).
func validName(name string) bool { return nameRE.MatchString(name) }

// CheckName validates a machine name (letters, digits, '.', '_', '-').
func CheckName(name string) error {
	if name == "" {
		return apierr.Invalidf("machine name is required")
	}
	if !nameRE.MatchString(name) {
		return apierr.Invalidf("machine name %q is malformed: use 1-128 letters, digits, '.', '_' or '-', starting and ending with a letter or digit", name)
	}
	return nil
}

// NormalizeMAC parses a 6-byte MAC in any common notation and returns it
// lower-case and colon-separated.
func NormalizeMAC(s string) (string, error) {
	hw, err := net.ParseMAC(strings.TrimSpace(s))
	if err != nil || len(hw) != 6 {
		return "", apierr.Invalidf("%q is not a 6-byte MAC address", s)
	}
	return hw.String(), nil
}

// MachineNameForMAC is the name given to a machine first seen by MAC.
func MachineNameForMAC(mac string) string {
	return "m-" + strings.ReplaceAll(mac, ":", "")
}

func newMachine() *inventoryv1.Machine { return &inventoryv1.Machine{} }

// GetMachine returns one machine.
func (i *Inventory) GetMachine(ctx context.Context, name string) (*inventoryv1.Machine, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	m := newMachine()
	if _, err := record.Get(ctx, i.cfg.Store, machinePrefix+name, m); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, apierr.NotFoundf("machine %q", name)
		}
		return nil, err
	}
	return m, nil
}

// ListMachines returns every machine in name order matching the filter's
// state, serial, MAC and selectors (unset fields match everything), in
// its view; page fields and order are ignored (ListMachinesPage serves
// pages, EachMachine scans without holding every record).
func (i *Inventory) ListMachines(ctx context.Context, f *inventoryv1.ListMachinesRequest) ([]*inventoryv1.Machine, error) {
	out := []*inventoryv1.Machine{}
	err := i.EachMachine(ctx, f, func(m *inventoryv1.Machine) error {
		out = append(out, m)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func hasMAC(m *inventoryv1.Machine, mac string) bool {
	return m.GetBootMac() == mac || slices.Contains(m.GetMacs(), mac)
}

// MachineByMAC returns the machine that owns mac, or apierr.ErrNotFound.
func (i *Inventory) MachineByMAC(ctx context.Context, mac string) (*inventoryv1.Machine, error) {
	mac, err := NormalizeMAC(mac)
	if err != nil {
		return nil, err
	}
	var b inventoryv1.MacBinding
	if _, err := record.Get(ctx, i.cfg.Store, macPrefix+mac, &b); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, apierr.NotFoundf("no machine has MAC %s", mac)
		}
		return nil, err
	}
	m, err := i.GetMachine(ctx, b.GetMachineName())
	if errors.Is(err, apierr.ErrNotFound) {
		return nil, apierr.NotFoundf("no machine has MAC %s", mac)
	}
	return m, err
}

// CreateMachine stores a new machine and binds its MACs in the MAC index,
// in one store transaction. It fails with apierr.ErrAlreadyExists if the
// name or any MAC belongs to another machine (a binding to a machine that
// is gone is taken over); nothing is written then.
func (i *Inventory) CreateMachine(ctx context.Context, m *inventoryv1.Machine) (*inventoryv1.Machine, error) {
	return i.CreateMachineWith(ctx, m, nil)
}

// CreateMachineWith is CreateMachine that also changes other records in
// the same store transaction; also nil is CreateMachine.
func (i *Inventory) CreateMachineWith(ctx context.Context, m *inventoryv1.Machine, also Also) (*inventoryv1.Machine, error) {
	if err := CheckName(m.GetName()); err != nil {
		return nil, err
	}
	m = proto.CloneOf(m)
	macs, err := machineMACs(m)
	if err != nil {
		return nil, err
	}
	now := timestamppb.New(i.cfg.Now())
	m.CreatedAt, m.UpdatedAt = now, now
	if err := Transition(m, EventCreated); err != nil {
		return nil, err
	}
	if m.BootIntent == inventoryv1.BootIntent_BOOT_INTENT_UNSPECIFIED {
		m.BootIntent = inventoryv1.BootIntent_BOOT_INTENT_DISCOVER
	}
	_, err = record.RunTx(ctx, i.cfg.Store, func(tx *record.Tx) error {
		if ok, err := tx.Get(ctx, machinePrefix+m.GetName(), newMachine()); err != nil {
			return err
		} else if ok {
			return apierr.Existsf("machine %q", m.GetName())
		}
		for _, mac := range macs {
			var b inventoryv1.MacBinding
			exists, err := tx.Get(ctx, macPrefix+mac, &b)
			if err != nil {
				return err
			}
			if exists && b.GetMachineName() != m.GetName() {
				owner, err := txMachine(ctx, tx, b.GetMachineName())
				if err != nil {
					return err
				}
				if owner != nil {
					return apierr.Existsf("MAC %s belongs to machine %q", mac, b.GetMachineName())
				}
			}
			if err := tx.Put(macPrefix+mac, &inventoryv1.MacBinding{MachineName: m.GetName()}); err != nil {
				return err
			}
		}
		if also != nil {
			if err := also(tx, m); err != nil {
				return err
			}
		}
		return tx.Put(machinePrefix+m.GetName(), m)
	})
	if err != nil {
		return nil, err
	}
	i.observe(m.GetName(), m)
	return m, nil
}

func machineMACs(m *inventoryv1.Machine) ([]string, error) {
	seen := map[string]bool{}
	var out []string
	add := func(s string) (string, error) {
		if s == "" {
			return "", nil
		}
		mac, err := NormalizeMAC(s)
		if err != nil {
			return "", err
		}
		if !seen[mac] {
			seen[mac] = true
			out = append(out, mac)
		}
		return mac, nil
	}
	var err error
	if m.BootMac, err = add(m.GetBootMac()); err != nil {
		return nil, err
	}
	for k, s := range m.GetMacs() {
		if m.Macs[k], err = add(s); err != nil {
			return nil, err
		}
	}
	if m.GetBootMac() != "" && !slices.Contains(m.Macs, m.GetBootMac()) {
		m.Macs = append(m.Macs, m.GetBootMac())
	}
	return out, nil
}

var errSkip = errors.New("skip")

// EnsureMachineForMAC returns the machine owning mac, creating a
// DISCOVERED placeholder named after the MAC when none does. created says
// whether it was made now. When Config.MaxDiscovered placeholders exist it
// creates none and fails with ErrDiscoveredCap (class apierr.ErrExhausted; logged
// at most once a minute with the count refused): a known MAC is still
// returned. Safe against concurrent callers; concurrent creations never
// take the count past the cap.
func (i *Inventory) EnsureMachineForMAC(ctx context.Context, mac string) (m *inventoryv1.Machine, created bool, err error) {
	mac, err = NormalizeMAC(mac)
	if err != nil {
		return nil, false, err
	}
	for attempt := 0; attempt < 5; attempt++ {
		m, err = i.MachineByMAC(ctx, mac)
		if err == nil || !errors.Is(err, apierr.ErrNotFound) {
			return m, false, err
		}
		release, err := i.reservePlaceholder(ctx, mac)
		if err != nil {
			return nil, false, err
		}
		m, err = i.CreateMachine(ctx, &inventoryv1.Machine{Name: MachineNameForMAC(mac), BootMac: mac})
		release()
		if err == nil {
			i.log.Info("new machine", "machine", m.GetName(), "mac", mac)
			return m, true, nil
		}
		if !errors.Is(err, apierr.ErrAlreadyExists) {
			return nil, false, err
		}
		// Lost a race with another creator: read theirs.
	}
	return nil, false, fmt.Errorf("inventory: machine for MAC %s: %w", mac, err)
}

// UpdateMachine changes a machine by compare-and-swap: mutate sees the
// current record and may return an error to abort. MAC changes are not
// allowed here (the index would go stale); use CreateMachine/Delete.
func (i *Inventory) UpdateMachine(ctx context.Context, name string, mutate func(m *inventoryv1.Machine) error) (*inventoryv1.Machine, error) {
	return i.UpdateMachineWith(ctx, name, mutate, nil)
}

// Also changes other records in the transaction that writes a machine
// (UpdateMachineWith, CreateMachineWith): it runs after the machine's own
// change with the record as it will be written, may read and write other
// keys through tx — never the machine's own key or its MAC bindings — and
// may return an error to abort everything. It may run more than once.
type Also func(tx *record.Tx, m *inventoryv1.Machine) error

// UpdateMachineWith is UpdateMachine that also changes other records in
// the same store transaction (an index record the machine's new state
// names, say); also nil is UpdateMachine.
func (i *Inventory) UpdateMachineWith(ctx context.Context, name string, mutate func(m *inventoryv1.Machine) error, also Also) (*inventoryv1.Machine, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	change := func(m *inventoryv1.Machine) error {
		macs := append([]string{m.GetBootMac()}, m.GetMacs()...)
		if err := mutate(m); err != nil {
			return err
		}
		after := append([]string{m.GetBootMac()}, m.GetMacs()...)
		if strings.Join(macs, ",") != strings.Join(after, ",") {
			return apierr.Invalidf("machine %q: MACs cannot be changed by an update", name)
		}
		m.Name = name
		m.UpdatedAt = timestamppb.New(i.cfg.Now())
		return nil
	}
	var m *inventoryv1.Machine
	var err error
	if also == nil {
		m, err = record.Update(ctx, i.cfg.Store, machinePrefix+name, newMachine, func(m *inventoryv1.Machine, exists bool) (bool, error) {
			if !exists {
				return false, apierr.NotFoundf("machine %q", name)
			}
			return false, change(m)
		})
	} else {
		_, err = record.RunTx(ctx, i.cfg.Store, func(tx *record.Tx) error {
			cur, err := txMachine(ctx, tx, name)
			if err != nil {
				return err
			}
			if cur == nil {
				return apierr.NotFoundf("machine %q", name)
			}
			if err := change(cur); err != nil {
				return err
			}
			if err := also(tx, cur); err != nil {
				return err
			}
			m = cur
			return tx.Put(machinePrefix+name, cur)
		})
	}
	if err != nil {
		return m, err
	}
	i.observe(name, m)
	return m, nil
}

// DeleteMachine removes a machine and the index records that name it (its
// MAC bindings, its serial, UUID and TPM key records) in one store
// transaction, and runs the OnDelete functions with the record as it was.
// Its timeline is kept (it is keyed by MAC and trimmed by age of entries).
// A machine that is INSTALLING, DEPLOYED, RELEASING (its erase running) or
// allocated is refused.
func (i *Inventory) DeleteMachine(ctx context.Context, name string) error {
	if err := CheckName(name); err != nil {
		return err
	}
	var gone *inventoryv1.Machine
	_, err := record.RunTx(ctx, i.cfg.Store, func(tx *record.Tx) error {
		m, err := txMachine(ctx, tx, name)
		if err != nil {
			return err
		}
		if m == nil {
			return apierr.NotFoundf("machine %q", name)
		}
		if m.GetState() == inventoryv1.Machine_INSTALLING || m.GetState() == inventoryv1.Machine_DEPLOYED {
			return apierr.Preconditionf("machine %q is %s: reprovision it first", name, m.GetState())
		}
		switch {
		case m.GetState() == inventoryv1.Machine_RELEASING:
			// Deleting it now would leave the last owner's data on disks
			// the next discovery hands to someone else.
			return apierr.Preconditionf("machine %q is RELEASING: its disks are being erased; delete it once it is READY or FAILED", name)
		case allocHeld(m):
			return apierr.Preconditionf("machine %q is %s and allocated to %s: release it first", name, m.GetState(), ownerWords(m.GetAllocation()))
		}
		if err := tx.Delete(machinePrefix + name); err != nil {
			return err
		}
		gone = m
		return txUnindex(ctx, tx, m)
	})
	if err != nil {
		return err
	}
	i.observe(name, nil)
	i.deleteMu.Lock()
	hooks := slices.Clone(i.onDelete)
	i.deleteMu.Unlock()
	for _, f := range hooks {
		f(ctx, gone)
	}
	return nil
}

// txUnindex deletes in tx the index records that name m: its MAC
// bindings and its serial, UUID and TPM key records.
func txUnindex(ctx context.Context, tx *record.Tx, m *inventoryv1.Machine) error {
	var keys []string
	for _, mac := range append([]string{m.GetBootMac()}, m.GetMacs()...) {
		if mac != "" && !slices.Contains(keys, macPrefix+mac) {
			keys = append(keys, macPrefix+mac)
		}
	}
	for _, k := range keys {
		var b inventoryv1.MacBinding
		exists, err := tx.Get(ctx, k, &b)
		if err != nil {
			return err
		}
		if exists && b.GetMachineName() == m.GetName() {
			if err := tx.Delete(k); err != nil {
				return err
			}
		}
	}
	if b := m.GetBmc(); b.GetAddress() != "" {
		var ab inventoryv1.BmcAddressBinding
		for _, port := range []uint32{b.GetPort(), 623, 443} {
			k := BMCAddressKey(b.GetAddress(), port)
			if port == 0 || slices.Contains(keys, k) {
				continue
			}
			keys = append(keys, k)
			exists, err := tx.Get(ctx, k, &ab)
			if err != nil {
				return err
			}
			if exists && ab.GetMachineName() == m.GetName() {
				if err := tx.Delete(k); err != nil {
					return err
				}
			}
		}
	}
	return txUnindexIdentity(ctx, tx, m, nil)
}

// BootIntent says what mac should boot: the owning machine's intent, or
// discovery for an unknown MAC (name is "" then). A machine in MAINTENANCE
// boots its local disk.
func (i *Inventory) BootIntent(ctx context.Context, mac string) (name string, intent inventoryv1.BootIntent, err error) {
	m, err := i.MachineByMAC(ctx, mac)
	if errors.Is(err, apierr.ErrNotFound) {
		return "", inventoryv1.BootIntent_BOOT_INTENT_DISCOVER, nil
	}
	if err != nil {
		return "", 0, err
	}
	intent = m.GetBootIntent()
	if m.GetState() == inventoryv1.Machine_MAINTENANCE {
		intent = inventoryv1.BootIntent_BOOT_INTENT_LOCAL
	}
	if intent == inventoryv1.BootIntent_BOOT_INTENT_UNSPECIFIED {
		intent = inventoryv1.BootIntent_BOOT_INTENT_DISCOVER
	}
	return m.GetName(), intent, nil
}

// OnDelete adds f to the functions DeleteMachine runs, in order, once a
// machine record is gone, with the record as it was: services that keep
// records beside a machine (BMC control's sealed password) remove them
// there. f must be quick and must not fail the delete; it may be called
// concurrently for different machines.
func (i *Inventory) OnDelete(f func(ctx context.Context, m *inventoryv1.Machine)) {
	i.deleteMu.Lock()
	defer i.deleteMu.Unlock()
	i.onDelete = append(i.onDelete, f)
}

// WatchMachines streams the names of machines whose record changes until
// ctx ends or the store drops the watcher; the channel is closed then.
func (i *Inventory) WatchMachines(ctx context.Context) (<-chan string, error) {
	evs, err := i.cfg.Store.Watch(ctx, machinePrefix)
	if err != nil {
		return nil, err
	}
	out := make(chan string, 64)
	go func() {
		defer close(out)
		for ev := range evs {
			select {
			case out <- strings.TrimPrefix(ev.KV.Key, machinePrefix):
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}
