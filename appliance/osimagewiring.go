package appliance

import (
	"net"
	"time"

	"github.com/corralhq/corral/images/osimage"
)

// OSImagesConfig configures operating-system images (package
// images/osimage).
type OSImagesConfig struct {
	// MaxBytes bounds one image (--os-image-max-bytes; 0: the default and
	// most, osimage.DefaultMaxBytes, what a fleet peer fetch accepts).
	MaxBytes int64
	// SyncInterval is how often the records are rescanned: downloads
	// resumed, READY images this appliance lacks fetched from peers (0:
	// osimage.DefaultSyncInterval; tests shorten it).
	SyncInterval time.Duration
}

// initOSImages wires OSImageService: records in the store, bytes in the
// catalog directory's content store beside the boot artifacts, served by
// the boot HTTP server at /os-images/<sha256> (initBoot) and, in a fleet,
// fetched from peers the way boot artifacts are (the artifact syncer's
// FetchArtifact path). Call it after initArtifacts.
func (s *Server) initOSImages() error {
	cfg := osimage.Config{Store: s.store, Dir: s.catalogDir(), MaxBytes: s.cfg.OSImages.MaxBytes, SyncInterval: s.cfg.OSImages.SyncInterval, Appliance: s.cfg.Fleet.Name,
		Logger: s.log.With("component", "os-images")}
	if s.cfg.Store.Kind == StoreEtcd {
		cfg.Fetch, cfg.Peers = s.artifacts, s.peerEndpoints
	}
	svc, err := osimage.New(cfg)
	if err != nil {
		return err
	}
	s.osImages = svc
	osimage.Register(s.grpc, svc)
	s.addComponent("os-images", svc.Run)
	return nil
}

// BootHTTPAddr is the boot HTTP server's address (nil when network boot is
// off).
func (s *Server) BootHTTPAddr() net.Addr {
	if s.bootHTTP == nil {
		return nil
	}
	return s.bootHTTP.Addr()
}
