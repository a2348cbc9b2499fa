package osimage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"

	"github.com/google/renameio/v2"

	osimagev1 "github.com/corralhq/corral/api/osimage/v1"
	"github.com/corralhq/corral/images"
	"github.com/corralhq/corral/images/blockmap"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/internal/diskmap"
)

// MapSuffix names an image's cached block map beside its content:
// images.ContentDir/<sha256> + MapSuffix.
const MapSuffix = ".map.json"

// RawSuffix ends the boot HTTP path of an image's raw view:
// PathPrefix + <sha256> + RawSuffix.
const RawSuffix = "/raw"

// formatMixed marks content that READY images declare in different
// formats: its raw view would depend on which one is asked, so it is not
// served raw.
const formatMixed osimagev1.OSImageFormat = -1

// RawImage is what a deploy needs of a READY image: the raw view's size
// and path on the boot HTTP server, and its block map.
type RawImage struct {
	Name, SHA256 string
	// Size is the raw view's size in bytes (a qcow2's virtual size).
	Size int64
	// Map is the block map (internal/diskmap JSON), MapSHA256 its digest.
	Map       []byte
	MapSHA256 string
	// Path is PathPrefix + SHA256 + RawSuffix.
	Path string
}

// mapBuild is one block map being built; done closes when it ends.
type mapBuild struct {
	done chan struct{}
	err  error
}

func mergeFormat(old, f osimagev1.OSImageFormat) osimagev1.OSImageFormat {
	if old == 0 || old == f {
		return f
	}
	return formatMixed
}

// Raw returns the raw view of the READY image called name with its block
// map, building the map first when this appliance has none cached for the
// content (a read of the whole image; concurrent callers share one
// build). Unknown: NotFound; not READY, or READY but its bytes not on
// this appliance yet: FailedPrecondition.
func (s *Service) Raw(ctx context.Context, name string) (RawImage, error) {
	im, err := s.Get(ctx, name)
	if err != nil {
		return RawImage{}, err
	}
	if im.GetState() != osimagev1.OSImageState_OS_IMAGE_STATE_READY {
		return RawImage{}, apierr.Preconditionf("OS image %q is %s, not READY", name,
			strings.ToLower(strings.TrimPrefix(im.GetState().String(), "OS_IMAGE_STATE_")))
	}
	sum := im.GetSha256()
	if f := s.format(sum); f == formatMixed {
		return RawImage{}, apierr.Preconditionf("OS image %q: images with sha256 %s declare different formats", name, sum)
	}
	data, digest, size, err := s.blockMap(ctx, sum, im.GetFormat())
	if err != nil {
		return RawImage{}, err
	}
	return RawImage{Name: name, SHA256: sum, Size: size, Map: data, MapSHA256: digest, Path: PathPrefix + sum + RawSuffix}, nil
}

// format is the declared format of READY content sum (0 when none is).
func (s *Service) format(sum string) osimagev1.OSImageFormat {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ready[sum]
}

// OpenRaw opens the raw view of READY content by its SHA-256 for the boot
// HTTP server: the file itself for a raw image, a reader that converts as
// it reads for a qcow2. It returns the view and its size; the caller
// closes it. A malformed sum is Invalid; content no READY image has, or
// not on this appliance yet, NotFound. Safe for concurrent use.
func (s *Service) OpenRaw(sum string) (io.ReadSeekCloser, int64, error) {
	if err := images.CheckSHA256(sum); err != nil {
		return nil, 0, apierr.Invalidf("%q is not a SHA-256 (64 lower-case hex digits)", sum)
	}
	f := s.format(sum)
	switch f {
	case 0:
		return nil, 0, apierr.NotFoundf("no READY OS image has sha256 %s", sum)
	case formatMixed:
		return nil, 0, apierr.Preconditionf("images with sha256 %s declare different formats", sum)
	}
	if f == osimagev1.OSImageFormat_OS_IMAGE_FORMAT_RAW {
		// The file itself: the boot HTTP server's copy then uses sendfile.
		fl, a, err := s.Open(sum)
		if err != nil {
			return nil, 0, err
		}
		return fl, a.Size, nil
	}
	bi, err := blockmap.Open(contentPath(s.cfg.Dir, sum), blockmap.Format(formatName(f)))
	if errors.Is(err, os.ErrNotExist) {
		return nil, 0, apierr.NotFoundf("OS image %s is not on this appliance yet", sum)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("osimage: %w", err)
	}
	return &rawView{ra: bi, c: bi, size: bi.Size(), buf: make([]byte, 0, viewBuffer)}, bi.Size(), nil
}

// viewBuffer is how much of a converted view rawView reads at once: an
// HTTP copy asks for 32 KiB at a time, and a compressed qcow2 cluster
// read for each ask would be inflated again and again.
const viewBuffer = 1 << 20

// rawView reads a converted raw view sequentially through a buffer of
// viewBuffer bytes; Seek moves it (a range request seeks once).
type rawView struct {
	ra   io.ReaderAt
	c    io.Closer
	size int64
	off  int64
	// buf holds the view's bytes from bufOff.
	buf    []byte
	bufOff int64
}

func (v *rawView) Read(p []byte) (int, error) {
	if v.off >= v.size {
		return 0, io.EOF
	}
	if v.off < v.bufOff || v.off >= v.bufOff+int64(len(v.buf)) {
		n, err := v.ra.ReadAt(v.buf[:min(int64(cap(v.buf)), v.size-v.off)], v.off)
		if n == 0 && err != nil {
			v.buf = v.buf[:0]
			return 0, err
		}
		v.buf, v.bufOff = v.buf[:n], v.off
	}
	n := copy(p, v.buf[v.off-v.bufOff:])
	v.off += int64(n)
	return n, nil
}

func (v *rawView) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += v.off
	case io.SeekEnd:
		offset += v.size
	default:
		return 0, errors.New("osimage: raw view: bad whence")
	}
	if offset < 0 {
		return 0, errors.New("osimage: raw view: negative position")
	}
	v.off = offset
	return offset, nil
}

func (v *rawView) Close() error { return v.c.Close() }

// blockMap returns content sum's block map, its digest and the raw size:
// the cached one when it loads and checks out, otherwise one built now
// (once for all concurrent callers) and cached.
func (s *Service) blockMap(ctx context.Context, sum string, f osimagev1.OSImageFormat) ([]byte, string, int64, error) {
	for built := false; ; {
		data, digest, size, err := s.loadMap(sum, f)
		switch {
		case err == nil:
			return data, digest, size, nil
		case built:
			return nil, "", 0, fmt.Errorf("osimage: the block map of %s just built: %w", sum, err)
		case !errors.Is(err, os.ErrNotExist):
			s.log.Warn("OS image block map cache unusable: building it again", "sha256", sum, "err", err)
		}
		s.mu.Lock()
		b := s.mapping[sum]
		mine := b == nil
		if mine {
			b = &mapBuild{done: make(chan struct{})}
			s.mapping[sum] = b
		}
		s.mu.Unlock()
		if mine {
			b.err = s.buildMap(ctx, sum, f)
			s.mu.Lock()
			delete(s.mapping, sum)
			s.mu.Unlock()
			close(b.done)
			if b.err != nil {
				return nil, "", 0, b.err
			}
			built = true
			continue
		}
		select {
		case <-b.done:
			if b.err != nil && !errors.Is(b.err, context.Canceled) && !errors.Is(b.err, context.DeadlineExceeded) {
				return nil, "", 0, b.err
			}
		case <-ctx.Done():
			return nil, "", 0, ctx.Err()
		}
	}
}

// mapPath is where content sum's block map is cached.
func (s *Service) mapPath(sum string) string { return contentPath(s.cfg.Dir, sum) + MapSuffix }

// rawSize is the raw view's size of content sum: the file's size for a raw
// image, the virtual size in the header for a qcow2.
func (s *Service) rawSize(sum string, f osimagev1.OSImageFormat) (int64, error) {
	st, err := examine(s.cfg.Dir, sum, f)
	if err != nil {
		return 0, err
	}
	return int64(st.virtualSize), nil
}

// loadMap reads and checks the cached map of sum: a valid map
// (diskmap.Parse against its own diskmap.Digest) of the content's raw
// size. os.ErrNotExist when none is cached.
func (s *Service) loadMap(sum string, f osimagev1.OSImageFormat) ([]byte, string, int64, error) {
	data, err := os.ReadFile(s.mapPath(sum))
	if err != nil {
		return nil, "", 0, err
	}
	digest := diskmap.Digest(data)
	m, err := diskmap.Parse(data, digest)
	if err != nil {
		return nil, "", 0, err
	}
	size, err := s.rawSize(sum, f)
	if err != nil {
		return nil, "", 0, err
	}
	if m.Size != size {
		return nil, "", 0, fmt.Errorf("the cached map is of %d bytes, the image's raw view %d", m.Size, size)
	}
	return data, digest, m.Size, nil
}

// buildMap reads content sum as format f and caches its block map
// (written atomically). Content not held here is FailedPrecondition.
func (s *Service) buildMap(ctx context.Context, sum string, f osimagev1.OSImageFormat) error {
	bi, err := blockmap.Open(contentPath(s.cfg.Dir, sum), blockmap.Format(formatName(f)))
	if errors.Is(err, os.ErrNotExist) {
		return apierr.Preconditionf("OS image %s is not on this appliance yet", sum)
	}
	if err != nil {
		return fmt.Errorf("osimage: block map of %s: %w", sum, err)
	}
	defer bi.Close()
	m, err := bi.Map(ctx)
	if err != nil {
		return fmt.Errorf("osimage: block map of %s: %w", sum, err)
	}
	data, _, err := m.Marshal()
	if err != nil {
		return fmt.Errorf("osimage: block map of %s: %w", sum, err)
	}
	if err := renameio.WriteFile(s.mapPath(sum), data, 0o644); err != nil {
		return fmt.Errorf("osimage: block map of %s: %w", sum, err)
	}
	if _, err := os.Stat(contentPath(s.cfg.Dir, sum)); errors.Is(err, os.ErrNotExist) {
		// Deleted while the map was built: drop the map too.
		os.Remove(s.mapPath(sum))
		return apierr.Preconditionf("OS image %s was deleted", sum)
	}
	s.log.Info("OS image block map built", "sha256", sum, "extents", len(m.Extents), "data_bytes", m.DataBytes(), "size", m.Size)
	return nil
}

// mapMissing reports whether READY content sum, held here, has no cached
// map (the background builder's test; a bad cache is found by Raw).
func (s *Service) mapMissing(sum string) bool {
	if _, err := images.Held(s.cfg.Dir, sum); err != nil {
		return false
	}
	_, err := os.Stat(s.mapPath(sum))
	return errors.Is(err, os.ErrNotExist)
}

// startMaps starts the background builder (one at a time, owned by Run's
// wg) for the READY content held here that has no cached block map, so
// that a deploy finds it ready. s.mu is held.
func (s *Service) startMaps(ctx context.Context, wg *sync.WaitGroup) {
	if s.mapper {
		return
	}
	todo := map[string]osimagev1.OSImageFormat{}
	for sum, f := range s.ready {
		if f != formatMixed && s.mapping[sum] == nil && !s.mapFailed[sum] && s.mapMissing(sum) {
			todo[sum] = f
		}
	}
	if len(todo) == 0 {
		return
	}
	s.mapper = true
	wg.Add(1)
	go func() {
		defer wg.Done()
		for sum, f := range todo {
			if _, _, _, err := s.blockMap(ctx, sum, f); err != nil && ctx.Err() == nil {
				// Not retried in the background (Raw still tries).
				s.log.Warn("OS image block map not built", "sha256", sum, "err", err)
				s.mu.Lock()
				s.mapFailed[sum] = true
				s.mu.Unlock()
			}
		}
		s.mu.Lock()
		s.mapper = false
		s.mu.Unlock()
		s.poke() // content made READY meanwhile
	}()
}
