package appliance

import (
	"crypto/tls"
	"path/filepath"
	"time"

	"github.com/corralhq/corral/api/clientconfig"
	"github.com/corralhq/corral/fleet/artifactsync"
)

// artifactSyncInterval is how often an appliance of a fleet publishes its
// boot artifacts to the fleet's manifest and fetches the ones it lacks.
const artifactSyncInterval = time.Minute

// catalogDir is this appliance's catalog directory.
func (s *Server) catalogDir() string { return filepath.Join(s.cfg.DataDir, ImagesDir) }

// initArtifacts prepares the fleet's artifact sync (package
// fleet/artifactsync): every appliance serves FetchArtifact; one on etcd
// also syncs every artifactSyncInterval.
func (s *Server) initArtifacts() {
	s.artifacts = artifactsync.New(artifactsync.Config{CatalogDir: s.catalogDir(), Store: s.store, Appliance: s.cfg.Fleet.Name,
		TLS: s.peerTLS(), Peers: s.peerEndpoints, Interval: artifactSyncInterval, Logger: s.log.With("component", "artifacts")})
	if s.cfg.Store.Kind == StoreEtcd {
		s.addComponent("artifact-sync", s.artifacts.Run)
	}
}

// peerTLS is the client configuration for calling peer appliances.
func (s *Server) peerTLS() *tls.Config {
	return &tls.Config{
		Certificates:     []tls.Certificate{s.cert},
		RootCAs:          s.ca.Pool(),
		VerifyConnection: clientconfig.VerifyApplianceConnection,
		MinVersion:       tls.VersionTLS12,
	}
}
