package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	"github.com/corralhq/corral/store/etcd"
	"github.com/corralhq/corral/testsupport/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// electionKey is where store/etcd's Elector queues the candidates: one
// key per candidate, bound to its lease, under the store's own key prefix
// (Prefix() + "/") and its electionKey (store/etcd/election.go). The
// leader's name is read through the Elector itself; the keys are only
// counted, and a count of zero under a named leader is reported as this
// layout having changed.
const electionKey = "/_election/leader/"

// election reads the fleet's election: the leader's name and how many
// candidates campaign.
func election(ctx context.Context, st *etcd.Store) (leader string, candidates int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	el, err := etcd.NewElector(st, "bench-observer", 0, nil)
	if err != nil {
		return "", 0, err
	}
	if leader, err = el.Leader(ctx); err != nil {
		return "", 0, err
	}
	n, err := st.Client().Get(ctx, st.Prefix()+"/"+electionKey, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return "", 0, err
	}
	if leader != "" && n.Count == 0 {
		return "", 0, fmt.Errorf("leader %q but no candidate key under %q: store/etcd's election keys moved; update bench/fleet", leader, st.Prefix()+"/"+electionKey)
	}
	return leader, n.Count, nil
}

// waitElection waits until the fleet has a leader and want candidates.
func waitElection(ctx context.Context, st *etcd.Store, want int64, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		leader, n, err := election(ctx, st)
		if err == nil && leader != "" && n == want {
			return leader, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return "", fmt.Errorf("election under %s: leader %q, %d candidates (want %d) after %v: %v", st.Prefix(), leader, n, want, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// benchTakeover runs two appliances on etcd with the leader lease ttl,
// kills the leader with SIGKILL kills times (restarting it each time on its
// data directory and address, so two always campaign), and returns the
// time from each kill until the other logged "leading the fleet".
func benchTakeover(ctx context.Context, out io.Writer, bin, root string, cl *etcdtest.Cluster, ttl time.Duration, kills int) ([]time.Duration, error) {
	prefix := fmt.Sprintf("/bench-takeover-%v", ttl)
	st, err := etcd.Open(ctx, etcd.Options{Endpoints: cl.Endpoints(), Prefix: prefix})
	if err != nil {
		return nil, err
	}
	defer st.Close()
	apps := make([]*corrald, 2)
	for i := range apps {
		apps[i], err = newCorrald(bin, root, fmt.Sprintf("takeover-%v-%c", ttl, 'a'+i), "--store", "etcd",
			"--etcd-endpoints", cl.EndpointsFlag(), "--etcd-prefix", prefix, "--leader-lease-ttl", ttl.String())
		if err != nil {
			return nil, err
		}
	}
	defer func() {
		for _, a := range apps {
			a.stop()
		}
	}()
	if _, err := startFleet(apps); err != nil {
		return nil, err
	}
	byName := map[string]*corrald{apps[0].name: apps[0], apps[1].name: apps[1]}
	fmt.Fprintf(out, "\n== leader takeover, lease TTL %v: %d kills\n", ttl, kills)
	var took []time.Duration
	for k := range kills {
		leaderName, err := waitElection(ctx, st, 2, 60*time.Second)
		if err != nil {
			return took, err
		}
		leader := byName[leaderName]
		if leader == nil {
			return took, fmt.Errorf("the election under %s names %q, not one of this benchmark's appliances", prefix, leaderName)
		}
		// The lease is renewed every TTL/3: kill at a random point of
		// that cycle, not always just after the restart.
		sleep(ctx, rand.N(ttl/3))
		other := apps[0]
		if other == leader {
			other = apps[1]
		}
		before := other.count(lineLeading)
		killed := leader.kill()
		at, _, err := other.waitLine(lineLeading, before, ttl+60*time.Second)
		if err != nil {
			return took, err
		}
		d := at.Sub(killed)
		took = append(took, d)
		fmt.Fprintf(out, "kill %2d: %s killed, %s leading after %v\n", k+1, leader.name, other.name, d.Round(time.Millisecond))
		if err := leader.start(60 * time.Second); err != nil {
			return took, err
		}
	}
	return took, nil
}
