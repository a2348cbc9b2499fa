package fleetsim

// What the storm watches while it runs and checks after it: corrald's
// gauges, the node watch, the appliance's own view of the row, the leases
// and the metrics saved at the end.

import (
	bootv1 "github.com/corralhq/corral/api/boot/v1"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	watchv1 "github.com/corralhq/corral/api/watch/v1"

	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/corralhq/corral/boot/dhcp"
	"github.com/corralhq/corral/store/bolt"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/grpc"
)

// pollGauges reads corrald's own counts every second from /metrics
// (corral_machines and corral_nodes by state: kept in memory by the
// appliance, a scrape costs it about a millisecond): the machines at
// INVENTORIED or later, DEPLOYED, nodes READY and NOT_READY. A NOT_READY
// count above zero is a flap even when the node watch missed it.
func (s *sim) pollGauges(ctx context.Context) {
	hc := s.topo.httpClient(relayAddr, 5*time.Second)
	defer hc.CloseIdleConnections()
	url := fmt.Sprintf("http://%s:%d/metrics", s.app.addr, metricsPort)
	for sleepCtx(ctx, time.Second) {
		resp, err := hc.Get(url)
		if err != nil {
			s.st.add("metrics scrapes failed", 1)
			continue
		}
		m, err := parseMetrics(io.LimitReader(resp.Body, 16<<20))
		resp.Body.Close()
		if err != nil {
			continue
		}
		g := func(k string) int { return int(m.samples[k]) }
		// FAILED counts too: a machine fails only once known (the gauge
		// cannot tell whether it registered first; the end's ListMachines
		// can).
		inv := g(`corral_machines{state="INVENTORIED"}`) + g(`corral_machines{state="INSTALLING"}`) + g(`corral_machines{state="DEPLOYED"}`) +
			g(`corral_machines{state="FAILED"}`)
		s.viewMu.Lock()
		s.gInv, s.gDeployed = inv, g(`corral_machines{state="DEPLOYED"}`)
		s.gReady, s.gNotReady = g(`corral_nodes{state="READY"}`), g(`corral_nodes{state="NOT_READY"}`)
		s.maxNotReady = max(s.maxNotReady, s.gNotReady)
		if inv >= s.cfg.Machines && s.allInvAt.IsZero() {
			s.allInvAt = time.Now()
		}
		s.viewMu.Unlock()
	}
}

// watchNodes follows the pool and counts READY → NOT_READY.
func (s *sim) watchNodes(ctx context.Context, c poolv1.NodeServiceClient) {
	for ctx.Err() == nil {
		st, err := c.WatchNodes(ctx, &poolv1.WatchNodesRequest{})
		if err == nil {
			for {
				ev, err := st.Recv()
				if err != nil {
					break
				}
				n := ev.GetNode()
				if n == nil || ev.GetType() == watchv1.EventType_DELETED {
					continue
				}
				s.viewMu.Lock()
				prev, had := s.nodes[n.GetName()]
				if had && prev == poolv1.Node_READY && n.GetState() == poolv1.Node_NOT_READY {
					s.flaps++
					if len(s.flapList) < 10 {
						s.flapList = append(s.flapList, fmt.Sprintf("%s READY→NOT_READY at %s (last heartbeat %s)", n.GetName(),
							time.Now().UTC().Format("15:04:05"), n.GetLastHeartbeat().AsTime().UTC().Format("15:04:05")))
					}
				}
				s.nodes[n.GetName()] = n.GetState()
				s.viewMu.Unlock()
			}
		}
		if ctx.Err() == nil {
			s.st.add("node watch restarts", 1)
			sleepCtx(ctx, time.Second)
		}
	}
}

func inventoried(st inventoryv1.Machine_MachineState) bool {
	switch st {
	case inventoryv1.Machine_INVENTORIED, inventoryv1.Machine_INSTALLING, inventoryv1.Machine_DEPLOYED:
		return true
	default: // not yet inventoried, failed or held
		return false
	}
}

// waitDeployed waits (up to d) until the appliance counts want machines
// DEPLOYED (the machines whose node applied).
func (s *sim) waitDeployed(ctx context.Context, want int, d time.Duration) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		s.viewMu.Lock()
		n := s.gDeployed
		s.viewMu.Unlock()
		if n >= want {
			return
		}
		sleepCtx(ctx, time.Second)
	}
}

// applianceView lists machines and nodes through the API: inventoried,
// lost, deployed, failed, READY nodes.
func (s *sim) applianceView(ctx context.Context, admin *grpc.ClientConn, r *Report) error {
	lctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	ms, err := listMachines(lctx, admin)
	if err != nil {
		return err
	}
	found := map[string]bool{}
	r.States = map[string]int{}
	for _, m := range ms {
		if !s.serials[m.GetSerial()] {
			continue
		}
		found[m.GetSerial()] = true
		r.States[m.GetState().String()]++
		// A machine FAILED after it registered (its facts are stored)
		// was inventoried, not lost; it is counted as failed.
		if inventoried(m.GetState()) || (m.GetState() == inventoryv1.Machine_FAILED && m.GetFacts() != nil) {
			r.Inventoried++
		}
		if m.GetState() == inventoryv1.Machine_FAILED {
			r.Failed++
			s.st.fail("appliance FAILED: " + clip(m.GetStateReason(), 60))
		}
	}
	r.Lost = s.cfg.Machines - r.Inventoried
	r.NodesReady, err = readyNodes(lctx, admin)
	return err
}

// checkLeases compares the appliance's leases (its bbolt file, read once
// corrald has stopped) with what the machines hold: a MAC with two live
// leases, or a held address whose live lease names another MAC, is a
// duplicate the clients could not see.
func (s *sim) checkLeases(ctx context.Context, holders map[netip.Addr]string, r *Report) error {
	st, err := bolt.Open(filepath.Join(s.app.dataDir, "corral.db"), bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer st.Close()
	ls, err := record.List(ctx, st, dhcp.LeasePrefix, func() *bootv1.Lease { return &bootv1.Lease{} })
	if err != nil {
		return err
	}
	leaseFigures(ls, holders, r)
	return nil
}

// leaseFigures compares the appliance's leases with what the machines
// hold (checkLeases).
func leaseFigures(ls []*bootv1.Lease, holders map[netip.Addr]string, r *Report) {
	now := time.Now().Unix()
	perMAC := map[string]int{}
	live := map[string]string{}
	for _, l := range ls {
		if l.GetState() == bootv1.Lease_STATE_ACTIVE && now < l.GetExpiresUnix() {
			perMAC[l.GetMac()]++
			live[l.GetIp()] = l.GetMac()
		}
	}
	for _, n := range perMAC {
		if n > 1 {
			r.LeaseMACsTwice++
		}
	}
	for ip, mac := range holders {
		if l, ok := live[ip.String()]; ok && l != mac {
			r.LeaseMismatch++
		} else if !ok {
			r.LeaseMissing++
		}
	}
	r.LeasesLive = len(live)
}

// saveMetrics keeps appliance a's /metrics text for the write-up.
func (s *sim) saveMetrics(a *appliance) {
	s.saveURL(fmt.Sprintf("http://%s:%d/metrics", a.addr, metricsPort), s.metricsPath(a))
}

// saveURL keeps what url answers (from the machines' namespace) in path.
func (s *sim) saveURL(url, path string) {
	hc := s.topo.httpClient(relayAddr, 10*time.Second)
	defer hc.CloseIdleConnections()
	resp, err := hc.Get(url)
	if err != nil {
		s.logf("saving %s: %v", url, err)
		return
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		return
	}
	if _, err := io.Copy(f, io.LimitReader(resp.Body, 64<<20)); err != nil {
		s.logf("saving %s to %s: %v", url, path, err)
	}
	if err := f.Close(); err != nil {
		s.logf("saving %s to %s: %v", url, path, err)
	}
}
