package fleetsim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/corralhq/corral/api/clientconfig"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
)

// Config configures a storm. Machines and Corrald are required; every
// zero field takes the default named beside it.
type Config struct {
	// Machines is N, the simulated servers powered on; Nodes is M, the
	// hypervisor nodes heartbeating: the first installed machines become
	// nodes (up to M), and nodes beyond N join with the admin token.
	Machines, Nodes int
	// Stagger spreads the power-on times uniformly (default 60 s).
	Stagger time.Duration
	// RelayShare of the machines sit behind a DHCP relay (giaddr), the
	// others on the appliance's own segment (default 0.5; negative: 0).
	RelayShare float64
	// UEFIShare boot as x86-64 UEFI (option 93 = 7), the others BIOS
	// (default 0.3; negative: 0).
	UEFIShare float64
	// LargeShare are large machines (2 sockets, 24 DIMMs, 12 disks, 4
	// NICs) (default 0.25; negative: 0).
	LargeShare float64
	// FullFetchShare fetch kernel and initramfs whole; the others fetch
	// the first 64 KiB of each (Range) (default 0).
	FullFetchShare float64
	// NoTFTP leaves out the firmware's TFTP fetch of the iPXE binary
	// (corrald then serves no TFTP).
	NoTFTP bool
	// KexecShare of the machines run an agent that offers kexec (as
	// corral-node's discovery agent does): the appliance then sends a
	// KexecPlan after the install instead of rebooting them, and they
	// fetch the hypervisor image and become nodes without a second
	// firmware boot (default 0.5; negative: 0).
	KexecShare float64
	// KernelBytes and InitrdBytes are the stand-in artifacts' sizes
	// (default 8 MiB and 40 MiB: the real ~48 MB a machine).
	KernelBytes, InitrdBytes int64
	// AgentHeartbeat and NodeHeartbeat are the agents' and nodes' beat
	// intervals (default 10 s, as the real ones).
	AgentHeartbeat, NodeHeartbeat time.Duration
	// NodeHeartbeatTimeout and NodeSweepInterval, when set, are passed
	// to corrald (--node-heartbeat-timeout, --node-sweep-interval); keep
	// them in proportion to NodeHeartbeat.
	NodeHeartbeatTimeout, NodeSweepInterval time.Duration
	// DHCPTimeoutScale scales the firmware retransmission schedule (4, 8,
	// 16, 32 s) (default 1); DHCPGiveUp ends a boot's DHCP (default 5 min).
	DHCPTimeoutScale float64
	DHCPGiveUp       time.Duration
	// BootGiveUp ends a machine's retries of failed network boots
	// (default 10 min); BootRetry is the wait before a retry, ±40 %
	// (default 5 s: a PXE retry loop; a firmware that POSTs again waits
	// 30-60 s).
	BootGiveUp, BootRetry time.Duration
	// InstallStep is the pause after each install step (default 200 ms);
	// InstallGiveUp bounds registration to reboot (default 10 min).
	InstallStep, InstallGiveUp time.Duration
	// HTTPTimeout bounds one HTTP request (default 5 min).
	HTTPTimeout time.Duration
	// Soak keeps the nodes beating after the last machine is done, to
	// see NOT_READY flaps (default 3 node heartbeats plus the timeout).
	Soak time.Duration
	// Timeout bounds the whole storm (default 30 min).
	Timeout time.Duration
	// StartTimeout bounds corrald's start (default 2 min).
	StartTimeout time.Duration
	// Appliances is the number of corrald (default 1: one appliance on
	// its bbolt file). More make a fleet: a three-member etcd cluster
	// (needs etcd-server) and that many corrald on it, each in its own
	// namespace with its own address on the one boot segment; a
	// broadcast reaches all of them and the relay forwards to all (a
	// relay with several helper addresses). At most 8.
	Appliances int
	// FirstDHCPOnly: in a fleet only the first appliance serves DHCP and
	// TFTP; by default all do, from the one range (leases are
	// compare-and-swapped in etcd).
	FirstDHCPOnly bool
	// Corrald is the corrald binary; CorraldArgs are extra serve flags
	// (every appliance's).
	Corrald     string
	CorraldArgs []string
	// ProfileSeconds, when positive, records corrald with perf for that
	// long from the middle of the power-on (needs perf).
	ProfileSeconds int
	// WorkDir holds corrald's data dir, log and artifacts (default a new
	// temporary directory, removed unless Keep).
	WorkDir string
	Keep    bool
	// ID makes the namespace and interface names unique (default from
	// the pid).
	ID string
	// Log receives progress lines (nil discards).
	Log io.Writer
	// DropRegistration, when positive, makes the simulator forget the
	// registration of one machine in that many (tests: the check must
	// see a lost machine).
	DropRegistration int
}

func (c *Config) defaults() error {
	if c.Machines <= 0 {
		return errors.New("fleetsim: Machines must be positive")
	}
	if c.Nodes < 0 {
		return errors.New("fleetsim: Nodes must not be negative")
	}
	if c.Corrald == "" {
		return errors.New("fleetsim: the corrald binary is required")
	}
	switch {
	case c.Appliances == 0:
		c.Appliances = 1
	case c.Appliances < 0 || c.Appliances > maxAppliances:
		return fmt.Errorf("fleetsim: Appliances %d: want 1 to %d", c.Appliances, maxAppliances)
	}
	share := func(v *float64, d float64) {
		switch {
		case *v == 0:
			*v = d
		case *v < 0:
			*v = 0
		}
	}
	share(&c.RelayShare, 0.5)
	share(&c.UEFIShare, 0.3)
	share(&c.LargeShare, 0.25)
	share(&c.KexecShare, 0.5)
	dur := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	dur(&c.Stagger, 60*time.Second)
	dur(&c.AgentHeartbeat, 10*time.Second)
	dur(&c.NodeHeartbeat, 10*time.Second)
	dur(&c.DHCPGiveUp, 5*time.Minute)
	dur(&c.BootGiveUp, 10*time.Minute)
	dur(&c.BootRetry, 5*time.Second)
	dur(&c.InstallStep, 200*time.Millisecond)
	dur(&c.InstallGiveUp, 10*time.Minute)
	dur(&c.HTTPTimeout, 5*time.Minute)
	timeout := c.NodeHeartbeatTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	dur(&c.Soak, 3*c.NodeHeartbeat+timeout)
	dur(&c.Timeout, 30*time.Minute)
	dur(&c.StartTimeout, 2*time.Minute)
	if c.DHCPTimeoutScale <= 0 {
		c.DHCPTimeoutScale = 1
	}
	if c.KernelBytes <= 0 {
		c.KernelBytes = 8 << 20
	}
	if c.InitrdBytes <= 0 {
		c.InitrdBytes = 40 << 20
	}
	if c.ID == "" {
		c.ID = fmt.Sprintf("%d", os.Getpid()%100000)
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	return nil
}

// sim is one storm in progress.
type sim struct {
	cfg  Config
	topo *topology
	app  *appliance   // the first appliance: the admin's, the gauges'
	apps []*appliance // every appliance, app first
	etcd *etcdCluster // a fleet's store (nil alone)
	dhcp *dhcpNet
	st   *stats
	logf func(format string, args ...any)

	leaseMu  sync.Mutex
	holders  map[netip.Addr]string // address → MAC, from the ACKs
	acksBy   map[netip.Addr]int    // leases taken, by the appliance that ACKed
	dups     int
	dupLines []string

	registered atomic.Int64
	done       atomic.Int64 // machines finished (either way)
	nodesUp    atomic.Int64 // machines whose node applied
	lastReg    atomic.Int64 // unix ns of the latest first Register

	serials map[string]bool // the run's machines

	viewMu sync.Mutex
	// From corrald's /metrics gauges (pollGauges).
	gInv, gDeployed, gReady, gNotReady, maxNotReady int
	allInvAt                                        time.Time
	// From the node watch.
	nodes    map[string]poolv1.Node_NodeState
	flaps    int
	flapList []string
}

// Run makes the namespaces, starts corrald, powers on the row, waits
// until every machine is done (or Timeout), keeps the nodes beating for
// Soak, stops corrald and returns the figures. The namespaces, corrald
// and (unless Keep) the work directory are gone when it returns. It needs
// root.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("fleetsim: needs root (network namespaces)")
	}
	// Each machine and node holds a connection on both sides: raise the
	// open-file limit of the simulator and of the corrald it starts
	// (setting it explicitly makes Go pass it on to children).
	nofile, err := raiseNoFile(1 << 18)
	if err != nil {
		return nil, err
	}
	if need := uint64(2*(cfg.Machines+cfg.Nodes) + 1024); nofile < need {
		fmt.Fprintf(cfg.Log, "warning: open-file limit %d, the storm may need %d (each machine and node holds connections)\n", nofile, need)
	}
	if cfg.WorkDir == "" {
		d, err := os.MkdirTemp("", "corral-sim-")
		if err != nil {
			return nil, err
		}
		cfg.WorkDir = d
		if !cfg.Keep {
			defer os.RemoveAll(d)
		}
	}
	s := &sim{cfg: cfg, st: newStats(), holders: map[netip.Addr]string{}, acksBy: map[netip.Addr]int{}, serials: map[string]bool{},
		nodes: map[string]poolv1.Node_NodeState{}}
	s.logf = func(format string, args ...any) {
		fmt.Fprintf(cfg.Log, "%s "+format+"\n", append([]any{time.Now().UTC().Format("15:04:05")}, args...)...)
	}
	s.topo, err = newTopology(ctx, cfg.ID, cfg.Appliances)
	if err != nil {
		return nil, err
	}
	defer s.topo.Close()
	k, i, h, err := writeArtifacts(cfg.WorkDir, cfg.KernelBytes, cfg.InitrdBytes, cfg.InitrdBytes)
	if err != nil {
		return nil, fmt.Errorf("boot artifacts: %w", err)
	}
	if cfg.Appliances == 1 {
		s.logf("namespaces %s (corrald) and %s (machines) up; starting corrald", s.topo.serverNS, s.topo.clientNS)
		s.app, err = startAppliance(ctx, &s.cfg, s.topo, applianceSpec{port: s.topo.apps[0], workDir: cfg.WorkDir, dhcp: true, kernel: k, initrd: i, hvInitrd: h})
		if err != nil {
			return nil, err
		}
		defer s.app.stop()
		s.apps = []*appliance{s.app}
		s.logf("corrald pid %d ready; %d machines over %s, %d nodes", s.app.pid, cfg.Machines, cfg.Stagger, cfg.Nodes)
		return s.storm(ctx)
	}
	s.logf("namespaces up (machines %s, etcd %s, appliances %s ...); starting etcd", s.topo.clientNS, s.topo.etcd.ns, s.topo.serverNS)
	s.etcd, err = startEtcd(ctx, s.topo, filepath.Join(cfg.WorkDir, "etcd"), cfg.StartTimeout)
	if err != nil {
		return nil, err
	}
	defer s.etcd.stop() // after the appliances (deferred later): they leave the fleet through etcd
	var key []byte
	for n := range cfg.Appliances {
		sp := applianceSpec{index: n, name: fmt.Sprintf("fsim-a%d", n+1), port: s.topo.apps[n], dhcp: n == 0 || !cfg.FirstDHCPOnly,
			fleet:  []string{"--store", "etcd", "--etcd-endpoints", s.etcd.endpoints(), "--etcd-prefix", etcdPrefix},
			kernel: k, initrd: i, hvInitrd: h, clusterKey: key}
		sp.workDir = filepath.Join(cfg.WorkDir, sp.name)
		if err := os.MkdirAll(sp.workDir, 0o755); err != nil {
			return nil, err
		}
		a, err := startAppliance(ctx, &s.cfg, s.topo, sp)
		if err != nil {
			return nil, err
		}
		defer a.stop()
		s.apps = append(s.apps, a)
		if n == 0 {
			// What an operator adding an appliance copies.
			s.app = a
			if key, err = os.ReadFile(filepath.Join(a.dataDir, "cluster.key")); err != nil {
				return nil, fmt.Errorf("%s's cluster key: %w", a.name, err)
			}
		}
		s.logf("corrald %s pid %d ready on %s", a.name, a.pid, a.addr)
	}
	s.logf("a fleet of %d appliances on etcd (members %s); %d machines over %s, %d nodes", len(s.apps), s.etcd.endpoints(), cfg.Machines, cfg.Stagger, cfg.Nodes)
	return s.storm(ctx)
}

func (s *sim) storm(ctx context.Context) (*Report, error) {
	cfg := s.cfg
	var err error
	s.dhcp, err = newDHCPNet(s.topo, s.dhcpServers())
	if err != nil {
		return nil, err
	}
	bg, stopBG := context.WithCancel(context.Background())
	var bgWG sync.WaitGroup
	bgWG.Add(1)
	go func() { defer bgWG.Done(); s.dhcp.run(bg) }()
	defer func() { stopBG(); bgWG.Wait() }()

	adminCfg, err := clientconfig.Load(filepath.Join(s.app.dataDir, "admin.conf"))
	if err != nil {
		return nil, err
	}
	admin, err := clientconfig.Dial(adminCfg, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		return s.topo.client.dial(ctx, relayAddr, addr)
	}), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<30)))
	if err != nil {
		return nil, err
	}
	defer admin.Close()

	// The machines: identities and power-on offsets.
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 14))
	run := uint16(rng.IntN(1 << 16))
	ms := make([]*machine, cfg.Machines)
	for i := range ms {
		id := newMachineID(run, i, rng.Float64() < cfg.LargeShare)
		ms[i] = &machine{s: s, id: id, rebootCh: make(chan struct{}),
			dhcp:    dhcpClient{mac: id.macs[0], uuid: id.uuid, arch: archOf(rng.Float64() < cfg.UEFIShare), relayed: rng.Float64() < cfg.RelayShare},
			fullGet: rng.Float64() < cfg.FullFetchShare, node: i < cfg.Nodes, kexec: rng.Float64() < cfg.KexecShare}
		s.serials[id.serial] = true
	}
	offsets := make([]time.Duration, cfg.Machines+max(0, cfg.Nodes-cfg.Machines))
	for i := range offsets {
		offsets[i] = time.Duration(rng.Int64N(int64(cfg.Stagger)))
	}

	wctx, stopWatch := context.WithCancel(bg)
	var watchWG sync.WaitGroup
	watchWG.Add(2)
	go func() { defer watchWG.Done(); s.pollGauges(wctx) }()
	go func() { defer watchWG.Done(); s.watchNodes(wctx, poolv1.NewNodeServiceClient(admin)) }()
	defer func() { stopWatch(); watchWG.Wait() }()

	// Nodes heartbeat under nctx until the soak is over; machines run
	// under mctx.
	nctx, stopNodes := context.WithCancel(bg)
	var nodeWG sync.WaitGroup
	defer func() { stopNodes(); nodeWG.Wait() }()
	mctx, stopMachines := context.WithTimeout(ctx, cfg.Timeout)
	defer stopMachines()

	start := time.Now()
	cpu0 := s.app.start
	wait0 := runQueueWait(s.app.pid)
	fleet := s.etcd != nil
	snap0 := s.fleetSnap()
	self0, _ := readProc(os.Getpid())
	var prof *profile
	if cfg.ProfileSeconds > 0 {
		prof = startProfile(bg, s.app.pid, cfg.WorkDir, cfg.Stagger/2, time.Duration(cfg.ProfileSeconds)*time.Second)
	}
	var mWG sync.WaitGroup
	for i, m := range ms {
		mWG.Add(1)
		go func() {
			defer mWG.Done()
			defer s.done.Add(1)
			if !sleepCtx(mctx, offsets[i]) {
				s.st.fail("not powered on: run ended")
				return
			}
			m.powerOn = time.Now()
			if err := s.machineRun(mctx, nctx, m, &nodeWG); err != nil {
				s.st.fail(cause(err))
			}
		}()
	}
	for j := cfg.Machines; j < cfg.Nodes; j++ {
		nodeWG.Add(1)
		go func() {
			defer nodeWG.Done()
			if !sleepCtx(nctx, offsets[j]) {
				return
			}
			if err := s.extraNode(nctx, admin, adminCfg, j); err != nil {
				s.st.fail(cause(err))
			}
		}()
	}
	// Progress every 10 s.
	tick := time.NewTicker(10 * time.Second)
	finished := make(chan struct{})
	go func() { mWG.Wait(); close(finished) }()
loop:
	for {
		select {
		case <-finished:
			break loop
		case <-tick.C:
			s.viewMu.Lock()
			inv, dep, ready, nr := s.gInv, s.gDeployed, s.gReady, s.gNotReady
			s.viewMu.Unlock()
			procs := "corrald " + procLine(s.app.pid, cpu0, time.Since(start))
			if fleet {
				procs = s.fleetProcLine(snap0, time.Since(start))
			}
			s.logf("t=%3.0fs registered %d/%d; appliance: %d inventoried or later, %d deployed, nodes %d READY %d NOT_READY; machines done %d;%s",
				time.Since(start).Seconds(), s.registered.Load(), cfg.Machines, inv, dep, ready, nr, s.done.Load(), " "+procs)
		}
	}
	tick.Stop()
	stormEnd := time.Now()
	// Interrupted (or out of time): still read the appliance's view and
	// report what happened, without the wait and the soak.
	interrupted := ctx.Err() != nil
	if interrupted {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
	}
	// Machines still to become DEPLOYED in the appliance's view (the
	// lifecycle reconciler's pass): wait a while for them.
	if !interrupted {
		s.waitDeployed(ctx, int(s.nodesUp.Load()), 2*time.Minute)
	}
	var udpS int64
	for _, p := range s.topo.apps {
		udpS += udpDrops(ctx, p.ns)
	}
	udpC := udpDrops(ctx, s.topo.clientNS)
	for _, a := range s.apps {
		s.saveMetrics(a)
	}
	if fleet {
		s.saveEtcdMetrics()
	}
	metricsPath := s.metricsPath(s.app)
	s.logf("storm over after %.0fs; soaking %s with the nodes beating", stormEnd.Sub(start).Seconds(), cfg.Soak)
	// The soak is the steady state: nodes heartbeating, nothing booting.
	soak0 := s.cpuTicks()
	beats0 := s.st.n(PhaseHeartbeat)
	soakStart := time.Now()
	if !interrupted {
		sleepCtx(ctx, cfg.Soak)
	}
	end := time.Now()
	soak1 := s.cpuTicks()
	soakBeats := s.st.n(PhaseHeartbeat) - beats0

	// The appliance's own view, before anything stops.
	r := &Report{Machines: cfg.Machines, Nodes: cfg.Nodes, Appliances: cfg.Appliances, Setup: cfg.setup(), Stagger: cfg.Stagger, FullFetchShare: cfg.FullFetchShare,
		KernelBytes: cfg.KernelBytes, InitrdBytes: cfg.InitrdBytes}
	r.Seconds = stormEnd.Sub(start).Seconds()
	if interrupted {
		r.Notes = append(r.Notes, "interrupted: machines not done were stopped; no soak")
	}
	r.SoakSeconds = end.Sub(soakStart).Seconds()
	r.SoakCPUSeconds = float64(soak1-soak0) / clockTicks
	r.SoakHeartbeats = soakBeats
	if q, c, err := queueFigures(metricsPath); err == nil {
		r.Queues, r.MetricCounters = q, c
	} else {
		r.Notes = append(r.Notes, "corrald /metrics: "+err.Error())
	}
	if prof != nil {
		r.Profile, r.ProfileNote = prof.wait()
	}
	if err := s.applianceView(ctx, admin, r); err != nil {
		return nil, fmt.Errorf("appliance view: %w", err)
	}
	stopWatch()
	watchWG.Wait()
	r.WallSeconds = end.Sub(start).Seconds()
	if fleet {
		s.fleetFigures(ctx, adminCfg, snap0, r)
	}
	// Alone, corrald's figures; in a fleet, the sums over the
	// appliances (the fleet's CPU and memory; r.Fleet has each).
	for _, a := range s.apps {
		pe, _ := readProc(a.pid)
		r.CPUSeconds += float64(pe.ticks-a.start.ticks) / clockTicks
		r.PeakRSSBytes += int64(pe.hwmKB) << 10
		r.EndRSSBytes += int64(pe.rssKB) << 10
		r.StartRSSBytes += int64(a.start.rssKB) << 10
		r.Threads += pe.threads
		// Threads that ended are not in task/: a lower bound.
		if a == s.app {
			r.RunQueueSeconds += (runQueueWait(a.pid) - wait0).Seconds()
		} else {
			r.RunQueueSeconds += (runQueueWait(a.pid) - snap0[a.pid].wait).Seconds()
		}
	}
	if self, err := readProc(os.Getpid()); err == nil {
		r.SimCPUSeconds = float64(self.ticks-self0.ticks) / clockTicks
	}
	stopNodes()
	nodeWG.Wait()
	for _, a := range s.apps {
		a.stop()
	}
	// The bbolt file and what its journal still holds after Close; a
	// fleet's etcd database (each member holds all of it).
	for _, f := range []string{"corral.db", "corral.db.journal", "corral.db.journal.1"} {
		if fi, err := os.Stat(filepath.Join(s.app.dataDir, f)); err == nil && !fleet {
			r.StoreBytes += fi.Size()
		}
	}
	if len(r.Etcd) > 0 {
		r.StoreBytes = int64(r.Etcd[0].DBBytes)
	}
	s.viewMu.Lock()
	if s.allInvAt.IsZero() {
		r.AllInventoriedAfter = -1
	} else {
		r.AllInventoriedAfter = s.allInvAt.Sub(start).Seconds()
	}
	r.Flaps, r.FlapLines = max(s.flaps, s.maxNotReady), slices.Clone(s.flapList)
	r.MaxNotReady = s.maxNotReady
	s.viewMu.Unlock()
	s.leaseMu.Lock()
	r.Duplicates, r.DupLines = s.dups, slices.Clone(s.dupLines)
	holders := maps(s.holders)
	s.leaseMu.Unlock()
	check := s.checkLeases
	if fleet {
		check = s.checkLeasesEtcd
	}
	if err := check(ctx, holders, r); err != nil {
		r.Notes = append(r.Notes, "lease cross-check: "+err.Error())
	}
	r.Phases = s.st.figures()
	s.st.mu.Lock()
	r.Failures = maps(s.st.failures)
	r.Counters = maps(s.st.counts)
	s.st.mu.Unlock()
	s.dhcp.mu.Lock()
	r.Counters["dhcp answers for no waiting exchange"] = int64(s.dhcp.unmatched)
	s.dhcp.mu.Unlock()
	r.Counters["udp receive-buffer drops, corrald's namespace"] = udpS
	r.Counters["udp receive-buffer drops, machines' namespace"] = udpC
	r.Registered = int(s.registered.Load())
	if n := s.lastReg.Load(); n > 0 && r.Registered == cfg.Machines {
		r.AllRegisteredAfter = time.Unix(0, n).Sub(start).Seconds()
	}
	r.Load = loadavg()
	return r, nil
}

// machineRun is one machine from power-on: the discovery boot, the agent
// until the appliance reboots it after the install, then (for the first
// M) the hypervisor boot and the node's heartbeats under nctx.
func (s *sim) machineRun(ctx, nctx context.Context, m *machine, nodeWG *sync.WaitGroup) error {
	bs, err := m.bootRetry(ctx)
	if err != nil {
		return err
	}
	if bs.intent != "discover" {
		return fmt.Errorf("first boot: intent %s, want discover", bs.intent)
	}
	if n := s.cfg.DropRegistration; n > 0 && m.id.index%n == n-1 {
		// Test hook: this machine's agent never runs.
		return errors.New("registration dropped (test)")
	}
	if err := m.discover(ctx, bs); err != nil {
		return err
	}
	if !m.node {
		return nil
	}
	m.mu.Lock()
	certPEM, keyPEM, caPEM, name, rebootAt, kexecd := m.certPEM, m.keyPEM, m.caPEM, m.name, m.rebootAt, m.kexecd
	nodeEndpoint := m.nodeEndpoint
	m.mu.Unlock()
	readyPhase := PhaseKexecReady
	if !kexecd {
		// The hypervisor boot through the firmware.
		readyPhase = PhaseReboot
		bs, err = m.bootRetry(ctx)
		if err != nil {
			return fmt.Errorf("hypervisor boot: %w", err)
		}
		if !strings.HasPrefix(bs.intent, "hypervisor") && bs.intent != "local" {
			return fmt.Errorf("second boot: intent %s, want hypervisor", bs.intent)
		}
	}
	creds, err := nodeCreds(certPEM, keyPEM, caPEM)
	if err != nil {
		return err
	}
	// The node dials the appliance its install plan names (the real
	// node starts there and fails over along the plan's list).
	endpoint := cmp.Or(nodeEndpoint, fmt.Sprintf("%s:%d", serverAddr, apiPort))
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(creds),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return s.topo.client.dial(ctx, m.ip, addr) }))
	if err != nil {
		return err
	}
	req := &poolv1.ApplyNodeRequest{Name: name, Address: m.ip.String(), Serial: m.id.serial, HypervisorPort: 20181,
		CpuMilliCores: 64000, MemoryBytes: 256 << 30, StorageBytes: 3 << 40, Rack: fmt.Sprintf("r%02d", m.id.index/40), Unit: uint32(m.id.index%40 + 1)}
	ready := make(chan struct{})
	nodeWG.Add(1)
	go func() {
		defer nodeWG.Done()
		defer conn.Close()
		s.heartbeat(nctx, conn, req, func() {
			s.st.observe(readyPhase, time.Since(rebootAt))
			s.nodesUp.Add(1)
			close(ready)
		})
	}()
	select {
	case <-ready:
		return nil
	case <-ctx.Done():
		return errors.New("node never applied: run ended")
	}
}

// extraNode is node j beyond the machines: it joins with the admin token
// and a CSR, then heartbeats.
func (s *sim) extraNode(ctx context.Context, admin *grpc.ClientConn, adminCfg *clientconfig.Config, j int) error {
	ip := extraNodes.Addr().Next()
	for range j - s.cfg.Machines {
		ip = ip.Next()
	}
	if err := s.topo.addAddr(ip); err != nil {
		return failure("address", err)
	}
	name := fmt.Sprintf("simnode-%05d", j)
	t := time.Now()
	certPEM, keyPEM, err := joinNode(ctx, admin, name)
	if err != nil {
		return failure("join", err)
	}
	s.st.observe(PhaseNodeJoin, time.Since(t))
	creds, err := nodeCreds(certPEM, keyPEM, []byte(adminCfg.CACert))
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(fmt.Sprintf("%s:%d", serverAddr, apiPort), grpc.WithTransportCredentials(creds),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return s.topo.client.dial(ctx, ip, addr) }))
	if err != nil {
		return err
	}
	defer conn.Close()
	s.heartbeat(ctx, conn, &poolv1.ApplyNodeRequest{Name: name, Address: ip.String(), HypervisorPort: 20181, Serial: "X" + name,
		CpuMilliCores: 64000, MemoryBytes: 256 << 30, StorageBytes: 3 << 40}, func() {})
	return nil
}
