package fleet

import (
	"context"
	"slices"
	"sync"
	"time"

	fleetv1 "github.com/corralhq/corral/api/fleet/v1"
	"github.com/corralhq/corral/store"
)

// Peers lists the API endpoints of the fleet's other live appliances, for
// boot scripts and install plans to name after this appliance's own. It
// reads the runner records at most once a second (a rack booting at once
// asks for every script) and keeps its last good answer when the store
// fails. Safe for concurrent use.
type Peers struct {
	Store store.Store
	// Self is this appliance's name (left out of the list).
	Self string
	// Expiry is how long a runner stays live after its heartbeat (default
	// DefaultExpiry).
	Expiry time.Duration

	mu     sync.Mutex
	at     time.Time
	cached []string
}

// peersTTL is how long an answer of Endpoints is reused.
const peersTTL = time.Second

// Endpoints returns the live peers' endpoints, sorted (nil when alone).
func (p *Peers) Endpoints(ctx context.Context) []string {
	p.mu.Lock()
	if time.Since(p.at) < peersTTL {
		out := slices.Clone(p.cached)
		p.mu.Unlock()
		return out
	}
	p.mu.Unlock()
	apps, err := listAppliances(ctx, p.Store)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		return slices.Clone(p.cached)
	}
	expiry := p.Expiry
	if expiry <= 0 {
		expiry = DefaultExpiry
	}
	now := time.Now()
	var out []string
	for _, a := range apps {
		if a.GetName() != p.Self && a.GetApiEndpoint() != "" && Live(a, now, expiry) {
			out = append(out, a.GetApiEndpoint())
		}
	}
	slices.Sort(out)
	p.at, p.cached = now, out
	return slices.Clone(out)
}

// listAppliances lists the runner records, skipping undecodable ones (a
// foreign or newer record must not hide the rest of the fleet).
func listAppliances(ctx context.Context, st store.Store) ([]*fleetv1.Appliance, error) {
	kvs, err := st.List(ctx, AppliancePrefix)
	if err != nil {
		return nil, err
	}
	out := make([]*fleetv1.Appliance, 0, len(kvs))
	for _, kv := range kvs {
		if a, err := decodeAppliance(kv.Value); err == nil {
			out = append(out, a)
		}
	}
	return out, nil
}
