package paging

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/corralhq/corral/internal/apierr"
)

func TestSize(t *testing.T) {
	for name, tc := range map[string]struct {
		req  int32
		want int
	}{
		"zero":     {0, 100},
		"negative": {-5, 100},
		"inside":   {7, 7},
		"max":      {1000, 1000},
		"clamped":  {1 << 30, 1000},
	} {
		if got := Size(tc.req, DefaultSize, MaxSize); got != tc.want {
			t.Errorf("%s: Size(%d) = %d, want %d", name, tc.req, got, tc.want)
		}
	}
}

func TestTokenRefused(t *testing.T) {
	f := Fingerprint("state=READY")
	good := Encode(Token{After: "m1", Rev: 9, Filter: f})
	if tok, err := Decode(good, f); err != nil || tok.After != "m1" || tok.Rev != 9 {
		t.Fatalf("Decode(good) = %+v, %v", tok, err)
	}
	for name, s := range map[string]string{
		"garbled":        "not a token",
		"bad base64":     tokenVersion + "!!!",
		"bad json":       tokenVersion + "e30x",
		"empty position": Encode(Token{Filter: f}),
		"truncated":      good[:len(good)-3],
		"other filter":   Encode(Token{After: "m1", Filter: Fingerprint("state=FAILED")}),
	} {
		if _, err := Decode(s, f); !errors.Is(err, apierr.ErrInvalid) {
			t.Errorf("%s: Decode(%q) = %v, want an ErrInvalid", name, s, err)
		}
	}
}

func TestSliceAndAll(t *testing.T) {
	var items []string
	for i := range 25 {
		items = append(items, fmt.Sprintf("k%02d", i))
	}
	id := func(s string) string { return s }
	f := Fingerprint()
	fetch := func(size int32) func(context.Context, string) ([]string, string, error) {
		return func(_ context.Context, tok string) ([]string, string, error) {
			return Slice(items, id, size, tok, f)
		}
	}
	for _, size := range []int32{0, 1, 7, 25, 26} {
		var got []string
		if err := All(t.Context(), 0, fetch(size), func(s string) error { got = append(got, s); return nil }); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, items) {
			t.Errorf("size %d: %v", size, got)
		}
	}
	var got []string
	if err := All(t.Context(), 9, fetch(4), func(s string) error { got = append(got, s); return nil }); err != nil || len(got) != 9 {
		t.Errorf("limit 9: %v, %v", got, err)
	}
	loop := func(context.Context, string) ([]string, string, error) { return []string{"x"}, "same", nil }
	calls := 0
	err := All(t.Context(), 0, loop, func(string) error { calls++; return nil })
	if err == nil || calls > 2 {
		t.Errorf("a server answering its own token: %v after %d items", err, calls)
	}
}
