package cli

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
)

// TestStreamJSONMatchesEncodeJSON: a list printed page by page as JSON is
// byte for byte what encodeJSON writes for the whole list, with --limit
// cutting it.
func TestStreamJSONMatchesEncodeJSON(t *testing.T) {
	var all []proto.Message
	for i := range 7 {
		all = append(all, &poolv1.Node{Name: fmt.Sprintf("n%d", i), Labels: map[string]string{"rack": "r1<&>\u2028"}, Address: "10.0.0.1"})
	}
	k := &kind{name: "node", page: func(_ context.Context, _ grpc.ClientConnInterface, q pageQuery) ([]proto.Message, string, error) {
		start := 0
		fmt.Sscan(q.token, &start)
		end := min(start+3, len(all))
		next := ""
		if end < len(all) {
			next = fmt.Sprint(end)
		}
		return all[start:end], next, nil
	}}
	for _, limit := range []int{0, 5, 1} {
		var got bytes.Buffer
		if err := (&invocation{}).streamJSON(t.Context(), &got, nil, k, pageQuery{size: 3}, limit); err != nil {
			t.Fatal(err)
		}
		want := all
		if limit > 0 {
			want = all[:limit]
		}
		b, err := encodeJSON(want, true)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(string(b), got.String()); diff != "" {
			t.Errorf("limit %d (-encodeJSON +stream):\n%s", limit, diff)
		}
	}
	empty := &kind{name: "node", page: func(context.Context, grpc.ClientConnInterface, pageQuery) ([]proto.Message, string, error) {
		return nil, "", nil
	}}
	var got bytes.Buffer
	if err := (&invocation{}).streamJSON(t.Context(), &got, nil, empty, pageQuery{}, 0); err != nil || got.String() != "[]\n" {
		t.Errorf("empty list: %q, %v", got.String(), err)
	}
}
