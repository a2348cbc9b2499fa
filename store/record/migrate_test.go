package record

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	storev1 "github.com/corralhq/corral/api/store/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/mem"
)

// upperStep is a test step: it upper-cases StringValue records.
var upperStep = []Step{{From: 1, Name: "upper", Types: []string{"google.protobuf.StringValue"}, Change: func(v *anypb.Any) error {
	var s wrapperspb.StringValue
	if err := v.UnmarshalTo(&s); err != nil {
		return err
	}
	s.Value = strings.ToUpper(s.Value)
	return v.MarshalFrom(&s)
}}}

// envelope writes msg at schema version v.
func envelope(t *testing.T, v uint32, msg proto.Message) []byte {
	t.Helper()
	a, err := anypb.New(msg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := proto.Marshal(&storev1.Record{SchemaVersion: v, Value: a})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestMigrate(t *testing.T) {
	ctx := context.Background()
	st := mem.New()
	st.Put(ctx, "/a", envelope(t, 1, wrapperspb.String("old")), 0)
	st.Put(ctx, "/b", envelope(t, 1, wrapperspb.Int64(7)), 0)
	st.Put(ctx, "/c", envelope(t, SchemaVersion, wrapperspb.String("new")), 0)
	st.Put(ctx, "/d", []byte{0xff, 0xff, 0xff}, 0) // not an envelope: left alone

	sum, err := Migrate(ctx, st, upperStep, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(MigrateSummary{Records: 4, Migrated: map[uint32]int{1: 2}, Corrupt: 1}, sum); d != "" {
		t.Errorf("summary (-want +got):\n%s", d)
	}
	type rec struct {
		Version uint32
		Value   string
	}
	got := map[string]rec{}
	for _, k := range []string{"/a", "/b", "/c"} {
		kv, _ := st.Get(ctx, k)
		var r storev1.Record
		if err := proto.Unmarshal(kv.Value, &r); err != nil {
			t.Fatal(err)
		}
		m, err := r.GetValue().UnmarshalNew()
		if err != nil {
			t.Fatal(err)
		}
		pr := m.ProtoReflect()
		got[k] = rec{r.GetSchemaVersion(), fmt.Sprint(pr.Get(pr.Descriptor().Fields().ByName("value")).Interface())}
	}
	want := map[string]rec{"/a": {2, "OLD"}, "/b": {2, "7"}, "/c": {2, "new"}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("records (-want +got):\n%s", d)
	}
	// Idempotent: a second run changes nothing.
	if sum, err := Migrate(ctx, st, upperStep, slog.New(slog.DiscardHandler)); err != nil || len(sum.Migrated) != 0 {
		t.Errorf("second run: %v, %v", sum, err)
	}
}

func TestMigrateRefusesNewer(t *testing.T) {
	ctx := context.Background()
	st := mem.New()
	st.Put(ctx, "/a", envelope(t, 1, wrapperspb.String("old")), 0)
	st.Put(ctx, "/z", envelope(t, SchemaVersion+1, wrapperspb.String("future")), 0)
	_, err := Migrate(ctx, st, upperStep, slog.New(slog.DiscardHandler))
	if !errors.Is(err, ErrSchema) || !strings.Contains(err.Error(), "/z") || !strings.Contains(err.Error(), "newer corrald") {
		t.Fatalf("Migrate: %v, want ErrSchema naming /z", err)
	}
	kv, _ := st.Get(ctx, "/a")
	if v, _ := EnvelopeVersion(kv.Value); v != 1 {
		t.Errorf("/a was migrated to %d before the refusal", v)
	}
}

// TestMigrateConflict: a record rewritten between the read and the
// migration's write is read again and migrated as it is now.
func TestMigrateConflict(t *testing.T) {
	ctx := context.Background()
	st := &racing{Store: mem.New()}
	st.Put(ctx, "/a", envelope(t, 1, wrapperspb.String("first")), 0)
	st.before = func() {
		kv, _ := st.Store.Get(ctx, "/a")
		st.Store.Put(ctx, "/a", envelope(t, 1, wrapperspb.String("second")), kv.Revision)
	}
	if _, err := Migrate(ctx, st, upperStep, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	var s wrapperspb.StringValue
	if _, err := Get(ctx, st, "/a", &s); err != nil || s.GetValue() != "SECOND" {
		t.Errorf("/a = %q, %v; want SECOND", s.GetValue(), err)
	}
}

// racing runs before once, just before the first Put.
type racing struct {
	store.Store
	before func()
}

func (r *racing) Put(ctx context.Context, key string, value []byte, rev int64) (int64, error) {
	if f := r.before; f != nil {
		r.before = nil
		f()
	}
	return r.Store.Put(ctx, key, value, rev)
}

func TestCheckSteps(t *testing.T) {
	if err := CheckSteps(nil); err == nil {
		t.Error("no steps accepted for schema version 2")
	}
	if err := CheckSteps([]Step{{From: 2, Name: "x", Types: []string{"t"}, Change: func(*anypb.Any) error { return nil }}}); err == nil {
		t.Error("a step from 2 accepted as the first")
	}
}
