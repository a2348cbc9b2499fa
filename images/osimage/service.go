package osimage

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	osimagev1 "github.com/corralhq/corral/api/osimage/v1"
	"github.com/corralhq/corral/images"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
)

// Prefix holds the OS image records, one per name.
const Prefix = store.OSImagesPrefix

// PathPrefix is where the boot HTTP server serves READY images:
// PathPrefix + <sha256>.
const PathPrefix = "/os-images/"

// AnnotationDownloader names the appliance that downloads a registered
// image (a system annotation: the appliance that took the Register).
const AnnotationDownloader = "corral/os_image/downloader"

// Defaults.
const (
	// DefaultMaxBytes is the largest image accepted unless configured
	// lower. It is also the most a fleet peer fetch accepts
	// (images.MaxArtifactBytes), so every image an appliance stores can
	// travel to its peers.
	DefaultMaxBytes = images.MaxArtifactBytes
	// DefaultParallel is how many downloads run at once.
	DefaultParallel = 2
	// DefaultSyncInterval is how often Run rescans the records: resumes
	// downloads, fetches READY images this appliance lacks from peers.
	DefaultSyncInterval = 30 * time.Second
	// DefaultIdle is how long a download waits for its next bytes.
	DefaultIdle = time.Minute
	// progressEvery is how often a download's progress is written to
	// its record.
	progressEvery = time.Second
)

// Fetcher fetches content from peer appliances into this appliance's
// content store, each artifact by its SHA-256 and size, checking both
// (fleet/artifactsync's Syncer.Fetch).
type Fetcher interface {
	Fetch(ctx context.Context, want []images.Artifact, peers []string) ([]images.Artifact, error)
}

// Config configures a Service.
type Config struct {
	// Store holds the records (Prefix).
	Store store.Store
	// Dir is the catalog directory; images are kept in its content store
	// (images.ContentDir).
	Dir string
	// MaxBytes bounds an image's size (default and most: DefaultMaxBytes).
	MaxBytes int64
	// HTTP downloads registered images (default: a client with dial, TLS
	// and response-header timeouts). Only http and https URLs are
	// followed, redirects included.
	HTTP *http.Client
	// Appliance names this appliance (the downloader of the images it
	// registers).
	Appliance string
	// InUse, when set, says which machine uses an image (name) so that
	// Delete refuses it; "" when none does. Deploys will set it.
	InUse func(ctx context.Context, name string) (string, error)
	// Fetch and Peers, when set (a fleet), fetch READY images this
	// appliance lacks from its peers.
	Fetch Fetcher
	Peers func(ctx context.Context) []string
	// Parallel bounds concurrent downloads (default DefaultParallel).
	Parallel int
	// SyncInterval is how often Run rescans (default DefaultSyncInterval).
	SyncInterval time.Duration
	// Idle gives a download up after this long without bytes (default
	// DefaultIdle).
	Idle   time.Duration
	Logger *slog.Logger
	Now    func() time.Time
}

// Service registers, uploads and serves OS images. Its methods are safe
// for concurrent use; downloads run under Run.
type Service struct {
	cfg  Config
	log  *slog.Logger
	wake chan struct{}

	mu sync.Mutex
	// running downloads by name: cancel and a channel closed at their end.
	running map[string]*download
	// ready holds the SHA-256 of every READY image this appliance knows
	// of (refreshed by each scan and each local change) and its declared
	// format (formatMixed when images disagree): Open and OpenRaw serve
	// no other content.
	ready map[string]osimagev1.OSImageFormat
	// fresh holds the content made READY here since the last scan began
	// its list, which that list may predate: the scan keeps it.
	fresh    map[string]osimagev1.OSImageFormat
	fetching bool
	// mapping holds the block maps being built, by content; mapper says
	// the background builder runs.
	mapping map[string]*mapBuild
	mapper  bool
	// mapFailed holds the content whose map the background builder could
	// not build (not tried again until the content leaves and returns).
	mapFailed map[string]bool
}

type download struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// New checks cfg and returns a Service; nothing runs until Run.
func New(cfg Config) (*Service, error) {
	if cfg.Store == nil || cfg.Dir == "" {
		return nil, errors.New("osimage: Config.Store and Config.Dir are required")
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.MaxBytes < 0 || cfg.MaxBytes > DefaultMaxBytes {
		return nil, fmt.Errorf("osimage: the largest image must be 1..%d bytes (what a fleet peer fetch accepts), not %d", int64(DefaultMaxBytes), cfg.MaxBytes)
	}
	if cfg.HTTP == nil {
		cfg.HTTP = defaultClient()
	}
	cfg.Parallel = cmp.Or(cfg.Parallel, DefaultParallel)
	cfg.SyncInterval = cmp.Or(cfg.SyncInterval, DefaultSyncInterval)
	cfg.Idle = cmp.Or(cfg.Idle, DefaultIdle)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Service{cfg: cfg, log: cfg.Logger, wake: make(chan struct{}, 1), running: map[string]*download{},
		ready: map[string]osimagev1.OSImageFormat{}, fresh: map[string]osimagev1.OSImageFormat{}, mapping: map[string]*mapBuild{}, mapFailed: map[string]bool{}}, nil
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,126}[A-Za-z0-9])?$`)

func checkName(name string) error {
	if !nameRE.MatchString(name) {
		return apierr.Invalidf("name %q is malformed: use 1-128 letters, digits, '.', '_' or '-', starting and ending with a letter or digit", name)
	}
	return nil
}

func checkFormat(f osimagev1.OSImageFormat) error {
	switch f {
	case osimagev1.OSImageFormat_OS_IMAGE_FORMAT_RAW, osimagev1.OSImageFormat_OS_IMAGE_FORMAT_QCOW2:
		return nil
	default:
	}
	return apierr.Invalidf("format %v: declare raw or qcow2 (the format is never guessed)", f)
}

func checkMeta(ann, labels map[string]string) error {
	for what, m := range map[string]map[string]string{"annotation": ann, "label": labels} {
		for k, v := range m {
			if k == "" || len(k) > 253 || strings.ContainsAny(k, " \t\r\n") {
				return apierr.Invalidf("%s key %q is malformed", what, k)
			}
			if len(v) > 4096 {
				return apierr.Invalidf("%s %q value is longer than 4096 bytes", what, k)
			}
		}
	}
	for k := range ann {
		if strings.HasPrefix(k, "corral/") {
			return apierr.Invalidf("annotation %q is set by the system and cannot be given", k)
		}
	}
	return nil
}

// checkURL allows http and https URLs with a host.
func checkURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return apierr.Invalidf("source_url %q: want an http:// or https:// URL", raw)
	}
	return nil
}

func newImage() *osimagev1.OSImage { return &osimagev1.OSImage{} }

// Register records an image to download from req's URL, PENDING, and
// wakes Run to download it. Registering an image again with the same URL,
// SHA-256 and format returns it unchanged (whatever its state); a name
// taken by another is AlreadyExists.
func (s *Service) Register(ctx context.Context, req *osimagev1.RegisterOSImageRequest) (*osimagev1.OSImage, error) {
	if err := checkName(req.GetName()); err != nil {
		return nil, err
	}
	if err := checkURL(req.GetSourceUrl()); err != nil {
		return nil, err
	}
	if err := images.CheckSHA256(req.GetSha256()); err != nil {
		return nil, apierr.Invalidf("sha256 %q: want 64 lower-case hex digits", req.GetSha256())
	}
	if err := checkFormat(req.GetFormat()); err != nil {
		return nil, err
	}
	if err := checkMeta(req.GetAnnotations(), req.GetLabels()); err != nil {
		return nil, err
	}
	im := &osimagev1.OSImage{
		Name: req.GetName(), Annotations: maps.Clone(req.GetAnnotations()), Labels: maps.Clone(req.GetLabels()),
		SourceUrl: req.GetSourceUrl(), Sha256: req.GetSha256(), Format: req.GetFormat(),
		State: osimagev1.OSImageState_OS_IMAGE_STATE_PENDING, CreatedAt: timestamppb.New(s.cfg.Now()),
	}
	if im.Annotations == nil {
		im.Annotations = map[string]string{}
	}
	im.Annotations[AnnotationDownloader] = s.cfg.Appliance
	if _, err := record.Put(ctx, s.cfg.Store, Prefix+im.GetName(), im, 0); err != nil {
		if !errors.Is(err, store.ErrConflict) {
			return nil, err
		}
		// Registered again (an apply file run twice): the same image is
		// no change; another under the same name is refused.
		have, gerr := s.Get(ctx, im.GetName())
		if gerr == nil && have.GetSourceUrl() == im.GetSourceUrl() && have.GetSha256() == im.GetSha256() && have.GetFormat() == im.GetFormat() {
			return have, nil
		}
		return nil, apierr.Existsf("OS image %q already exists with another URL, hash or format (delete it first)", im.GetName())
	}
	s.log.Info("OS image registered", "os_image", im.GetName(), "url", im.GetSourceUrl(), "sha256", im.GetSha256(), "format", formatName(im.GetFormat()))
	s.poke()
	return im, nil
}

// poke wakes Run without blocking.
func (s *Service) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// UploadHeader is what an upload declares before its bytes.
type UploadHeader = osimagev1.UploadOSImageHeader

// Upload stores the bytes r reads as the image h declares and records it
// READY. Bytes that are short, long, of another SHA-256 or not the
// declared format are refused and nothing is kept (no file, no record). A
// name already taken is AlreadyExists, checked before any byte is read
// and again when the record is written.
func (s *Service) Upload(ctx context.Context, h *UploadHeader, r io.Reader) (*osimagev1.OSImage, error) {
	if err := checkName(h.GetName()); err != nil {
		return nil, err
	}
	if err := images.CheckSHA256(h.GetSha256()); err != nil {
		return nil, apierr.Invalidf("sha256 %q: want 64 lower-case hex digits", h.GetSha256())
	}
	if err := checkFormat(h.GetFormat()); err != nil {
		return nil, err
	}
	if err := checkMeta(h.GetAnnotations(), h.GetLabels()); err != nil {
		return nil, err
	}
	if h.GetSizeBytes() == 0 {
		return nil, apierr.Invalidf("size_bytes: declare the file's exact size")
	}
	if h.GetSizeBytes() > uint64(s.cfg.MaxBytes) {
		return nil, apierr.Exhaustedf("the image is %d bytes, more than the %d this appliance accepts (--os-image-max-bytes)", h.GetSizeBytes(), s.cfg.MaxBytes)
	}
	key := Prefix + h.GetName()
	if _, err := s.cfg.Store.Get(ctx, key); err == nil {
		return nil, apierr.Existsf("OS image %q already exists", h.GetName())
	} else if !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	got, err := receive(s.cfg.Dir, want{sha256: h.GetSha256(), format: h.GetFormat(), size: int64(h.GetSizeBytes()), max: s.cfg.MaxBytes}, r, nil)
	if err != nil {
		s.log.Info("OS image upload refused", "os_image", h.GetName(), "sha256", h.GetSha256(), "err", err)
		return nil, err
	}
	now := timestamppb.New(s.cfg.Now())
	im := &osimagev1.OSImage{
		Name: h.GetName(), Annotations: maps.Clone(h.GetAnnotations()), Labels: maps.Clone(h.GetLabels()),
		Sha256: h.GetSha256(), Format: h.GetFormat(), CreatedAt: now,
	}
	markReady(im, got, now)
	if _, err := record.Put(ctx, s.cfg.Store, key, im, 0); err != nil {
		s.removeUnreferenced(context.WithoutCancel(ctx), h.GetSha256(), "")
		if errors.Is(err, store.ErrConflict) {
			return nil, apierr.Existsf("OS image %q already exists", h.GetName())
		}
		return nil, err
	}
	s.setReady(im.GetSha256(), im.GetFormat())
	s.log.Info("OS image uploaded", "os_image", im.GetName(), "sha256", im.GetSha256(), "bytes", got.size, "format", formatName(im.GetFormat()))
	return im, nil
}

// markReady fills im's status from the stored file.
func markReady(im *osimagev1.OSImage, got stored, now *timestamppb.Timestamp) {
	im.State = osimagev1.OSImageState_OS_IMAGE_STATE_READY
	im.Reason = ""
	im.SizeBytes = uint64(got.size)
	im.ReceivedBytes = uint64(got.size)
	im.VirtualSizeBytes = got.virtualSize
	im.ReadyAt = now
	im.Path = PathPrefix + im.GetSha256()
}

// Get returns the image called name.
func (s *Service) Get(ctx context.Context, name string) (*osimagev1.OSImage, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	im := newImage()
	if _, err := record.Get(ctx, s.cfg.Store, Prefix+name, im); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, apierr.NotFoundf("OS image %q", name)
		}
		return nil, err
	}
	return im, nil
}

// List returns every image in name order.
func (s *Service) List(ctx context.Context) ([]*osimagev1.OSImage, error) {
	return record.List(ctx, s.cfg.Store, Prefix, newImage)
}

// Delete removes the image called name: it stops its download if this
// appliance runs one, deletes the record, and removes the stored file
// when no other image has the same content. An image a machine uses
// (Config.InUse) is refused (FailedPrecondition).
func (s *Service) Delete(ctx context.Context, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if s.cfg.InUse != nil {
		by, err := s.cfg.InUse(ctx, name)
		if err != nil {
			return err
		}
		if by != "" {
			return apierr.Preconditionf("OS image %q is in use by machine %q", name, by)
		}
	}
	s.stopDownload(name)
	im, err := record.Update(ctx, s.cfg.Store, Prefix+name, newImage, func(_ *osimagev1.OSImage, exists bool) (bool, error) {
		if !exists {
			return false, apierr.NotFoundf("OS image %q", name)
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	s.removeUnreferenced(ctx, im.GetSha256(), name)
	s.log.Info("OS image deleted", "os_image", name, "sha256", im.GetSha256())
	return nil
}

// stopDownload cancels name's download on this appliance, if one runs,
// and waits for it to end.
func (s *Service) stopDownload(name string) {
	s.mu.Lock()
	d := s.running[name]
	s.mu.Unlock()
	if d != nil {
		d.cancel()
		<-d.done
	}
}

// removeUnreferenced removes the stored content sum unless an image other
// than except is READY with it (or still on its way to it).
func (s *Service) removeUnreferenced(ctx context.Context, sum, except string) {
	if images.CheckSHA256(sum) != nil {
		return
	}
	all, err := s.List(ctx)
	if err != nil {
		s.log.Warn("OS image content kept: the records could not be read", "sha256", sum, "err", err)
		return
	}
	for _, im := range all {
		if im.GetName() != except && im.GetSha256() == sum && im.GetState() != osimagev1.OSImageState_OS_IMAGE_STATE_FAILED {
			return
		}
	}
	s.setReady(sum, 0)
	for _, p := range []string{contentPath(s.cfg.Dir, sum), s.mapPath(sum)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.log.Warn("OS image content not removed", "sha256", sum, "path", p, "err", err)
		}
	}
}

// setReady records content sum READY here as format f (0: no longer
// READY) and, when READY, wakes Run to build its block map.
func (s *Service) setReady(sum string, f osimagev1.OSImageFormat) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f != 0 {
		s.ready[sum] = mergeFormat(s.ready[sum], f)
		s.fresh[sum] = mergeFormat(s.fresh[sum], f)
		s.poke()
	} else {
		delete(s.ready, sum)
		delete(s.fresh, sum)
		delete(s.mapFailed, sum)
	}
}

// Open opens the stored content of a READY image by its SHA-256, for the
// boot HTTP server (which answers ranges from the file). Content that no
// READY image has, or that this appliance does not hold (yet), is
// NotFound. The caller closes the file.
func (s *Service) Open(sum string) (*os.File, images.Artifact, error) {
	if err := images.CheckSHA256(sum); err != nil {
		return nil, images.Artifact{}, apierr.Invalidf("%q is not a SHA-256 (64 lower-case hex digits)", sum)
	}
	s.mu.Lock()
	_, ok := s.ready[sum]
	s.mu.Unlock()
	if !ok {
		return nil, images.Artifact{}, apierr.NotFoundf("no READY OS image has sha256 %s", sum)
	}
	f, err := os.Open(contentPath(s.cfg.Dir, sum))
	if errors.Is(err, os.ErrNotExist) {
		return nil, images.Artifact{}, apierr.NotFoundf("OS image %s is not on this appliance yet", sum)
	}
	if err != nil {
		return nil, images.Artifact{}, fmt.Errorf("osimage: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, images.Artifact{}, fmt.Errorf("osimage: %w", err)
	}
	return f, images.Artifact{Name: sum, Path: f.Name(), Size: st.Size(), SHA256: sum}, nil
}

// formatName is "raw" or "qcow2".
func formatName(f osimagev1.OSImageFormat) string {
	return strings.ToLower(strings.TrimPrefix(f.String(), "OS_IMAGE_FORMAT_"))
}
