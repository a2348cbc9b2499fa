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
)

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
