package record

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"

	storev1 "github.com/corralhq/corral/api/store/v1"
	"github.com/corralhq/corral/store"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// Step upgrades records from schema version From to From+1. Change
// rewrites the value of one record of a type named in Types (full protobuf
// names, e.g. "corral.pool.v1.Network") in place; a record of any other
// type is carried to From+1 unchanged. Change must be idempotent: a
// record is migrated again when a concurrent writer changed it in between.
//
// The steps live with the composition layer (package appliance), which sees
// every record type; this package owns only the envelope and the walk, so
// that it keeps importing nothing but the store contract.
type Step struct {
	From   uint32
	Name   string
	Types  []string
	Change func(v *anypb.Any) error
}

// MigrateSummary says what Migrate did.
type MigrateSummary struct {
	// Records is how many records the store holds; Migrated counts those
	// rewritten, by the schema version they were found at.
	Records  int
	Migrated map[uint32]int
	// Corrupt counts records that are not envelopes (left as they are).
	Corrupt int
}

// maxMigrateAttempts bounds the re-reads of one record that keeps changing
// under the migration.
const maxMigrateAttempts = 16

// CheckSteps reports whether steps carry every version below SchemaVersion
// to the next one, in order: From 1, 2, ... SchemaVersion-1.
func CheckSteps(steps []Step) error {
	if len(steps) != SchemaVersion-1 {
		return fmt.Errorf("record: %d migration steps for schema version %d (want %d)", len(steps), SchemaVersion, SchemaVersion-1)
	}
	for i, s := range steps {
		if s.From != uint32(i+1) || s.Change == nil || len(s.Types) == 0 {
			return fmt.Errorf("record: migration step %d (%q) is from %d, want %d with a Change and its types", i, s.Name, s.From, i+1)
		}
	}
	return nil
}

// Upgrade returns the envelope b carried to SchemaVersion through steps
// (b itself when it is already there), and the version it was found at.
// A newer version is ErrSchema; bytes that are not an envelope are
// store.ErrCorrupt.
func Upgrade(b []byte, steps []Step) (out []byte, from uint32, err error) {
	var r storev1.Record
	if err := proto.Unmarshal(b, &r); err != nil {
		return nil, 0, fmt.Errorf("record: %w: %v", store.ErrCorrupt, err)
	}
	from = r.GetSchemaVersion()
	switch {
	case from > SchemaVersion:
		return nil, from, fmt.Errorf("%w: %d (this build reads up to %d)", ErrSchema, from, SchemaVersion)
	case from == 0 || r.Value == nil:
		return nil, from, fmt.Errorf("record: %w: empty envelope", store.ErrCorrupt)
	case from == SchemaVersion:
		return b, from, nil
	}
	if err := CheckSteps(steps); err != nil {
		return nil, from, err
	}
	for _, s := range steps[from-1:] {
		if slices.Contains(s.Types, string(r.Value.MessageName())) {
			if err := s.Change(r.Value); err != nil {
				return nil, from, fmt.Errorf("record: migration %d→%d (%s): %w", s.From, s.From+1, s.Name, err)
			}
		}
	}
	r.SchemaVersion = SchemaVersion
	out, err = proto.MarshalOptions{Deterministic: true}.Marshal(&r)
	return out, from, err
}

// Migrate carries every record of st written at an older schema version to
// SchemaVersion, in place: each rewrite is a compare-and-swap on the
// revision it was read at, and a record changed in between is read and
// migrated again (Change is idempotent), so it is safe while other
// appliances of a fleet write, and running it twice changes nothing the
// second time. A record newer than SchemaVersion stops it with ErrSchema
// naming the key, before anything is written; a record that is not an
// envelope is logged and left to its readers. Each migrated version is
// logged. It reads the store a page of migratePage records at a time
// (store.ScanPages), keeping only the keys of the records to rewrite, so
// that a store of 50,000 machines is never held at once; keys under
// store.BackendPrefix (a backend's own, such as etcd's election) are not
// records and are skipped.
func Migrate(ctx context.Context, st store.Store, steps []Step, log *slog.Logger) (MigrateSummary, error) {
	if err := CheckSteps(steps); err != nil {
		return MigrateSummary{}, err
	}
	sum := MigrateSummary{Migrated: map[uint32]int{}}
	var old []string
	_, err := store.ScanPages(ctx, st, "", migratePage, func(kvs []store.KV) error {
		for _, kv := range kvs {
			if strings.HasPrefix(kv.Key, store.BackendPrefix) {
				continue
			}
			sum.Records++
			v, err := EnvelopeVersion(kv.Value)
			if err != nil || v == 0 {
				// Left to its reader, which reports it where it matters;
				// one damaged record does not keep the appliance down.
				sum.Corrupt++
				log.Warn("store record is not an envelope: not migrated", "key", kv.Key, "err", err)
				continue
			}
			if v > SchemaVersion {
				return fmt.Errorf("%w: %s is at schema version %d, this corrald reads up to %d: it was written by a newer corrald; run that version (or newer) on this store", ErrSchema, kv.Key, v, SchemaVersion)
			}
			if v < SchemaVersion {
				old = append(old, kv.Key)
			}
		}
		return nil
	})
	if errors.Is(err, ErrSchema) {
		return sum, err
	}
	if err != nil {
		return MigrateSummary{}, fmt.Errorf("record: migrate: list: %w", err)
	}
	for _, key := range old {
		kv, err := st.Get(ctx, key)
		if errors.Is(err, store.ErrNotFound) {
			continue // deleted since it was read
		}
		if err != nil {
			return sum, fmt.Errorf("record: migrate %s: %w", key, err)
		}
		from, err := migrateOne(ctx, st, kv, steps)
		if err != nil {
			return sum, fmt.Errorf("record: migrate %s: %w", kv.Key, err)
		}
		if from != 0 {
			sum.Migrated[from]++
		}
	}
	for _, v := range slices.Sorted(maps.Keys(sum.Migrated)) {
		log.Info("store records migrated", "from_schema", v, "to_schema", SchemaVersion, "records", sum.Migrated[v], "steps", stepNames(steps[v-1:]))
	}
	return sum, nil
}

// migratePage is how many records one store read of Migrate takes.
const migratePage = 1024

// migrateOne rewrites kv at SchemaVersion by compare-and-swap, re-reading
// it on a conflict. It returns the version it migrated from (0: nothing
// to do, the record was gone or already current).
func migrateOne(ctx context.Context, st store.Store, kv store.KV, steps []Step) (uint32, error) {
	for range maxMigrateAttempts {
		out, from, err := Upgrade(kv.Value, steps)
		if err != nil {
			return 0, err
		}
		if from == SchemaVersion {
			return 0, nil
		}
		_, err = st.Put(ctx, kv.Key, out, kv.Revision)
		if err == nil {
			return from, nil
		}
		if !errors.Is(err, store.ErrConflict) {
			return 0, err
		}
		kv, err = st.Get(ctx, kv.Key)
		if errors.Is(err, store.ErrNotFound) {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
	}
	return 0, fmt.Errorf("changed %d times while being migrated: %w", maxMigrateAttempts, store.ErrConflict)
}

// EnvelopeVersion is the schema version an envelope was written at (0 for
// bytes that are an envelope without one), or store.ErrCorrupt.
func EnvelopeVersion(b []byte) (uint32, error) {
	var r storev1.Record
	if err := proto.Unmarshal(b, &r); err != nil {
		return 0, fmt.Errorf("%w: %v", store.ErrCorrupt, err)
	}
	return r.GetSchemaVersion(), nil
}

func stepNames(steps []Step) []string {
	out := make([]string, 0, len(steps))
	for _, s := range steps {
		out = append(out, s.Name)
	}
	return out
}
