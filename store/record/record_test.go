package record

import (
	"bytes"
	"context"
	"errors"
	"testing"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
	storev1 "github.com/corralhq/corral/api/store/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// plainEnvelope is the Record envelope built the plain way: an anypb.Any of
// msg inside a storev1.Record, each marshaled deterministically.
func plainEnvelope(msg proto.Message) ([]byte, error) {
	a := &anypb.Any{}
	if err := anypb.MarshalFrom(a, msg, proto.MarshalOptions{Deterministic: true}); err != nil {
		return nil, err
	}
	return proto.MarshalOptions{Deterministic: true}.Marshal(&storev1.Record{SchemaVersion: SchemaVersion, Value: a})
}

// TestMarshalMatchesEnvelope: the wire-level encoder (encode) writes the
// same bytes as the plain envelope, for an empty message (no value field
// at all), small and large ones (a length past one varint byte), and
// through Put's reused buffers one after another; and it refuses what
// proto.Marshal refuses (a string that is not UTF-8).
func TestMarshalMatchesEnvelope(t *testing.T) {
	big := &poolv1.Node{Name: "big", Annotations: map[string]string{}}
	for i := range 300 {
		big.Annotations[string(rune('a'+i%26))+string(rune('A'+i/26))] = "value of some length"
	}
	msgs := []proto.Message{
		&poolv1.Node{},
		&poolv1.Node{Name: "n"},
		&poolv1.Node{Name: "ñodo-∂", Annotations: map[string]string{"b": "2", "a": "1"}},
		big,
		&storev1.Record{SchemaVersion: 7},
	}
	st := mem.New()
	ctx := context.Background()
	for i, m := range msgs {
		want, err := plainEnvelope(m)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Marshal(m)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("message %d: Marshal = %x, %v; want %x", i, got, err, want)
		}
		// Put encodes into pooled buffers: what lands must be the same.
		key := "k/" + string(rune('a'+i))
		if _, err := Put(ctx, st, key, m, 0); err != nil {
			t.Fatal(err)
		}
		kv, err := st.Get(ctx, key)
		if err != nil || !bytes.Equal(kv.Value, want) {
			t.Errorf("message %d: Put stored %x, %v; want %x", i, kv.Value, err, want)
		}
	}
	bad := &poolv1.Node{Name: "\xff\xfe"}
	if _, err := Marshal(bad); err == nil {
		t.Error("Marshal of a non-UTF-8 string succeeded")
	}
	if _, err := Put(ctx, st, "k/bad", bad, 0); err == nil {
		t.Error("Put of a non-UTF-8 string succeeded")
	}
	if _, err := st.Get(ctx, "k/bad"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a refused Put left a record: %v", err)
	}
}

func TestMarshalDeterministic(t *testing.T) {
	n := &poolv1.Node{Name: "n", ReservedComputes: map[string]*poolv1.Compute{}}
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		n.ReservedComputes[k] = &poolv1.Compute{RequestCpuMilliCore: 1, Annotations: map[string]string{k: k, "x": "y"}}
	}
	first, err := Marshal(n)
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		b, _ := Marshal(proto.CloneOf(n))
		if !bytes.Equal(b, first) {
			t.Fatal("Marshal is not deterministic")
		}
	}
}

func TestUnmarshalErrors(t *testing.T) {
	future, _ := proto.Marshal(&storev1.Record{SchemaVersion: SchemaVersion + 1})
	good, _ := Marshal(&poolv1.Node{Name: "n"})
	cases := map[string]struct {
		b    []byte
		want error
	}{
		"garbage":    {[]byte{0xff, 0xff, 0xff}, store.ErrCorrupt},
		"empty":      {nil, store.ErrCorrupt},
		"newer":      {future, ErrSchema},
		"wrong type": {good, store.ErrCorrupt},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if err := Unmarshal(tc.b, &poolv1.Network{}); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

func TestUpdateCreatesAndDeletes(t *testing.T) {
	s := mem.New()
	ctx := context.Background()
	newNode := func() *poolv1.Node { return &poolv1.Node{} }
	if _, err := Update(ctx, s, "k", newNode, func(n *poolv1.Node, exists bool) (bool, error) {
		if exists {
			t.Fatal("exists before create")
		}
		n.Name = "n"
		return false, nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := Update(ctx, s, "k", newNode, func(n *poolv1.Node, exists bool) (bool, error) { return true, nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := Update(ctx, s, "k", newNode, func(n *poolv1.Node, exists bool) (bool, error) { return true, nil }); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("delete of missing: %v", err)
	}
}
