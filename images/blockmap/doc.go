// Package blockmap is the appliance's side of writing an operating-system
// image to a disk. Given an image file and its declared format (raw or
// qcow2: never guessed), Open gives the image's raw virtual view, an
// io.ReaderAt of exactly Size bytes, and Image.Map describes it as a
// block map (internal/diskmap): the data extents, each at most
// diskmap.MaxExtentLength long and hashed, everything else reading as
// zero. Zero detection finds candidate data first (SEEK_DATA/SEEK_HOLE on
// a sparse raw file; the qcow2 cluster tables through go-qcow2reader) and
// then reads those ranges in BlockSize blocks, so an allocated block of
// zeros costs nothing on the wire.
//
// The design: the appliance serves the raw view (GET /os-images/<sha>/raw
// with ranges, http.ServeContent over io.NewSectionReader) and converts
// qcow2 to raw on the fly while serving; the agent (agent/diskwrite) only
// ever fetches raw extents and verifies them one by one against the map.
// No qcow2 code and no converter goes into the discovery image.
//
// It imports nothing of Corral's but the map format (internal/diskmap);
// the agent never imports it.
package blockmap
