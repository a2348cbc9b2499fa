package pool

import (
	"log/slog"
	"time"

	"github.com/corralhq/corral/store"
)

// Store key prefixes.
const (
	nodePrefix    = store.NodesPrefix
	networkPrefix = store.NetworksPrefix
	networkIndex  = store.NetworkIndexKey
)

// Config configures a Pool. Zero values take the documented defaults.
type Config struct {
	Store  store.Store
	Logger *slog.Logger
	// CPULimitRatio bounds the sum of CPU limits on a node to ratio x
	// capacity (default 4: CPU limits may be overcommitted).
	CPULimitRatio float64
	// MemoryLimitRatio bounds the sum of memory limits (default 1: no
	// memory overcommit, since VMs run without ballooning).
	MemoryLimitRatio float64
	// StorageLimitRatio bounds the sum of storage limits (default 1; raise
	// it to thin-provision qcow2 volumes).
	StorageLimitRatio float64
	// Now is the clock (default time.Now).
	Now func() time.Time
	// HeartbeatWriteAfter, when positive, leaves unwritten an ApplyNode
	// that changes nothing but the heartbeat of a READY node whose stored
	// heartbeat is younger than this; the beat is kept in memory for the
	// sweep and reads (beats.go). Zero writes every beat. In a fleet it
	// must stay below HeartbeatTimeout minus the nodes' beat interval.
	HeartbeatWriteAfter time.Duration
}

// Pool implements the node pool on a store. It is safe for concurrent use
// by any number of goroutines and processes sharing the store.
type Pool struct {
	cfg   Config
	log   *slog.Logger
	beats beatTable // heartbeats received here (beats.go)
	start time.Time // when this Pool was made
}

// New validates cfg, fills defaults and returns a Pool.
func New(cfg Config) (*Pool, error) {
	if cfg.Store == nil {
		return nil, invalidf("pool: Config.Store is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.CPULimitRatio == 0 {
		cfg.CPULimitRatio = 4
	}
	if cfg.MemoryLimitRatio == 0 {
		cfg.MemoryLimitRatio = 1
	}
	if cfg.StorageLimitRatio == 0 {
		cfg.StorageLimitRatio = 1
	}
	for _, r := range []float64{cfg.CPULimitRatio, cfg.MemoryLimitRatio, cfg.StorageLimitRatio} {
		if !(r >= 1) { // also refuses NaN
			return nil, invalidf("pool: limit ratios must be >= 1")
		}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.HeartbeatWriteAfter < 0 {
		return nil, invalidf("pool: HeartbeatWriteAfter must not be negative")
	}
	return &Pool{cfg: cfg, log: cfg.Logger, start: cfg.Now()}, nil
}
