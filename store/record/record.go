// Package record encodes Corral's protobuf values for the store: each value
// is wrapped in a corral.store.v1.Record carrying its schema version and
// type, so a reader can tell a foreign or newer record from a corrupt one.
//
// It imports only the store contract, the error vocabulary (internal/apierr)
// and the generated API.
package record

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	storev1 "github.com/corralhq/corral/api/store/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// SchemaVersion is the version this build writes and the newest it reads.
// Older records are still read as they are; Migrate (migrate.go) rewrites
// them at this version, with the steps package appliance keeps:
//
//	1 → 2: network records' CIDRs stored canonically (host bits cleared).
const SchemaVersion = 2

// ErrSchema means the record was written by a newer schema than this build knows
// (class apierr.ErrDataLoss).
var ErrSchema = apierr.New(apierr.ErrDataLoss, "record: unsupported schema version")

// Marshal wraps msg in a Record envelope.
func Marshal(msg proto.Message) ([]byte, error) {
	return encode(&recordBufs{}, msg)
}

// encode returns msg's Record envelope in bufs.out, encoding msg itself
// in bufs.inner first; both buffers are reused and kept. The bytes are those of proto.Marshal
// (deterministic) of storev1.Record{SchemaVersion, Value: an anypb.Any of
// msg}, laid out with the protobuf module's wire encoder instead of
// building the Any and marshaling twice: a lease's write took five
// allocations for the envelope alone (bench/results/2026-11-dhcp.md,
// 25 Nov 2026). TestMarshalMatchesEnvelope holds the two encodings equal.
func encode(bufs *recordBufs, msg proto.Message) ([]byte, error) {
	inner, err := proto.MarshalOptions{Deterministic: true}.MarshalAppend(bufs.inner[:0], msg)
	if err != nil {
		return nil, fmt.Errorf("record: wrap %T: %w", msg, err)
	}
	bufs.inner = inner
	b := bufs.out[:0]
	url := typeURL(msg)
	anyLen := protowire.SizeTag(1) + protowire.SizeBytes(len(url))
	if len(inner) > 0 { // proto3 leaves an empty value out
		anyLen += protowire.SizeTag(2) + protowire.SizeBytes(len(inner))
	}
	b = protowire.AppendTag(b, 1, protowire.VarintType)
	b = protowire.AppendVarint(b, SchemaVersion)
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(anyLen))
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, url)
	if len(inner) > 0 {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, inner)
	}
	bufs.out = b
	return b, nil
}

// typeURLs holds each message type's Any type URL, built once.
var typeURLs sync.Map // protoreflect.FullName → string

func typeURL(msg proto.Message) string {
	name := msg.ProtoReflect().Descriptor().FullName()
	if u, ok := typeURLs.Load(name); ok {
		return u.(string)
	}
	u := "type.googleapis.com/" + string(name)
	typeURLs.Store(name, u)
	return u
}

// bufPool holds Put's encoding buffers: the store does not retain a
// value it is given, so one buffer serves write after write.
var bufPool = sync.Pool{New: func() any { return new(recordBufs) }}

type recordBufs struct{ out, inner []byte }

// Unmarshal decodes a Record envelope into msg. It returns an error wrapping
// store.ErrCorrupt when the bytes are not a Record of msg's type, and
// ErrSchema when the schema version is newer than SchemaVersion.
func Unmarshal(b []byte, msg proto.Message) error {
	var r storev1.Record
	if err := proto.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("record: %w: %v", store.ErrCorrupt, err)
	}
	if r.SchemaVersion > SchemaVersion {
		return fmt.Errorf("%w: %d (this build reads up to %d)", ErrSchema, r.SchemaVersion, SchemaVersion)
	}
	if r.SchemaVersion == 0 || r.Value == nil {
		return fmt.Errorf("record: %w: empty envelope", store.ErrCorrupt)
	}
	if err := r.Value.UnmarshalTo(msg); err != nil {
		return fmt.Errorf("record: %w: %v", store.ErrCorrupt, err)
	}
	return nil
}

// Get reads key into msg and returns the record's revision.
func Get(ctx context.Context, s store.Store, key string, msg proto.Message) (int64, error) {
	kv, err := s.Get(ctx, key)
	if err != nil {
		return 0, err
	}
	if err := Unmarshal(kv.Value, msg); err != nil {
		return 0, fmt.Errorf("%s: %w", key, err)
	}
	return kv.Revision, nil
}

// Put writes msg at key if its revision is rev (0 = create).
func Put(ctx context.Context, s store.Store, key string, msg proto.Message, rev int64) (int64, error) {
	bufs := bufPool.Get().(*recordBufs)
	defer bufs.release()
	b, err := encode(bufs, msg)
	if err != nil {
		return 0, err
	}
	return s.Put(ctx, key, b, rev)
}

// release returns bufs to the pool, unless a rare big record grew them.
func (bufs *recordBufs) release() {
	if cap(bufs.out) <= 64<<10 && cap(bufs.inner) <= 64<<10 {
		bufPool.Put(bufs)
	}
}

// List decodes every record under prefix with newMsg making each value.
func List[M proto.Message](ctx context.Context, s store.Store, prefix string, newMsg func() M) ([]M, error) {
	kvs, err := s.List(ctx, prefix)
	if err != nil {
		return nil, err
	}
	out := make([]M, 0, len(kvs))
	for _, kv := range kvs {
		m := newMsg()
		if err := Unmarshal(kv.Value, m); err != nil {
			return nil, fmt.Errorf("%s: %w", kv.Key, err)
		}
		out = append(out, m)
	}
	return out, nil
}

// Update runs a compare-and-swap loop on key: it reads the current value
// into a fresh message (exists=false when absent), lets mutate change it,
// and writes it back at the read revision, retrying on store.ErrConflict
// until ctx ends. mutate may return an error to abort without writing, or
// set *del to delete the record instead. It returns the final message.
func Update[M proto.Message](ctx context.Context, s store.Store, key string, newMsg func() M,
	mutate func(m M, exists bool) (del bool, err error)) (M, error) {
	pause := conflictBackoff()
	for attempt := 0; ; attempt++ {
		m := newMsg()
		var rev int64
		exists := true
		kv, err := s.Get(ctx, key)
		switch {
		case errors.Is(err, store.ErrNotFound):
			exists = false
		case err != nil:
			return m, err
		default:
			rev = kv.Revision
			if err := Unmarshal(kv.Value, m); err != nil {
				return m, fmt.Errorf("%s: %w", key, err)
			}
		}
		del, err := mutate(m, exists)
		if err != nil {
			return m, err
		}
		if del {
			if !exists {
				return m, store.ErrNotFound
			}
			err = s.Delete(ctx, key, rev)
		} else {
			_, err = Put(ctx, s, key, m, rev)
		}
		if errors.Is(err, store.ErrConflict) {
			if err := wait(ctx, attempt, &pause); err != nil {
				return m, err
			}
			continue
		}
		return m, err
	}
}

// conflictBackoff gives the pauses after the second and later conflicts
// of one Update: random, uniform up to 100 µs and doubling to at most
// 12.8 ms, so that many writers contending for one record spread out
// instead of re-reading in lock step.
func conflictBackoff() backoff.ExponentialBackOff {
	return backoff.ExponentialBackOff{InitialInterval: 50 * time.Microsecond, RandomizationFactor: 1, Multiplier: 2, MaxInterval: 6400 * time.Microsecond}
}

// wait returns at once after the first conflict (attempt 0) and waits
// pause's next pause after the others; it returns ctx's error if ctx ends.
func wait(ctx context.Context, attempt int, pause *backoff.ExponentialBackOff) error {
	if attempt == 0 {
		return ctx.Err()
	}
	t := time.NewTimer(pause.NextBackOff())
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Mutate is Update for hot records: when the store implements
// store.Updater, mutate runs inside the store's own commit, so concurrent
// writers of one key never conflict (no retries, shared fsyncs); otherwise
// it is exactly Update. mutate must be quick and must not write to the
// store (it may read), since it can run on the store's writer goroutine.
func Mutate[M proto.Message](ctx context.Context, s store.Store, key string, newMsg func() M,
	mutate func(m M, exists bool) (del bool, err error)) (M, error) {
	u, ok := s.(store.Updater)
	if !ok {
		return Update(ctx, s, key, newMsg, mutate)
	}
	var out M
	_, err := u.Update(ctx, key, func(cur store.KV, exists bool) ([]byte, bool, error) {
		m := newMsg()
		if exists {
			if err := Unmarshal(cur.Value, m); err != nil {
				return nil, false, fmt.Errorf("%s: %w", key, err)
			}
		}
		del, err := mutate(m, exists)
		if err != nil {
			return nil, false, err
		}
		out = m
		if del {
			return nil, true, nil
		}
		b, err := Marshal(m)
		return b, false, err
	})
	if err != nil {
		var zero M
		return zero, err
	}
	return out, nil
}
