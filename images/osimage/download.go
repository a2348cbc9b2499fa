package osimage

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	osimagev1 "github.com/corralhq/corral/api/osimage/v1"
	"github.com/corralhq/corral/images"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store/record"
)

// defaultClient downloads with bounded connection set-up and response
// header waits (a body may take as long as it keeps flowing: Config.Idle
// bounds a stall) and follows redirects to http and https only.
func defaultClient() *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			TLSHandshakeTimeout:   30 * time.Second,
			ResponseHeaderTimeout: time.Minute,
			MaxIdleConns:          4,
			IdleConnTimeout:       90 * time.Second,
		},
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= 10 {
				return errors.New("more than 10 redirects")
			}
			if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
				return fmt.Errorf("redirect to %s: only http and https are followed", req.URL.Redacted())
			}
			return nil
		},
	}
}

// Run downloads the images this appliance registered, resumes the ones a
// restart interrupted, and in a fleet fetches the READY images it lacks
// from peers: it scans the records when woken (Register) and every
// SyncInterval. When ctx ends it cancels the downloads, waits for them
// and returns nil; an interrupted download is resumed by the next Run.
func (s *Service) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	t := time.NewTicker(s.cfg.SyncInterval)
	defer t.Stop()
	for {
		s.scan(ctx, &wg)
		select {
		case <-ctx.Done():
			return nil
		case <-s.wake:
		case <-t.C:
		}
	}
}

// scan starts the downloads due, refreshes the READY set and starts a
// peer fetch of READY content this appliance lacks.
func (s *Service) scan(ctx context.Context, wg *sync.WaitGroup) {
	s.mu.Lock()
	clear(s.fresh)
	s.mu.Unlock()
	all, err := s.List(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("OS images not scanned", "err", err)
		}
		return
	}
	ready := map[string]osimagev1.OSImageFormat{}
	var missing []images.Artifact
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, im := range all {
		switch im.GetState() {
		case osimagev1.OSImageState_OS_IMAGE_STATE_READY:
			ready[im.GetSha256()] = mergeFormat(ready[im.GetSha256()], im.GetFormat())
			if _, err := images.Held(s.cfg.Dir, im.GetSha256()); err != nil {
				missing = append(missing, images.Artifact{Name: im.GetName(), SHA256: im.GetSha256(), Size: int64(im.GetSizeBytes())})
			}
		case osimagev1.OSImageState_OS_IMAGE_STATE_PENDING, osimagev1.OSImageState_OS_IMAGE_STATE_DOWNLOADING:
			if im.GetAnnotations()[AnnotationDownloader] != s.cfg.Appliance || s.running[im.GetName()] != nil || len(s.running) >= s.cfg.Parallel {
				continue
			}
			dctx, cancel := context.WithCancel(ctx)
			d := &download{cancel: cancel, done: make(chan struct{})}
			s.running[im.GetName()] = d
			wg.Add(1)
			go func(name string) {
				defer wg.Done()
				defer close(d.done)
				defer cancel()
				s.download(dctx, name)
				s.mu.Lock()
				delete(s.running, name)
				s.mu.Unlock()
				s.poke() // a slot is free
			}(im.GetName())
		default:
			// FAILED stays as it is; UNSPECIFIED is not written.
		}
	}
	for sum, f := range s.fresh {
		ready[sum] = mergeFormat(ready[sum], f) // made READY after the list was read
	}
	s.ready = ready
	s.startMaps(ctx, wg)
	if len(missing) > 0 && s.cfg.Fetch != nil && s.cfg.Peers != nil && !s.fetching {
		s.fetching = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.fetchFromPeers(ctx, missing)
			s.mu.Lock()
			s.fetching = false
			s.mu.Unlock()
		}()
	}
}

// fetchFromPeers fetches READY images this appliance lacks from its
// peers (by SHA-256 and size, checked on arrival).
func (s *Service) fetchFromPeers(ctx context.Context, missing []images.Artifact) {
	peers := s.cfg.Peers(ctx)
	if len(peers) == 0 {
		return
	}
	got, err := s.cfg.Fetch.Fetch(ctx, missing, peers)
	for _, a := range got {
		s.log.Info("OS image fetched from a peer", "os_image", a.Name, "sha256", a.SHA256, "bytes", a.Size)
	}
	if err != nil && ctx.Err() == nil {
		s.log.Warn("OS images not fetched from peers", "err", err)
	}
}

// download fetches the image called name into the content store and
// records the outcome: READY, or FAILED with the reason. A record that is
// gone or no longer PENDING or DOWNLOADING is left alone.
func (s *Service) download(ctx context.Context, name string) {
	key := Prefix + name
	im, err := record.Update(ctx, s.cfg.Store, key, newImage, func(im *osimagev1.OSImage, exists bool) (bool, error) {
		if !exists {
			return false, errGone
		}
		switch im.GetState() {
		case osimagev1.OSImageState_OS_IMAGE_STATE_PENDING, osimagev1.OSImageState_OS_IMAGE_STATE_DOWNLOADING:
		default:
			return false, errGone
		}
		im.State = osimagev1.OSImageState_OS_IMAGE_STATE_DOWNLOADING
		im.ReceivedBytes = 0
		return false, nil
	})
	if err != nil {
		if !errors.Is(err, errGone) && ctx.Err() == nil {
			s.log.Warn("OS image download not started", "os_image", name, "err", err)
		}
		return
	}
	log := s.log.With("os_image", name, "sha256", im.GetSha256())
	log.Info("OS image download started", "url", im.GetSourceUrl())
	start := time.Now()
	got, ferr := s.fetch(ctx, im)
	if ctx.Err() != nil {
		// Stopped (Delete, shutdown): the record is left as it is; a
		// deleted one is gone, a shutdown resumes at the next Run.
		log.Info("OS image download stopped", "after", time.Since(start).Round(time.Millisecond).String())
		return
	}
	now := timestamppb.New(s.cfg.Now())
	_, uerr := record.Update(context.WithoutCancel(ctx), s.cfg.Store, key, newImage, func(cur *osimagev1.OSImage, exists bool) (bool, error) {
		if !exists || cur.GetState() != osimagev1.OSImageState_OS_IMAGE_STATE_DOWNLOADING || cur.GetSha256() != im.GetSha256() {
			return false, errGone
		}
		if ferr != nil {
			cur.State = osimagev1.OSImageState_OS_IMAGE_STATE_FAILED
			cur.Reason = ferr.Error()
		} else {
			markReady(cur, got, now)
		}
		return false, nil
	})
	switch {
	case errors.Is(uerr, errGone):
		// Deleted on another appliance meanwhile: drop what was stored.
		if ferr == nil {
			s.removeUnreferenced(context.WithoutCancel(ctx), im.GetSha256(), "")
		}
	case uerr != nil:
		log.Warn("OS image download outcome not recorded", "err", uerr)
	case ferr != nil:
		log.Warn("OS image download failed", "err", ferr)
	default:
		s.setReady(im.GetSha256(), im.GetFormat())
		log.Info("OS image ready", "bytes", got.size, "duration", time.Since(start).Round(time.Millisecond).String())
	}
}

// errGone ends an update whose record is gone or moved on.
var errGone = errors.New("osimage: record gone or changed")

// fetch downloads im's URL into the content store (or finds its content
// already there), writing progress to the record about once a second.
func (s *Service) fetch(ctx context.Context, im *osimagev1.OSImage) (stored, error) {
	if _, err := images.Held(s.cfg.Dir, im.GetSha256()); err == nil {
		if got, err := examine(s.cfg.Dir, im.GetSha256(), im.GetFormat()); err == nil || errors.Is(err, apierr.ErrInvalid) {
			return got, err
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var idled atomic.Bool
	watchdog := time.AfterFunc(s.cfg.Idle, func() { idled.Store(true); cancel() })
	defer watchdog.Stop()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, im.GetSourceUrl(), nil)
	if err != nil {
		return stored{}, fmt.Errorf("GET %s: %w", im.GetSourceUrl(), err)
	}
	resp, err := s.cfg.HTTP.Do(req)
	if err != nil {
		return stored{}, s.idleErr(&idled, fmt.Errorf("GET %s: %w", req.URL.Redacted(), err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return stored{}, fmt.Errorf("GET %s: %s", req.URL.Redacted(), resp.Status)
	}
	if resp.ContentLength > s.cfg.MaxBytes {
		return stored{}, fmt.Errorf("GET %s: %d bytes, more than the %d this appliance accepts (--os-image-max-bytes)", req.URL.Redacted(), resp.ContentLength, s.cfg.MaxBytes)
	}
	size := int64(-1)
	if resp.ContentLength >= 0 {
		size = resp.ContentLength
	}
	if size >= 0 {
		s.progress(ctx, im.GetName(), 0, uint64(size))
	}
	var last time.Time
	got, err := receive(s.cfg.Dir, want{sha256: im.GetSha256(), format: im.GetFormat(), size: size, max: s.cfg.MaxBytes}, resp.Body, func(n int64) {
		watchdog.Reset(s.cfg.Idle)
		if now := time.Now(); now.Sub(last) >= progressEvery {
			last = now
			s.progress(ctx, im.GetName(), uint64(n), 0)
		}
	})
	if err != nil {
		return stored{}, s.idleErr(&idled, fmt.Errorf("GET %s: %w", req.URL.Redacted(), err))
	}
	return got, nil
}

func (s *Service) idleErr(idled *atomic.Bool, err error) error {
	if idled.Load() {
		return fmt.Errorf("%w (no data for %s)", err, s.cfg.Idle)
	}
	return err
}

// progress writes a download's received bytes (and its size, when known
// and size is not 0) to its record; a failure is only logged.
func (s *Service) progress(ctx context.Context, name string, received, size uint64) {
	_, err := record.Update(ctx, s.cfg.Store, Prefix+name, newImage, func(im *osimagev1.OSImage, exists bool) (bool, error) {
		if !exists || im.GetState() != osimagev1.OSImageState_OS_IMAGE_STATE_DOWNLOADING {
			return false, errGone
		}
		im.ReceivedBytes = received
		if size != 0 {
			im.SizeBytes = size
		}
		return false, nil
	})
	if err != nil && !errors.Is(err, errGone) && ctx.Err() == nil {
		s.log.Debug("OS image progress not recorded", "os_image", name, "err", err)
	}
}
