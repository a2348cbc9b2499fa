package diskmap

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var h = strings.Repeat("ab", 32)

func TestMarshalParseRoundTrip(t *testing.T) {
	m := &Map{Version: Version, Size: 10 << 20, BlockSize: 1 << 20, Extents: []Extent{
		{Offset: 0, Length: 1 << 20, SHA256: h},
		{Offset: 4 << 20, Length: 6 << 20, SHA256: h},
	}}
	data, digest, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Parse(data, digest)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(m, got); diff != "" {
		t.Fatalf("round trip (-want +got):\n%s", diff)
	}
	if got.DataBytes() != 7<<20 {
		t.Fatalf("DataBytes = %d", got.DataBytes())
	}
	if _, err := Parse(data, Digest([]byte("other"))); !errors.Is(err, ErrMalformed) {
		t.Fatalf("wrong digest: %v", err)
	}
	odd := []byte(strings.Replace(string(data), `"version":1`, `"version":1,"extra":1`, 1))
	if _, err := Parse(odd, Digest(odd)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("unknown field: %v", err)
	}
}

func TestValidateRefuses(t *testing.T) {
	ok := func() *Map {
		return &Map{Version: Version, Size: 8 << 20, BlockSize: 1 << 20, Extents: []Extent{
			{Offset: 0, Length: 1 << 20, SHA256: h},
			{Offset: 2 << 20, Length: 1 << 20, SHA256: h},
		}}
	}
	tests := map[string]func(*Map){
		"version":         func(m *Map) { m.Version = 2 },
		"size":            func(m *Map) { m.Size = 0 },
		"block size":      func(m *Map) { m.BlockSize = 0 },
		"overlap":         func(m *Map) { m.Extents[1].Offset = 1<<20 - 1 },
		"past size":       func(m *Map) { m.Extents[1].Offset = 8<<20 - 1 },
		"empty extent":    func(m *Map) { m.Extents[0].Length = 0 },
		"long extent":     func(m *Map) { m.Size = 1 << 30; m.Extents[1].Length = MaxExtentLength + 1 },
		"bad hash":        func(m *Map) { m.Extents[0].SHA256 = strings.ToUpper(h) },
		"bad image":       func(m *Map) { m.Image = "x" },
		"negative offset": func(m *Map) { m.Extents[0].Offset = -1 },
		"too many": func(m *Map) {
			m.Size = MaxExtents * 4
			m.Extents = make([]Extent, MaxExtents+1)
		},
	}
	if err := ok().Validate(); err != nil {
		t.Fatal(err)
	}
	for name, spoil := range tests {
		t.Run(name, func(t *testing.T) {
			m := ok()
			spoil(m)
			if err := m.Validate(); !errors.Is(err, ErrMalformed) {
				t.Fatalf("Validate = %v, want ErrMalformed", err)
			}
		})
	}
}

// FuzzParse: a map arrives over the network; Parse must refuse what is
// not a valid map without panicking, and what it accepts must validate
// and survive a round trip.
func FuzzParse(f *testing.F) {
	m := &Map{Version: Version, Size: 3 << 20, BlockSize: 1 << 20, Extents: []Extent{{Offset: 1 << 20, Length: 1 << 20, SHA256: h}}}
	data, _, err := m.Marshal()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	f.Add([]byte(`{"version":1,"size":1,"block_size":1,"extents":[]}`))
	f.Add([]byte(`{"version":1,"size":-1,"block_size":1,"extents":[{"offset":-5,"length":9223372036854775807}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := Parse(data, Digest(data))
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Parse error not ErrMalformed: %v", err)
			}
			return
		}
		if err := got.Validate(); err != nil {
			t.Fatal(err)
		}
		again, digest, err := got.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Parse(again, digest); err != nil {
			t.Fatal(err)
		}
	})
}
