package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"regexp"
	"sync/atomic"
	"time"

	fleetv1 "github.com/corralhq/corral/api/fleet/v1"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/fleet"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/etcd"
	"github.com/corralhq/corral/store/record"
	"github.com/corralhq/corral/testsupport/etcdtest"
	"golang.org/x/sync/errgroup"
)

// redispatchSample is one runner kill.
type redispatchSample struct {
	machines int // the killed runner's machines
	// listed: kill → ListAppliances shows every machine on the survivor.
	listed time.Duration
	// logged: kill → the leader logged the re-dispatch.
	logged time.Duration
	// afterBeat is the log line's after_heartbeat: the runner's last
	// heartbeat → its machines' assignments written.
	afterBeat string
}

var afterBeatRE = regexp.MustCompile(`after_heartbeat=(\S+)`)

// benchRedispatch runs two appliances on etcd at the production runner
// timers (10 s heartbeat, 30 s expiry) with machines machine records, and
// kills kills times the runner that is not the leader, with its share of
// the machines; each time it is restarted and given about half of them
// again (by deleting that many of the leader's assignments: the dispatcher
// gives them to the least loaded runner).
func benchRedispatch(ctx context.Context, out io.Writer, bin, root string, cl *etcdtest.Cluster, machines, kills int) ([]redispatchSample, error) {
	const prefix = "/bench-redispatch"
	st, err := etcd.Open(ctx, etcd.Options{Endpoints: cl.Endpoints(), Prefix: prefix})
	if err != nil {
		return nil, err
	}
	defer st.Close()
	if err := createMachines(ctx, st, machines); err != nil {
		return nil, err
	}
	apps := make([]*corrald, 2)
	for i := range apps {
		apps[i], err = newCorrald(bin, root, fmt.Sprintf("redispatch-%c", 'a'+i), "--store", "etcd",
			"--etcd-endpoints", cl.EndpointsFlag(), "--etcd-prefix", prefix)
		if err != nil {
			return nil, err
		}
	}
	defer func() {
		for _, a := range apps {
			a.stop()
		}
	}()
	cc, err := startFleet(apps)
	if err != nil {
		return nil, err
	}
	byName := map[string]*corrald{apps[0].name: apps[0], apps[1].name: apps[1]}
	fmt.Fprintf(out, "\n== work re-dispatch after a runner dies: %d machines, %d kills (heartbeat %v, expiry %v)\n",
		machines, kills, fleet.DefaultInterval, fleet.DefaultExpiry)
	var samples []redispatchSample
	for k := range kills {
		leaderName, err := waitElection(ctx, st, 2, 60*time.Second)
		if err != nil {
			return samples, err
		}
		leader := byName[leaderName]
		if leader == nil {
			return samples, fmt.Errorf("the election under %s names %q, not one of this benchmark's appliances", prefix, leaderName)
		}
		victim := apps[0]
		if victim == leader {
			victim = apps[1]
		}
		conn, err := dial(cc, leader.addr)
		if err != nil {
			return samples, err
		}
		apc := fleetv1.NewApplianceServiceClient(conn)
		n, err := rebalance(ctx, st, apc, leader.name, victim.name, machines)
		if err != nil {
			conn.Close()
			return samples, err
		}
		// The runner heartbeats every 10 s: die at a random point of
		// that cycle.
		sleep(ctx, rand.N(fleet.DefaultInterval))
		before := leader.count(lineRedispatch)
		killed := victim.kill()
		var listed time.Duration
		deadline := killed.Add(fleet.DefaultExpiry + 60*time.Second)
		for listed == 0 {
			if time.Now().After(deadline) || ctx.Err() != nil {
				conn.Close()
				return samples, fmt.Errorf("%s's machines not re-dispatched %v after the kill", victim.name, time.Since(killed))
			}
			time.Sleep(200 * time.Millisecond)
			got, err := assigned(ctx, apc)
			if err == nil && got[leader.name] == machines && got[victim.name] == 0 {
				listed = time.Since(killed)
			}
		}
		conn.Close()
		at, line, err := leader.waitLine(lineRedispatch, before, 10*time.Second)
		if err != nil {
			return samples, err
		}
		s := redispatchSample{machines: n, listed: listed, logged: at.Sub(killed)}
		if m := afterBeatRE.FindStringSubmatch(line); m != nil {
			s.afterBeat = m[1]
		}
		samples = append(samples, s)
		fmt.Fprintf(out, "kill %d: %s (%d machines) killed; leader %s logged the re-dispatch after %v (after_heartbeat=%s); ListAppliances showed all %d on %s after %v\n",
			k+1, victim.name, n, leader.name, s.logged.Round(time.Millisecond), s.afterBeat, machines, leader.name, listed.Round(time.Millisecond))
		if err := victim.start(60 * time.Second); err != nil {
			return samples, err
		}
	}
	return samples, nil
}

// createMachines writes n machine records through inventory on the
// fleet's store, 32 at a time.
func createMachines(ctx context.Context, st *etcd.Store, n int) error {
	inv, err := inventory.New(inventory.Config{Store: st})
	if err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(32)
	for i := range n {
		g.Go(func() error {
			_, err := inv.CreateMachine(gctx, &inventoryv1.Machine{Name: fmt.Sprintf("bench-m%05d", i)})
			return err
		})
	}
	return g.Wait()
}

// assigned is ListAppliances' assigned count per appliance.
func assigned(ctx context.Context, c fleetv1.ApplianceServiceClient) (map[string]int, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := c.ListAppliances(ctx, &fleetv1.ListAppliancesRequest{})
	if err != nil {
		return nil, err
	}
	got := map[string]int{}
	for _, a := range resp.GetAppliances() {
		if a.GetRole() == fleetv1.Appliance_LEADER || a.GetRole() == fleetv1.Appliance_RUNNER {
			got[a.GetName()] = int(a.GetAssigned())
		}
	}
	return got, nil
}

// rebalance waits until victim is a live runner, then gives it about half
// of the machines: it deletes every other one of the leader's assignments
// (compare-and-swap on each), and the dispatcher re-assigns them to the
// least loaded runner. It returns victim's machines once every machine is
// assigned again.
func rebalance(ctx context.Context, st *etcd.Store, c fleetv1.ApplianceServiceClient, leader, victim string, machines int) (int, error) {
	deadline := time.Now().Add(fleet.DefaultExpiry + 60*time.Second)
	for {
		got, err := assigned(ctx, c)
		if err == nil {
			if _, live := got[victim]; live && got[leader]+got[victim] == machines {
				break
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return 0, fmt.Errorf("%s not a live runner with every machine assigned: %v %v", victim, got, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	kvs, err := st.List(ctx, fleet.AssignmentPrefix)
	if err != nil {
		return 0, err
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	var deleted, conflicts atomic.Int64
	i := 0
	for _, kv := range kvs {
		var a fleetv1.Assignment
		if err := record.Unmarshal(kv.Value, &a); err != nil {
			return 0, fmt.Errorf("%s: %w", kv.Key, err)
		}
		if a.GetRunner() != leader {
			continue
		}
		i++
		if i%2 == 0 {
			continue
		}
		g.Go(func() error {
			err := st.Delete(gctx, kv.Key, kv.Revision)
			switch {
			case errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound):
				conflicts.Add(1) // moved meanwhile: leave it
				return nil
			case err != nil:
				return err
			}
			deleted.Add(1)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return 0, err
	}
	deadline = time.Now().Add(60 * time.Second)
	for {
		got, err := assigned(ctx, c)
		if err == nil && got[leader]+got[victim] == machines && got[victim] > 0 {
			return got[victim], nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return 0, fmt.Errorf("after deleting %d assignments (%d moved meanwhile): %v %v", deleted.Load(), conflicts.Load(), got, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
