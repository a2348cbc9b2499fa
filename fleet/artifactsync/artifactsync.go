// Package artifactsync carries boot artifacts across a fleet. Every appliance must
// be able to serve every boot, so the boot profile's files (the discovery
// kernel and initramfs, the hypervisor initramfs) are named by content in
// a catalog manifest shared through the store, and an appliance that lacks
// one fetches it from a peer by SHA-256 over the authenticated API
// (ApplianceService.FetchArtifact, callers ROLE_APPLIANCE or admin).
//
// The catalog itself (images.Catalog) is per appliance: built from its
// local files when the boot servers start, with SHA256SUMS as its index.
// The manifest (CatalogPrefix/<name>) says which content the fleet boots
// under each name: the first appliance to publish a name sets it, the
// others fetch that content into their content store (images.ContentDir)
// and boot it (images.Config.WithFleet). iPXE binaries are not in it: each
// appliance takes them from its distribution's package.
//
// It sits beside the fleet's other shared work: it reads and writes the
// fleet's store and calls peer appliances' ApplianceService, and uses the
// images package only for the local catalog and content store. It must
// not import the appliance package that wires it.
package artifactsync

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	fleetv1 "github.com/corralhq/corral/api/fleet/v1"
	"github.com/corralhq/corral/images"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/timestamppb"
)

const (
	// CatalogPrefix holds the fleet's catalog manifest: one record per
	// boot artifact name, naming its content (SHA-256 and size).
	CatalogPrefix = store.CatalogPrefix
	// ChunkSize is the size of one FetchArtifact message's data.
	ChunkSize = 64 << 10
	// maxCatalogEntries bounds the manifest records read (the boot
	// profiles have three names).
	maxCatalogEntries = 64
	// artifactIdle is how long a fetch waits for the next chunk before it
	// gives the peer up.
	artifactIdle = 30 * time.Second
)

// Config says where a Syncer keeps artifacts and how it reaches the fleet.
type Config struct {
	// CatalogDir is this appliance's catalog directory (its content
	// store is images.ContentDir inside it).
	CatalogDir string
	// Store holds the fleet's catalog manifest (CatalogPrefix).
	Store store.Store
	// Appliance names this appliance as the publisher of its entries.
	Appliance string
	// TLS dials peers: this appliance's certificate (which carries the
	// appliance identity, so the peer sees ROLE_APPLIANCE), the fleet CA
	// as the only root, and a peer that is not an appliance refused.
	TLS *tls.Config
	// Peers lists the other live appliances' API endpoints.
	Peers func(ctx context.Context) []string
	// Interval is how often Run syncs (default a minute).
	Interval time.Duration
	// Idle is how long a fetch waits for the next chunk before it gives
	// the peer up (default 30 s).
	Idle   time.Duration
	Logger *slog.Logger
}

// Syncer publishes this appliance's boot artifacts to the fleet's manifest,
// fetches the ones it lacks from peers, and serves its own to them.
type Syncer struct {
	cfg Config
	log *slog.Logger
}

// New returns a Syncer; nothing runs until Run.
func New(cfg Config) *Syncer {
	cfg.Interval = cmp.Or(cfg.Interval, time.Minute)
	cfg.Idle = cmp.Or(cfg.Idle, artifactIdle)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Peers == nil {
		cfg.Peers = func(context.Context) []string { return nil }
	}
	return &Syncer{cfg: cfg, log: cfg.Logger}
}

// FetchArtifact serves FetchArtifact (the ApplianceService's hook, package
// fleet): the artifact this appliance holds whose SHA-256 is asked for,
// in chunks of 64 KiB, the first carrying its name and size.
func (s *Syncer) FetchArtifact(req *fleetv1.FetchArtifactRequest, stream grpc.ServerStreamingServer[fleetv1.ArtifactChunk]) error {
	err := serveArtifact(s.cfg.CatalogDir, req.GetSha256(), stream.Send)
	switch {
	case err == nil, stream.Context().Err() != nil:
	case errors.Is(err, apierr.ErrNotFound), errors.Is(err, apierr.ErrInvalid):
		s.log.Info("artifact not served", "sha256", req.GetSha256(), "err", err)
	default:
		s.log.Warn("artifact not served", "sha256", req.GetSha256(), "err", err)
	}
	return apierr.ToStatus(err)
}

// serveArtifact sends the artifact of dir whose content is sum. It hashes
// what it reads and ends with an error (DataLoss) instead of success when
// the file no longer has that content, so a file changed on disk is never
// passed off as the artifact (the receiver checks as well).
func serveArtifact(dir, sum string, send func(*fleetv1.ArtifactChunk) error) error {
	if err := images.CheckSHA256(sum); err != nil {
		return apierr.Invalidf("FetchArtifact: sha256 %q: want 64 lower-case hex digits", sum)
	}
	a, err := images.Held(dir, sum)
	if errors.Is(err, images.ErrNotFound) {
		return apierr.NotFoundf("this appliance holds no artifact with sha256 %s", sum)
	}
	if err != nil {
		return apierr.Unavailablef("artifact %s: %v", sum, err)
	}
	f, err := os.Open(a.Path)
	if err != nil {
		return apierr.Unavailablef("artifact %s (%s): %v", a.Name, sum, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return apierr.Unavailablef("artifact %s (%s): %v", a.Name, sum, err)
	}
	size := st.Size()
	h := sha256.New()
	r := io.TeeReader(io.LimitReader(f, size), h)
	buf := make([]byte, ChunkSize)
	first := true
	var sent int64
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 || first {
			c := &fleetv1.ArtifactChunk{Data: buf[:n]}
			if first {
				c.Name, c.Size, first = a.Name, uint64(size), false
			}
			if err := send(c); err != nil {
				return err
			}
			sent += int64(n)
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			return apierr.Unavailablef("artifact %s (%s): read after %d bytes: %v", a.Name, sum, sent, rerr)
		}
	}
	if sent != size {
		return apierr.DataLossf("artifact %s (%s) shrank while being sent: %d of %d bytes", a.Name, sum, sent, size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sum {
		return apierr.DataLossf("artifact %s on disk no longer has sha256 %s (it has %s): not served", a.Name, sum, got)
	}
	return nil
}

// encodeCatalogEntry makes a manifest record (fleetv1.CatalogArtifact).
func encodeCatalogEntry(a images.Artifact, by string, at time.Time) ([]byte, error) {
	return record.Marshal(&fleetv1.CatalogArtifact{Name: a.Name, Kind: string(a.Kind), Size: uint64(a.Size), Sha256: a.SHA256,
		PublishedBy: by, PublishedAt: timestamppb.New(at)})
}

// decodeCatalogEntry reads a manifest record; a record that does not name
// a valid artifact is corrupt (store.ErrCorrupt).
func decodeCatalogEntry(b []byte) (a images.Artifact, by string, err error) {
	var ca fleetv1.CatalogArtifact
	if err := record.Unmarshal(b, &ca); err != nil {
		return images.Artifact{}, "", err
	}
	a = images.Artifact{Name: ca.GetName(), Kind: images.Kind(ca.GetKind()), Size: int64(ca.GetSize()), SHA256: ca.GetSha256()}
	switch {
	case a.Name == "" || a.Name != filepath.Base(a.Name) || strings.ContainsAny(a.Name, `/\`):
		return images.Artifact{}, "", fmt.Errorf("catalog entry: name %q: %w", a.Name, store.ErrCorrupt)
	case images.CheckSHA256(a.SHA256) != nil:
		return images.Artifact{}, "", fmt.Errorf("catalog entry %s: sha256 %q: %w", a.Name, a.SHA256, store.ErrCorrupt)
	case ca.GetSize() > uint64(images.MaxArtifactBytes):
		return images.Artifact{}, "", fmt.Errorf("catalog entry %s: size %d: %w", a.Name, ca.GetSize(), store.ErrCorrupt)
	}
	return a, ca.GetPublishedBy(), nil
}

// sharedKinds are the artifact kinds the manifest shares: the boot
// profiles' files. iPXE binaries come from each appliance's own package.
func sharedKind(k images.Kind) bool { return k == images.KindKernel || k == images.KindInitrd }

// publishCatalog writes, for each boot profile artifact of arts whose name
// the manifest does not have yet, a manifest record naming its content
// (create only: compare-and-swap on revision 0, so of two appliances
// publishing a name at once one wins and the other reads it). A name the
// manifest has with other content is left as it is and logged: the
// fleet boots the manifest's. It returns the names it published.
func publishCatalog(ctx context.Context, st store.Store, arts []images.Artifact, by string, log *slog.Logger) ([]string, error) {
	var published []string
	for _, a := range arts {
		if !sharedKind(a.Kind) {
			continue
		}
		v, err := encodeCatalogEntry(a, by, time.Now())
		if err != nil {
			return published, err
		}
		key := CatalogPrefix + a.Name
		_, err = st.Put(ctx, key, v, 0)
		if err == nil {
			published = append(published, a.Name)
			log.Info("boot artifact published to the fleet's catalog", "file", a.Name, "sha256", a.SHA256, "bytes", a.Size)
			continue
		}
		if !errors.Is(err, store.ErrConflict) {
			return published, fmt.Errorf("publish %s: %w", key, err)
		}
		kv, err := st.Get(ctx, key)
		if err != nil {
			return published, fmt.Errorf("publish %s: %w", key, err)
		}
		have, from, err := decodeCatalogEntry(kv.Value)
		if err != nil {
			log.Warn("the fleet's catalog entry is unreadable; left alone", "key", key, "err", err)
			continue
		}
		if have.SHA256 != a.SHA256 {
			log.Warn("this appliance's boot artifact differs from the fleet's; the fleet's is fetched and booted",
				"file", a.Name, "sha256", a.SHA256, "fleet_sha256", have.SHA256, "published_by", from)
		}
	}
	return published, nil
}

// readCatalog returns the fleet's manifest in name order, leaving out
// records it cannot read (logged), at most maxCatalogEntries.
func readCatalog(ctx context.Context, st store.Store, log *slog.Logger) ([]images.Artifact, error) {
	kvs, err := st.List(ctx, CatalogPrefix)
	if err != nil {
		return nil, fmt.Errorf("fleet catalog: %w", err)
	}
	if len(kvs) > maxCatalogEntries {
		log.Warn("the fleet's catalog has more entries than are read", "entries", len(kvs), "read", maxCatalogEntries)
		kvs = kvs[:maxCatalogEntries]
	}
	var out []images.Artifact
	for _, kv := range kvs {
		a, _, err := decodeCatalogEntry(kv.Value)
		if err == nil && CatalogPrefix+a.Name != kv.Key {
			err = fmt.Errorf("names %s: %w", a.Name, store.ErrCorrupt)
		}
		if err != nil {
			log.Warn("unreadable entry in the fleet's catalog; skipped", "key", kv.Key, "err", err)
			continue
		}
		out = append(out, a)
	}
	return out, nil
}

// peerFetcher fetches artifacts from peer appliances into a catalog
// directory's content store.
type peerFetcher struct {
	dir string
	tls *tls.Config
	log *slog.Logger
	// idle is how long to wait for the next chunk (default artifactIdle).
	idle time.Duration
}

// Fetch fetches each artifact of manifest that the catalog directory does
// not hold, trying peers in order until one serves it intact. It returns
// the artifacts it fetched, and an error naming each artifact it could
// not get with every peer's failure. Nothing a peer sends is kept unless
// it has the manifest's size and SHA-256.
func (s *Syncer) Fetch(ctx context.Context, manifest []images.Artifact, peers []string) ([]images.Artifact, error) {
	f := &peerFetcher{dir: s.cfg.CatalogDir, tls: s.cfg.TLS, log: s.log, idle: s.cfg.Idle}
	return f.fetchMissing(ctx, manifest, peers)
}

// fetchMissing fetches each artifact of manifest that the directory does
// not hold, trying peers in order until one serves it intact. It returns
// the artifacts it fetched, and an error naming each artifact it could
// not get with every peer's failure. Nothing a peer sends is kept unless
// it has the manifest's size and SHA-256.
func (f *peerFetcher) fetchMissing(ctx context.Context, manifest []images.Artifact, peers []string) ([]images.Artifact, error) {
	var fetched []images.Artifact
	var errs errorList
	conns := map[string]*grpc.ClientConn{}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for _, want := range manifest {
		if _, err := images.Held(f.dir, want.SHA256); err == nil {
			continue
		}
		if len(peers) == 0 {
			errs = append(errs, apierr.Unavailablef("artifact %s (sha256 %s): this appliance lacks it and knows no peer to fetch it from", want.Name, want.SHA256))
			continue
		}
		var tried errorList
		for _, p := range peers {
			conn, ok := conns[p]
			if !ok {
				c, err := grpc.NewClient(p, grpc.WithTransportCredentials(credentials.NewTLS(f.tls)))
				if err != nil {
					tried = append(tried, fmt.Errorf("peer %s: %w", p, err))
					continue
				}
				conns[p], conn = c, c
			}
			got, err := f.fetchFrom(ctx, conn, p, want)
			if err == nil {
				fetched = append(fetched, got)
				f.log.Info("boot artifact fetched from a peer", "file", want.Name, "sha256", want.SHA256, "bytes", got.Size, "peer", p)
				break
			}
			f.log.Warn("boot artifact not fetched from a peer", "file", want.Name, "sha256", want.SHA256, "peer", p, "err", err)
			tried = append(tried, err)
			if ctx.Err() != nil {
				return fetched, ctx.Err()
			}
		}
		if len(tried) == len(peers) {
			errs = append(errs, fmt.Errorf("artifact %s (sha256 %s): %w", want.Name, want.SHA256, tried))
		}
	}
	if len(errs) == 0 {
		return fetched, nil
	}
	return fetched, errs
}

// errorList is several errors on one line, each kept for errors.Is.
type errorList []error

func (l errorList) Error() string {
	s := make([]string, len(l))
	for i, e := range l {
		s[i] = e.Error()
	}
	return strings.Join(s, "; ")
}

func (l errorList) Unwrap() []error { return l }

// fetchFrom fetches want from the peer at endpoint over conn. Its errors
// name the peer; a peer whose bytes are not want's wraps images.ErrMismatch.
func (f *peerFetcher) fetchFrom(ctx context.Context, conn *grpc.ClientConn, endpoint string, want images.Artifact) (images.Artifact, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	idle := f.idle
	if idle <= 0 {
		idle = artifactIdle
	}
	// A peer that stops sending is given up after idle without a chunk.
	var idled atomic.Bool
	watchdog := time.AfterFunc(idle, func() { idled.Store(true); cancel() })
	defer watchdog.Stop()
	peerErr := func(err error) error {
		if idled.Load() {
			return fmt.Errorf("peer %s: %w (no data for %s)", endpoint, err, idle)
		}
		return fmt.Errorf("peer %s: %w", endpoint, err)
	}
	stream, err := fleetv1.NewApplianceServiceClient(conn).FetchArtifact(ctx, &fleetv1.FetchArtifactRequest{Sha256: want.SHA256})
	if err != nil {
		return images.Artifact{}, peerErr(err)
	}
	first, err := stream.Recv()
	if err != nil {
		return images.Artifact{}, peerErr(err)
	}
	if first.GetSize() != uint64(want.Size) {
		return images.Artifact{}, peerErr(fmt.Errorf("%w: %s is %d bytes there, the fleet's catalog says %d", images.ErrMismatch, want.Name, first.GetSize(), want.Size))
	}
	watchdog.Reset(idle)
	got, err := images.Receive(f.dir, want, &chunkReader{stream: stream, buf: first.GetData(), watchdog: watchdog, idle: idle})
	if err != nil {
		return images.Artifact{}, peerErr(err)
	}
	return got, nil
}

// chunkReader reads a FetchArtifact stream as bytes; each chunk received
// resets the idle watchdog.
type chunkReader struct {
	stream   grpc.ServerStreamingClient[fleetv1.ArtifactChunk]
	buf      []byte
	watchdog *time.Timer
	idle     time.Duration
	err      error // the stream's end (io.EOF) or failure
}

func (r *chunkReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		c, err := r.stream.Recv()
		if err != nil {
			r.err = err
			continue
		}
		r.watchdog.Reset(r.idle)
		r.buf = c.GetData()
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// Sync publishes this appliance's boot profile artifacts to the
// fleet's catalog manifest (names it does not have yet) and fetches the
// manifest's artifacts this appliance lacks from peers (Config.Peers when
// peers is nil). It returns what it fetched; its error names every
// artifact it could not get and why, peer by peer. The boot servers serve
// fetched artifacts from their next start (images.Config.WithFleet).
// Concurrent calls are safe: publishing is create-only and storing an
// artifact is a rename of verified bytes.
func (s *Syncer) Sync(ctx context.Context, peers []string) ([]images.Artifact, error) {
	local, err := images.ReadSums(s.cfg.CatalogDir)
	if err != nil {
		return nil, err
	}
	if _, err := publishCatalog(ctx, s.cfg.Store, local, s.cfg.Appliance, s.log); err != nil {
		return nil, err
	}
	manifest, err := readCatalog(ctx, s.cfg.Store, s.log)
	if err != nil {
		return nil, err
	}
	if peers == nil {
		peers = s.cfg.Peers(ctx)
	}
	return s.Fetch(ctx, manifest, peers)
}

// Run syncs the fleet's boot artifacts every Config.Interval until ctx
// ends; failures are logged and retried.
func (s *Syncer) Run(ctx context.Context) error {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		if _, err := s.Sync(ctx, nil); err != nil && ctx.Err() == nil {
			s.log.Warn("boot artifacts not in sync with the fleet", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Manifest returns the fleet's catalog manifest in name order, leaving out
// records it cannot read (logged).
func (s *Syncer) Manifest(ctx context.Context) ([]images.Artifact, error) {
	return readCatalog(ctx, s.cfg.Store, s.log)
}
