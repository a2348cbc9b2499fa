package fleetsim

// A fleet's figures: per appliance and per etcd member, where the storm
// queues (CPU, memory, run-queue wait, store commits and conflicts, etcd's
// disk and proposals), each appliance's own view of the row, and the
// leases in etcd.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	bootv1 "github.com/corralhq/corral/api/boot/v1"
	"github.com/corralhq/corral/api/clientconfig"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/boot/dhcp"
	"github.com/corralhq/corral/store/record"
)

// ApplianceFigures are one appliance's share of a storm.
type ApplianceFigures struct {
	Name, Addr string
	// Inventoried and Deployed are the run's machines as this
	// appliance's ListMachines answers at the end (-1: the list failed).
	Inventoried, Deployed int
	// DHCPAcks are the leases the machines took from it (ACKs naming it
	// as server); DHCP its packets by type/outcome (its /metrics).
	DHCPAcks int
	DHCP     map[string]float64
	// CPUSeconds, RSS and RunQueueSeconds as the Report's, for this
	// process; Threads at the end.
	CPUSeconds                 float64
	PeakRSSBytes, EndRSSBytes  int64
	RunQueueSeconds            float64
	Threads                    int
	Queues                     []QueueLine // its /metrics histograms
	Counters                   map[string]float64
	StoreConflicts, StoreWrite float64 // corral_store_commit_seconds counts: conflict outcome, all
}

// EtcdFigures are one etcd member's share (its /metrics and /proc).
type EtcdFigures struct {
	Name                      string
	Leader                    bool
	CPUSeconds                float64
	PeakRSSBytes              int64
	RunQueueSeconds           float64
	BackendCommit, WALFsync   QueueLine // etcd_disk_*
	PeerRTT                   QueueLine // etcd_network_peer_round_trip_time_seconds
	ProposalsCommitted        float64
	ProposalsFailed           float64
	LeaderChanges, SlowApply  float64
	HeartbeatSendFailures     float64
	DBBytes, DBInUseBytes     float64
	PutTotal, TxnTotal, Range float64 // etcd_mvcc_*_total
}

// dhcpServers are the addresses of the appliances serving DHCP.
func (s *sim) dhcpServers() []netip.Addr {
	var out []netip.Addr
	for i, a := range s.apps {
		if i == 0 || !s.cfg.FirstDHCPOnly {
			out = append(out, a.addr)
		}
	}
	return out
}

// countDHCP counts a lease ACKed by server (per appliance in a fleet).
func (s *sim) countDHCP(server netip.Addr) {
	s.leaseMu.Lock()
	s.acksBy[server]++
	s.leaseMu.Unlock()
}

// procSnap is a process's /proc figures at a point of the storm.
type procSnap struct {
	stat procStat
	wait time.Duration
}

func snap(pid int) procSnap {
	st, _ := readProc(pid)
	return procSnap{stat: st, wait: runQueueWait(pid)}
}

// fleetSnap is every appliance's and member's procSnap (by pid).
func (s *sim) fleetSnap() map[int]procSnap {
	out := map[int]procSnap{}
	for _, a := range s.apps {
		out[a.pid] = snap(a.pid)
	}
	if s.etcd != nil {
		for _, m := range s.etcd.members {
			out[m.pid] = snap(m.pid)
		}
	}
	return out
}

// fleetProcLine is the progress line's figures of every appliance and
// member since the storm's start.
func (s *sim) fleetProcLine(start map[int]procSnap, since time.Duration) string {
	var b strings.Builder
	one := func(label string, pid int) {
		p, err := readProc(pid)
		if err != nil {
			fmt.Fprintf(&b, " %s gone;", label)
			return
		}
		fmt.Fprintf(&b, " %s cpu %.0f%% rss %d MiB;", label, 100*float64(p.ticks-start[pid].stat.ticks)/clockTicks/max(since.Seconds(), 0.001), p.rssKB>>10)
	}
	for _, a := range s.apps {
		one(a.name, a.pid)
	}
	for _, m := range s.etcd.members {
		one("etcd "+m.name, m.pid)
	}
	return strings.TrimSuffix(b.String(), ";")
}

// metricsPath is where appliance a's /metrics at the end of the storm is
// kept: metrics-storm.txt alone, metrics-storm-NAME.txt in a fleet.
func (s *sim) metricsPath(a *appliance) string {
	if a.name == "" {
		return filepath.Join(s.cfg.WorkDir, "metrics-storm.txt")
	}
	return filepath.Join(s.cfg.WorkDir, "metrics-storm-"+a.name+".txt")
}

// saveEtcdMetrics keeps each member's /metrics text.
func (s *sim) saveEtcdMetrics() {
	for _, m := range s.etcd.members {
		s.saveURL(m.clientURL+"/metrics", filepath.Join(s.cfg.WorkDir, "metrics-etcd-"+m.name+".txt"))
	}
}

// adminConn dials appliance a with the fleet's admin credentials.
func (s *sim) adminConn(cfg *clientconfig.Config, a *appliance) (*grpc.ClientConn, error) {
	c := *cfg
	c.Endpoint = fmt.Sprintf("%s:%d", a.addr, apiPort)
	return clientconfig.Dial(&c, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		return s.topo.client.dial(ctx, relayAddr, addr)
	}), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<30)))
}

// fleetFigures fills r.Fleet and r.Etcd: each appliance's own view of the
// row (ListMachines through its API), its process and its /metrics, each
// member's process and /metrics. Called with every process still up.
func (s *sim) fleetFigures(ctx context.Context, adminCfg *clientconfig.Config, start map[int]procSnap, r *Report) {
	s.leaseMu.Lock()
	acks := maps(s.acksBy)
	s.leaseMu.Unlock()
	for _, a := range s.apps {
		f := ApplianceFigures{Name: a.name, Addr: a.addr.String(), Inventoried: -1, Deployed: -1, DHCPAcks: acks[a.addr]}
		if conn, err := s.adminConn(adminCfg, a); err != nil {
			r.Notes = append(r.Notes, fmt.Sprintf("%s: dial: %v", a.name, err))
		} else {
			lctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			ms, err := listMachines(lctx, conn)
			cancel()
			conn.Close()
			if err != nil {
				r.Notes = append(r.Notes, fmt.Sprintf("%s: ListMachines: %v", a.name, err))
			} else {
				f.Inventoried, f.Deployed = 0, 0
				for _, m := range ms {
					if !s.serials[m.GetSerial()] {
						continue
					}
					if inventoried(m.GetState()) || (m.GetState() == inventoryv1.Machine_FAILED && m.GetFacts() != nil) {
						f.Inventoried++
					}
					if m.GetState().String() == "DEPLOYED" {
						f.Deployed++
					}
				}
			}
		}
		p, _ := readProc(a.pid)
		f.CPUSeconds = float64(p.ticks-start[a.pid].stat.ticks) / clockTicks
		f.PeakRSSBytes, f.EndRSSBytes, f.Threads = int64(p.hwmKB)<<10, int64(p.rssKB)<<10, p.threads
		f.RunQueueSeconds = (runQueueWait(a.pid) - start[a.pid].wait).Seconds()
		if q, c, err := queueFigures(s.metricsPath(a)); err == nil {
			f.Queues, f.Counters = q, c
			f.DHCP = map[string]float64{}
			for k, v := range c {
				if strings.HasPrefix(k, "dhcp_packets_total") {
					f.DHCP[shortSeries(strings.TrimPrefix(k, "dhcp_packets_total"))] = v
				}
			}
			for _, l := range q {
				if strings.HasPrefix(l.Series, "store_commit_seconds") {
					f.StoreWrite += l.Count
					if strings.Contains(l.Series, `outcome="conflict"`) {
						f.StoreConflicts += l.Count
					}
				}
			}
		} else {
			r.Notes = append(r.Notes, fmt.Sprintf("%s /metrics: %v", a.name, err))
		}
		r.Fleet = append(r.Fleet, f)
		// The fleet's view is the least any appliance has of the row.
		if f.Inventoried >= 0 && f.Inventoried < r.Inventoried {
			r.Notes = append(r.Notes, fmt.Sprintf("%s lists %d machines inventoried, %s %d", a.name, f.Inventoried, s.app.name, r.Inventoried))
			r.Inventoried, r.Lost = f.Inventoried, s.cfg.Machines-f.Inventoried
		}
	}
	for _, m := range s.etcd.members {
		f := EtcdFigures{Name: m.name}
		p, _ := readProc(m.pid)
		f.CPUSeconds = float64(p.ticks-start[m.pid].stat.ticks) / clockTicks
		f.PeakRSSBytes = int64(p.hwmKB) << 10
		f.RunQueueSeconds = (runQueueWait(m.pid) - start[m.pid].wait).Seconds()
		fh, err := os.Open(filepath.Join(s.cfg.WorkDir, "metrics-etcd-"+m.name+".txt"))
		if err != nil {
			r.Notes = append(r.Notes, fmt.Sprintf("etcd %s /metrics: %v", m.name, err))
			r.Etcd = append(r.Etcd, f)
			continue
		}
		mt, err := parseMetrics(fh)
		fh.Close()
		if err != nil {
			r.Notes = append(r.Notes, fmt.Sprintf("etcd %s /metrics: %v", m.name, err))
		}
		line := func(name string) QueueLine {
			var q QueueLine
			for k, h := range mt.hists {
				if k == name+"{}" || strings.HasPrefix(k, name+"{") {
					// Peer RTT has a series per peer: the slowest.
					if h.count > 0 && h.quantile(0.99) >= q.P99 {
						q = QueueLine{Series: name, Count: h.count, Sum: h.sum, Mean: h.sum / h.count, P50: h.quantile(0.5), P99: h.quantile(0.99)}
					}
				}
			}
			return q
		}
		v := func(name string) float64 { return mt.samples[name+"{}"] }
		f.BackendCommit = line("etcd_disk_backend_commit_duration_seconds")
		f.WALFsync = line("etcd_disk_wal_fsync_duration_seconds")
		f.PeerRTT = line("etcd_network_peer_round_trip_time_seconds")
		f.Leader = v("etcd_server_is_leader") == 1
		f.ProposalsCommitted = v("etcd_server_proposals_committed_total")
		f.ProposalsFailed = v("etcd_server_proposals_failed_total")
		f.LeaderChanges = v("etcd_server_leader_changes_seen_total")
		f.SlowApply = v("etcd_server_slow_apply_total")
		f.HeartbeatSendFailures = v("etcd_server_heartbeat_send_failures_total")
		f.DBBytes = v("etcd_mvcc_db_total_size_in_bytes")
		f.DBInUseBytes = v("etcd_mvcc_db_total_size_in_use_in_bytes")
		f.PutTotal, f.TxnTotal, f.Range = v("etcd_mvcc_put_total"), v("etcd_mvcc_txn_total"), v("etcd_mvcc_range_total")
		r.Etcd = append(r.Etcd, f)
	}
}

// checkLeasesEtcd is checkLeases for a fleet: the leases as etcd holds
// them (read through a client of its own, from the machines' namespace).
func (s *sim) checkLeasesEtcd(ctx context.Context, holders map[netip.Addr]string, r *Report) error {
	var eps []string
	for _, m := range s.etcd.members {
		eps = append(eps, m.clientURL)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return s.topo.client.dial(ctx, relayAddr, addr)
		})}})
	if err != nil {
		return err
	}
	defer cli.Close()
	gctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	resp, err := cli.Get(gctx, etcdPrefix+"/"+dhcp.LeasePrefix, clientv3.WithPrefix())
	if err != nil {
		return err
	}
	var ls []*bootv1.Lease
	for _, kv := range resp.Kvs {
		l := &bootv1.Lease{}
		if err := record.Unmarshal(kv.Value, l); err != nil {
			return fmt.Errorf("lease %s: %w", kv.Key, err)
		}
		ls = append(ls, l)
	}
	leaseFigures(ls, holders, r)
	// What the storm wrote, by prefix: each live key's versions (its
	// puts since it was created; keys deleted since are not counted).
	kresp, err := cli.Get(gctx, etcdPrefix+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return fmt.Errorf("keys: %w", err)
	}
	r.EtcdRevision = kresp.Header.GetRevision()
	r.EtcdKeys, r.EtcdVersions = map[string]int{}, map[string]int64{}
	for _, kv := range kresp.Kvs {
		k := keyClass(strings.TrimPrefix(string(kv.Key), etcdPrefix+"/"))
		r.EtcdKeys[k]++
		r.EtcdVersions[k] += kv.Version
	}
	return nil
}

// keyClass is a store key's prefix: its first two path elements when it
// has more ("inventory/timeline"), else its first ("audit").
func keyClass(k string) string {
	parts := strings.SplitN(strings.TrimPrefix(k, "/"), "/", 3)
	if len(parts) == 3 {
		return parts[0] + "/" + parts[1]
	}
	return parts[0]
}

// printFleet writes the per-appliance and per-member tables.
func (r *Report) printFleet(w io.Writer) {
	if len(r.Fleet) == 0 {
		return
	}
	mib := func(b int64) float64 { return float64(b) / (1 << 20) }
	fmt.Fprintf(w, "the fleet: %d appliances on a %d-member etcd; per appliance (inventoried/deployed: its own ListMachines at the end):\n", len(r.Fleet), len(r.Etcd))
	tw := newTable(w)
	fmt.Fprintln(tw, "  appliance\tinventoried\tdeployed\tleases ACKed\tcpu s\t% of a core\trss peak MiB\trun-queue wait s\tthreads\tstore writes\tconflicts\t")
	for _, f := range r.Fleet {
		fmt.Fprintf(tw, "  %s (%s)\t%d\t%d\t%d\t%.1f\t%.0f\t%.0f\t%.1f\t%d\t%.0f\t%.0f\t\n", f.Name, f.Addr, f.Inventoried, f.Deployed, f.DHCPAcks,
			f.CPUSeconds, 100*f.CPUSeconds/max(r.WallSeconds, 1), mib(f.PeakRSSBytes), f.RunQueueSeconds, f.Threads, f.StoreWrite, f.StoreConflicts)
	}
	tw.Flush()
	fmt.Fprintln(w, "where each appliance queues (its /metrics; p50/p99 from buckets):")
	tw = newTable(w)
	fmt.Fprintln(tw, "  appliance\tseries\tcount\tmean\tp50\tp99\t")
	for _, f := range r.Fleet {
		for _, q := range f.Queues {
			if !fleetSeries(q.Series) {
				continue
			}
			fmt.Fprintf(tw, "  %s\t%s\t%.0f\t%s\t%s\t%s\t\n", f.Name, shortSeries(q.Series), q.Count, fmtSeconds(q.Mean), fmtSeconds(q.P50), fmtSeconds(q.P99))
		}
	}
	tw.Flush()
	for _, f := range r.Fleet {
		var parts []string
		for _, k := range sortedKeys(f.DHCP) {
			parts = append(parts, fmt.Sprintf("%s %.0f", k, f.DHCP[k]))
		}
		fmt.Fprintf(w, "  %s dhcp packets: %s\n", f.Name, strings.Join(parts, ", "))
	}
	if r.EtcdRevision > 0 {
		fmt.Fprintf(w, "etcd at the end: revision %d (%.0f writes a machine); live keys by prefix (their puts):", r.EtcdRevision, float64(r.EtcdRevision)/float64(max(r.Machines, 1)))
		for _, k := range sortedKeys(r.EtcdKeys) {
			fmt.Fprintf(w, " %s %d (%d);", k, r.EtcdKeys[k], r.EtcdVersions[k])
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "etcd members (their /metrics; p50/p99 from buckets):")
	tw = newTable(w)
	fmt.Fprintln(tw, "  member\tcpu s\trss peak MiB\trun-queue wait s\tbackend commit n p50 p99\twal fsync p50 p99\tpeer rtt p99\tproposals committed/failed\tleader changes\tslow applies\tdb MiB (in use)\t")
	for _, e := range r.Etcd {
		lead := ""
		if e.Leader {
			lead = " leader"
		}
		fmt.Fprintf(tw, "  %s%s\t%.1f\t%.0f\t%.1f\t%.0f %s %s\t%s %s\t%s\t%.0f/%.0f\t%.0f\t%.0f\t%.1f (%.1f)\t\n", e.Name, lead, e.CPUSeconds, mib(e.PeakRSSBytes), e.RunQueueSeconds,
			e.BackendCommit.Count, fmtSeconds(e.BackendCommit.P50), fmtSeconds(e.BackendCommit.P99), fmtSeconds(e.WALFsync.P50), fmtSeconds(e.WALFsync.P99),
			fmtSeconds(e.PeerRTT.P99), e.ProposalsCommitted, e.ProposalsFailed, e.LeaderChanges, e.SlowApply, e.DBBytes/(1<<20), e.DBInUseBytes/(1<<20))
	}
	tw.Flush()
}

// fleetSeries picks the per-appliance queue lines worth a row: store
// writes, the agent and node calls, DHCP answers, boot HTTP.
func fleetSeries(series string) bool {
	if strings.HasPrefix(series, "store_commit_seconds") || strings.HasPrefix(series, "dhcp_answer_seconds") {
		return true
	}
	if strings.HasPrefix(series, "api_grpc_server_handling_seconds") {
		return slices.ContainsFunc([]string{"Register", "Session", "ApplyNode", "ReportProgress", "SignNode", "ListMachines"}, func(m string) bool {
			return strings.Contains(series, `grpc_method="`+m+`"`)
		})
	}
	return false
}
