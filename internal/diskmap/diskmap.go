// Package diskmap is the block map's wire format: the virtual size of a
// disk image and the list of its data extents, each with the SHA-256 of
// its raw bytes, everything else reading as zero (what a bmap file says).
// The appliance builds a map (images/blockmap) and the agent writes the
// disk from one (agent/diskwrite): this package is the one contract
// between them, so neither imports the other. The encoding is versioned
// JSON with a digest of its own, which an install plan carries; Parse
// checks that digest and the map's shape before anything trusts it.
//
// It imports nothing of Corral's.
package diskmap

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
)

// Version is the only map version this package writes and reads.
const Version = 1

// Bounds a map must respect. MaxExtentLength keeps what a retry or a hash
// failure costs small; MaxExtents and MaxBytes keep a map a bounded
// thing to fetch, hold and check.
const (
	MaxExtentLength = 64 << 20
	MaxExtents      = 1 << 16
	MaxBytes        = 16 << 20
)

// ErrMalformed is wrapped by every refusal of a map's shape or digest.
var ErrMalformed = errors.New("malformed block map")

// Map is a disk image described as data extents over a zero background.
type Map struct {
	Version int `json:"version"`
	// Size is the virtual disk size in bytes.
	Size int64 `json:"size"`
	// BlockSize is the granularity zero detection used (extents start on
	// a multiple of it; the last one may end at Size).
	BlockSize int64 `json:"block_size"`
	// Image is the SHA-256 of the stored image file the map describes,
	// when the builder's caller knows it (hex; optional).
	Image string `json:"image_sha256,omitempty"`
	// Extents are the data extents, sorted by offset, not overlapping.
	Extents []Extent `json:"extents"`
}

// Extent is one range of the virtual disk holding data.
type Extent struct {
	Offset int64 `json:"offset"`
	Length int64 `json:"length"`
	// SHA256 is the hex SHA-256 of the extent's raw bytes.
	SHA256 string `json:"sha256"`
}

// End is the offset just past the extent.
func (e Extent) End() int64 { return e.Offset + e.Length }

func (e Extent) String() string {
	return fmt.Sprintf("[%d, %d) sha256 %s", e.Offset, e.End(), e.SHA256)
}

// DataBytes is the sum of the extents' lengths.
func (m *Map) DataBytes() int64 {
	var n int64
	for _, e := range m.Extents {
		n += e.Length
	}
	return n
}

// Validate reports whether the map is one this package would write: the
// version, a positive size, a block size, extents sorted, disjoint, inside
// the size, each at most MaxExtentLength long with a well-formed hash,
// and at most MaxExtents of them. Errors wrap ErrMalformed.
func (m *Map) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
	}
	switch {
	case m == nil:
		return bad("no map")
	case m.Version != Version:
		return bad("version %d, want %d", m.Version, Version)
	case m.Size <= 0:
		return bad("size %d", m.Size)
	case m.BlockSize <= 0 || m.BlockSize > MaxExtentLength:
		return bad("block size %d", m.BlockSize)
	case len(m.Extents) > MaxExtents:
		return bad("%d extents, at most %d", len(m.Extents), MaxExtents)
	case m.Image != "" && !isHexSHA256(m.Image):
		return bad("image sha256 %q", m.Image)
	}
	var prev int64
	for i, e := range m.Extents {
		switch {
		case e.Length <= 0 || e.Length > MaxExtentLength:
			return bad("extent %d %v: length %d not in (0, %d]", i, e, e.Length, MaxExtentLength)
		case e.Offset < prev:
			return bad("extent %d %v: starts before the end of the one before (%d)", i, e, prev)
		case e.Offset > m.Size-e.Length:
			return bad("extent %d %v: ends past the size %d", i, e, m.Size)
		case !isHexSHA256(e.SHA256):
			return bad("extent %d at %d: sha256 %q", i, e.Offset, e.SHA256)
		}
		prev = e.End()
	}
	return nil
}

func isHexSHA256(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Marshal validates m and returns its encoding and the encoding's digest
// (hex SHA-256), the value an install plan carries.
func (m *Map) Marshal() (data []byte, digest string, err error) {
	if err := m.Validate(); err != nil {
		return nil, "", err
	}
	data, err = json.Marshal(m)
	if err != nil {
		return nil, "", fmt.Errorf("encode block map: %w", err)
	}
	if len(data) > MaxBytes {
		return nil, "", fmt.Errorf("%w: encoding is %d bytes, at most %d", ErrMalformed, len(data), MaxBytes)
	}
	return data, Digest(data), nil
}

// Digest is the hex SHA-256 of an encoded map.
func Digest(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// Parse checks data against digest (the hex SHA-256 the plan carried),
// then decodes and validates it. Unknown fields are refused. Errors wrap
// ErrMalformed.
func Parse(data []byte, digest string) (*Map, error) {
	if len(data) > MaxBytes {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrMalformed, len(data), MaxBytes)
	}
	if got := Digest(data); got != digest {
		return nil, fmt.Errorf("%w: digest %s, the plan says %s", ErrMalformed, got, digest)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var m Map
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: data after the map", ErrMalformed)
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}
