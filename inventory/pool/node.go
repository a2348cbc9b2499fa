package pool

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"regexp"
	"sort"
	"strconv"
	"strings"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func newNode() *poolv1.Node { return &poolv1.Node{} }

var hostRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$`)

// checkHost accepts an IP address or a DNS name, optionally with :port
// (1-65535; IPv6 with a port in brackets). A name whose last label is all
// digits is refused: it is a mistyped IPv4 address such as 300.1.1.1 or
// 10.1.1, not a host name.
func checkHost(what, s string) error {
	if s == "" {
		return nil
	}
	if _, err := netip.ParseAddr(s); err == nil {
		return nil
	}
	if _, err := netip.ParseAddrPort(s); err == nil {
		return nil
	}
	bad := invalidf("%s %q is neither an IP address nor a host name (with an optional :port)", what, s)
	host := s
	if i := strings.LastIndexByte(s, ':'); i >= 0 && !strings.Contains(s[:i], ":") {
		host = s[:i]
		if port, err := strconv.ParseUint(s[i+1:], 10, 16); err != nil || port == 0 {
			return bad
		}
	}
	if len(host) > 253 || !hostRE.MatchString(host) {
		return bad
	}
	last := host[strings.LastIndexByte(host, '.')+1:]
	if strings.Trim(last, "0123456789") == "" {
		return bad
	}
	return nil
}

// ListNodes returns every node in name order (an empty slice when none).
func (p *Pool) ListNodes(ctx context.Context) ([]*poolv1.Node, error) {
	ns, err := record.List(ctx, p.cfg.Store, nodePrefix, newNode)
	for _, n := range ns {
		p.overlay(n)
	}
	return ns, err
}

// GetNode returns one node.
func (p *Pool) GetNode(ctx context.Context, name string) (*poolv1.Node, error) {
	if err := CheckName("node name", name); err != nil {
		return nil, err
	}
	n := newNode()
	if _, err := record.Get(ctx, p.cfg.Store, nodePrefix+name, n); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, notFoundf("node %q", name)
		}
		return nil, err
	}
	p.overlay(n)
	return n, nil
}

// ApplyNode creates or updates a node's spec. Reservations and heartbeat
// state are kept; capacity may not shrink below what is reserved. Applying a
// node counts as a heartbeat: the node becomes READY.
func (p *Pool) ApplyNode(ctx context.Context, req *poolv1.ApplyNodeRequest) (*poolv1.Node, error) {
	if err := CheckName("node name", req.GetName()); err != nil {
		return nil, err
	}
	if err := checkMeta("annotation", req.GetAnnotations()); err != nil {
		return nil, err
	}
	if err := checkMeta("label", req.GetLabels()); err != nil {
		return nil, err
	}
	if err := checkHost("address", req.GetAddress()); err != nil {
		return nil, err
	}
	if err := checkHost("ipmi_address", req.GetIpmiAddress()); err != nil {
		return nil, err
	}
	if req.GetCpuMilliCores() == 0 {
		return nil, invalidf("node %q: cpu_milli_cores must be > 0", req.GetName())
	}
	if req.GetMemoryBytes() == 0 {
		return nil, invalidf("node %q: memory_bytes must be > 0", req.GetName())
	}
	if req.GetHypervisorPort() > 65535 {
		return nil, invalidf("node %q: hypervisor_port %d out of range", req.GetName(), req.GetHypervisorPort())
	}
	now := p.cfg.Now()
	if n, ok := p.beatOnly(ctx, req, now); ok {
		return n, nil
	}
	ts := timestamppb.New(now)
	return record.Mutate(ctx, p.cfg.Store, nodePrefix+req.GetName(), newNode, func(n *poolv1.Node, exists bool) (bool, error) {
		if exists {
			if err := p.checkShrink(req, n); err != nil {
				return false, err
			}
		}
		applySpec(n, req, ts)
		return false, nil
	})
}

// applySpec sets n from req, READY with heartbeat at hb; reservations are
// kept.
func applySpec(n *poolv1.Node, req *poolv1.ApplyNodeRequest, hb *timestamppb.Timestamp) {
	n.Name = req.GetName()
	n.Annotations = maps.Clone(req.GetAnnotations())
	n.Labels = maps.Clone(req.GetLabels())
	n.Address = req.GetAddress()
	n.IpmiAddress = req.GetIpmiAddress()
	n.Serial = req.GetSerial()
	n.CpuMilliCores = req.GetCpuMilliCores()
	n.MemoryBytes = req.GetMemoryBytes()
	n.StorageBytes = req.GetStorageBytes()
	n.Datacenter = req.GetDatacenter()
	n.AvailabilityZone = req.GetAvailabilityZone()
	n.Cell = req.GetCell()
	n.Rack = req.GetRack()
	n.Unit = req.GetUnit()
	n.HypervisorPort = req.GetHypervisorPort()
	n.State = poolv1.Node_READY
	n.LastHeartbeat = hb
}

// checkShrink refuses a new capacity that is below the reserved requests,
// or that shrinks a resource whose reserved limits then exceed ratio x
// capacity: either would leave the node in a state no sequence of
// reservations could reach. The limit check applies only to a resource
// whose capacity shrinks, so that lowering a limit ratio in the Config does
// not make every re-apply (heartbeat) of an unchanged node fail.
func (p *Pool) checkShrink(req *poolv1.ApplyNodeRequest, old *poolv1.Node) error {
	u := usage(old)
	cpu, mem, st := uint64(req.GetCpuMilliCores()), req.GetMemoryBytes(), req.GetStorageBytes()
	if u.reqCPU > cpu || u.reqMem > mem || u.reqStorage > st {
		return preconditionf("node %q: new capacity (cpu %d, memory %d, storage %d) is below what is reserved (cpu %d, memory %d, storage %d)",
			req.GetName(), cpu, mem, st, u.reqCPU, u.reqMem, u.reqStorage)
	}
	type dim struct {
		what        string
		newCap, old uint64
		limits      uint64
		ratio       float64
	}
	for _, d := range []dim{
		{"cpu", cpu, uint64(old.GetCpuMilliCores()), u.limCPU, p.cfg.CPULimitRatio},
		{"memory", mem, old.GetMemoryBytes(), u.limMem, p.cfg.MemoryLimitRatio},
		{"storage", st, old.GetStorageBytes(), u.limStorage, p.cfg.StorageLimitRatio},
	} {
		if d.newCap < d.old && d.limits > scaled(d.newCap, d.ratio) {
			return preconditionf("node %q: new %s capacity %d is below the reserved %s limits %d over the limit ratio %g",
				req.GetName(), d.what, d.newCap, d.what, d.limits, d.ratio)
		}
	}
	return nil
}

// DeleteNode removes a node. It is refused while the node holds
// reservations that lack the disable-deletion-lock annotation.
func (p *Pool) DeleteNode(ctx context.Context, name string) error {
	if err := CheckName("node name", name); err != nil {
		return err
	}
	_, err := record.Mutate(ctx, p.cfg.Store, nodePrefix+name, newNode, func(n *poolv1.Node, exists bool) (bool, error) {
		if !exists {
			return false, notFoundf("node %q", name)
		}
		var held []string
		for k, c := range n.GetReservedComputes() {
			if _, ok := c.GetAnnotations()[AnnotationNodeDisableDeletionLock]; !ok {
				held = append(held, "compute/"+k)
			}
		}
		for k, s := range n.GetReservedStorages() {
			if _, ok := s.GetAnnotations()[AnnotationNodeDisableDeletionLock]; !ok {
				held = append(held, "storage/"+k)
			}
		}
		if len(held) > 0 {
			sort.Strings(held)
			return false, preconditionf("node %q still holds %d reservation(s): %s", name, len(held), strings.Join(held, ", "))
		}
		return true, nil
	})
	if err == nil {
		p.beats.forget(name)
	}
	return err
}

// nodeUsage sums the reservations of a node.
type nodeUsage struct {
	reqCPU, limCPU         uint64
	reqMem, limMem         uint64
	reqStorage, limStorage uint64
}

// usage sums saturate at math.MaxUint64 instead of wrapping.
func usage(n *poolv1.Node) nodeUsage {
	var u nodeUsage
	for _, c := range n.GetReservedComputes() {
		u.reqCPU = addSat(u.reqCPU, uint64(c.GetRequestCpuMilliCore()))
		u.limCPU = addSat(u.limCPU, uint64(c.GetLimitCpuMilliCore()))
		u.reqMem = addSat(u.reqMem, c.GetRequestMemoryBytes())
		u.limMem = addSat(u.limMem, c.GetLimitMemoryBytes())
	}
	for _, s := range n.GetReservedStorages() {
		u.reqStorage = addSat(u.reqStorage, s.GetRequestBytes())
		u.limStorage = addSat(u.limStorage, s.GetLimitBytes())
	}
	return u
}

func addSat(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxUint64
}

// over reports whether used+add exceeds capacity, without overflowing.
func over(used, add, capacity uint64) bool { return used > capacity || add > capacity-used }

// scaled is ratio x capacity, never below capacity (ratio >= 1 even when
// float64 rounds) and saturating at math.MaxUint64 (ratio may be +Inf).
func scaled(capacity uint64, ratio float64) uint64 {
	if ratio == 1 {
		return capacity
	}
	f := float64(capacity) * ratio
	if f >= 0x1p64 {
		return math.MaxUint64
	}
	return max(uint64(f), capacity)
}

// fitCompute reports why c does not fit on n, or nil.
func (p *Pool) fitCompute(n *poolv1.Node, c *poolv1.Compute) error {
	u := usage(n)
	switch {
	case over(u.reqCPU, uint64(c.GetRequestCpuMilliCore()), uint64(n.GetCpuMilliCores())):
		return exhaustedf("node %q: cpu request %d + reserved %d > capacity %d milli-cores",
			n.GetName(), c.GetRequestCpuMilliCore(), u.reqCPU, n.GetCpuMilliCores())
	case over(u.reqMem, c.GetRequestMemoryBytes(), n.GetMemoryBytes()):
		return exhaustedf("node %q: memory request %d + reserved %d > capacity %d bytes",
			n.GetName(), c.GetRequestMemoryBytes(), u.reqMem, n.GetMemoryBytes())
	case over(u.limCPU, uint64(c.GetLimitCpuMilliCore()), scaled(uint64(n.GetCpuMilliCores()), p.cfg.CPULimitRatio)):
		return exhaustedf("node %q: cpu limit %d + reserved limits %d > %g x capacity %d milli-cores",
			n.GetName(), c.GetLimitCpuMilliCore(), u.limCPU, p.cfg.CPULimitRatio, n.GetCpuMilliCores())
	case over(u.limMem, c.GetLimitMemoryBytes(), scaled(n.GetMemoryBytes(), p.cfg.MemoryLimitRatio)):
		return exhaustedf("node %q: memory limit %d + reserved limits %d > %g x capacity %d bytes",
			n.GetName(), c.GetLimitMemoryBytes(), u.limMem, p.cfg.MemoryLimitRatio, n.GetMemoryBytes())
	}
	return nil
}

func (p *Pool) fitStorage(n *poolv1.Node, s *poolv1.Storage) error {
	u := usage(n)
	switch {
	case over(u.reqStorage, s.GetRequestBytes(), n.GetStorageBytes()):
		return exhaustedf("node %q: storage request %d + reserved %d > capacity %d bytes",
			n.GetName(), s.GetRequestBytes(), u.reqStorage, n.GetStorageBytes())
	case over(u.limStorage, s.GetLimitBytes(), scaled(n.GetStorageBytes(), p.cfg.StorageLimitRatio)):
		return exhaustedf("node %q: storage limit %d + reserved limits %d > %g x capacity %d bytes",
			n.GetName(), s.GetLimitBytes(), u.limStorage, p.cfg.StorageLimitRatio, n.GetStorageBytes())
	}
	return nil
}

func checkCompute(name string, c *poolv1.Compute) error {
	if err := CheckName("compute_name", name); err != nil {
		return err
	}
	if err := checkMeta("annotation", c.GetAnnotations()); err != nil {
		return err
	}
	if c.GetRequestCpuMilliCore() == 0 || c.GetLimitCpuMilliCore() == 0 {
		return invalidf("compute %q: request_cpu_milli_core and limit_cpu_milli_core must be > 0", name)
	}
	if c.GetRequestMemoryBytes() == 0 || c.GetLimitMemoryBytes() == 0 {
		return invalidf("compute %q: request_memory_bytes and limit_memory_bytes must be > 0", name)
	}
	if c.GetRequestCpuMilliCore() > c.GetLimitCpuMilliCore() {
		return invalidf("compute %q: request_cpu_milli_core %d > limit_cpu_milli_core %d", name, c.GetRequestCpuMilliCore(), c.GetLimitCpuMilliCore())
	}
	if c.GetRequestMemoryBytes() > c.GetLimitMemoryBytes() {
		return invalidf("compute %q: request_memory_bytes %d > limit_memory_bytes %d", name, c.GetRequestMemoryBytes(), c.GetLimitMemoryBytes())
	}
	return nil
}

func checkStorage(name string, s *poolv1.Storage) error {
	if err := CheckName("storage_name", name); err != nil {
		return err
	}
	if err := checkMeta("annotation", s.GetAnnotations()); err != nil {
		return err
	}
	if s.GetRequestBytes() == 0 || s.GetLimitBytes() == 0 {
		return invalidf("storage %q: request_bytes and limit_bytes must be > 0", name)
	}
	if s.GetRequestBytes() > s.GetLimitBytes() {
		return invalidf("storage %q: request_bytes %d > limit_bytes %d", name, s.GetRequestBytes(), s.GetLimitBytes())
	}
	return nil
}

// reserve adds a reservation to a node by CAS; add checks fit and inserts.
func (p *Pool) reserve(ctx context.Context, nodeName string, add func(n *poolv1.Node) error) (*poolv1.Node, error) {
	if err := CheckName("node_name", nodeName); err != nil {
		return nil, err
	}
	return record.Mutate(ctx, p.cfg.Store, nodePrefix+nodeName, newNode, func(n *poolv1.Node, exists bool) (bool, error) {
		if !exists {
			return false, notFoundf("node %q", nodeName)
		}
		if n.GetState() != poolv1.Node_READY {
			return false, preconditionf("node %q is %s, not READY: no new placement", nodeName, n.GetState())
		}
		return false, add(n)
	})
}

// ReserveCompute books compute on a named node. The node must be READY and
// have room for both the requests and (within the limit ratios) the limits.
func (p *Pool) ReserveCompute(ctx context.Context, nodeName, computeName string, c *poolv1.Compute) (*poolv1.Node, error) {
	if err := checkCompute(computeName, c); err != nil {
		return nil, err
	}
	return p.reserve(ctx, nodeName, func(n *poolv1.Node) error { return p.addCompute(n, computeName, c) })
}

func (p *Pool) addCompute(n *poolv1.Node, name string, c *poolv1.Compute) error {
	if _, ok := n.GetReservedComputes()[name]; ok {
		return existsf("compute %q is already reserved on node %q", name, n.GetName())
	}
	if err := p.fitCompute(n, c); err != nil {
		return err
	}
	if n.ReservedComputes == nil {
		n.ReservedComputes = map[string]*poolv1.Compute{}
	}
	n.ReservedComputes[name] = proto.CloneOf(c)
	return nil
}

func (p *Pool) addStorage(n *poolv1.Node, name string, s *poolv1.Storage) error {
	if _, ok := n.GetReservedStorages()[name]; ok {
		return existsf("storage %q is already reserved on node %q", name, n.GetName())
	}
	if err := p.fitStorage(n, s); err != nil {
		return err
	}
	if n.ReservedStorages == nil {
		n.ReservedStorages = map[string]*poolv1.Storage{}
	}
	n.ReservedStorages[name] = proto.CloneOf(s)
	return nil
}

// ReleaseCompute removes a compute reservation; NotFound when absent.
func (p *Pool) ReleaseCompute(ctx context.Context, nodeName, computeName string) error {
	if err := CheckName("node_name", nodeName); err != nil {
		return err
	}
	if err := CheckName("compute_name", computeName); err != nil {
		return err
	}
	_, err := record.Mutate(ctx, p.cfg.Store, nodePrefix+nodeName, newNode, func(n *poolv1.Node, exists bool) (bool, error) {
		if !exists {
			return false, notFoundf("node %q", nodeName)
		}
		if _, ok := n.GetReservedComputes()[computeName]; !ok {
			return false, notFoundf("compute %q on node %q", computeName, nodeName)
		}
		delete(n.ReservedComputes, computeName)
		return false, nil
	})
	return err
}

// ReserveStorage books storage on a named node.
func (p *Pool) ReserveStorage(ctx context.Context, nodeName, storageName string, s *poolv1.Storage) (*poolv1.Node, error) {
	if err := checkStorage(storageName, s); err != nil {
		return nil, err
	}
	return p.reserve(ctx, nodeName, func(n *poolv1.Node) error { return p.addStorage(n, storageName, s) })
}

// ReleaseStorage removes a storage reservation; NotFound when absent.
func (p *Pool) ReleaseStorage(ctx context.Context, nodeName, storageName string) error {
	if err := CheckName("node_name", nodeName); err != nil {
		return err
	}
	if err := CheckName("storage_name", storageName); err != nil {
		return err
	}
	_, err := record.Mutate(ctx, p.cfg.Store, nodePrefix+nodeName, newNode, func(n *poolv1.Node, exists bool) (bool, error) {
		if !exists {
			return false, notFoundf("node %q", nodeName)
		}
		if _, ok := n.GetReservedStorages()[storageName]; !ok {
			return false, notFoundf("storage %q on node %q", storageName, nodeName)
		}
		delete(n.ReservedStorages, storageName)
		return false, nil
	})
	return err
}

// ScheduleCompute picks a READY node for c and reserves it there: nodes
// that cannot fit the requests or limits are filtered out, the rest are
// scored least-allocated (mean free fraction of CPU and memory after
// placement), and ties go to the rack holding the fewest computes, then to
// the node name. A lost race for the chosen node re-runs the choice.
func (p *Pool) ScheduleCompute(ctx context.Context, computeName string, c *poolv1.Compute) (*poolv1.Node, error) {
	if err := checkCompute(computeName, c); err != nil {
		return nil, err
	}
	return p.schedule(ctx, "compute", computeName,
		func(n *poolv1.Node) bool { _, ok := n.GetReservedComputes()[computeName]; return ok },
		func(n *poolv1.Node) error { return p.fitCompute(n, c) },
		func(n *poolv1.Node) float64 {
			u := usage(n)
			cpu := 1 - float64(u.reqCPU+uint64(c.GetRequestCpuMilliCore()))/float64(n.GetCpuMilliCores())
			mem := 1 - float64(u.reqMem+c.GetRequestMemoryBytes())/float64(n.GetMemoryBytes())
			return (cpu + mem) / 2
		},
		func(n *poolv1.Node) int { return len(n.GetReservedComputes()) },
		func(ctx context.Context, node string) (*poolv1.Node, error) {
			return p.reserve(ctx, node, func(n *poolv1.Node) error { return p.addCompute(n, computeName, c) })
		})
}

// ScheduleStorage is ScheduleCompute for storage: least-allocated by
// storage bytes, spread across racks on ties.
func (p *Pool) ScheduleStorage(ctx context.Context, storageName string, s *poolv1.Storage) (*poolv1.Node, error) {
	if err := checkStorage(storageName, s); err != nil {
		return nil, err
	}
	return p.schedule(ctx, "storage", storageName,
		func(n *poolv1.Node) bool { _, ok := n.GetReservedStorages()[storageName]; return ok },
		func(n *poolv1.Node) error { return p.fitStorage(n, s) },
		func(n *poolv1.Node) float64 {
			return 1 - float64(usage(n).reqStorage+s.GetRequestBytes())/float64(n.GetStorageBytes())
		},
		func(n *poolv1.Node) int { return len(n.GetReservedStorages()) },
		func(ctx context.Context, node string) (*poolv1.Node, error) {
			return p.reserve(ctx, node, func(n *poolv1.Node) error { return p.addStorage(n, storageName, s) })
		})
}

const scheduleAttempts = 8

func (p *Pool) schedule(ctx context.Context, kind, name string,
	has func(*poolv1.Node) bool, fit func(*poolv1.Node) error, score func(*poolv1.Node) float64,
	count func(*poolv1.Node) int, reserve func(context.Context, string) (*poolv1.Node, error)) (*poolv1.Node, error) {
	var lastErr error
	for attempt := 0; attempt < scheduleAttempts; attempt++ {
		nodes, err := p.ListNodes(ctx)
		if err != nil {
			return nil, err
		}
		type cand struct {
			node      *poolv1.Node
			score     float64
			rackCount int
		}
		rackLoad := map[string]int{}
		for _, n := range nodes {
			if has(n) {
				return nil, existsf("%s %q is already reserved on node %q", kind, name, n.GetName())
			}
			rackLoad[n.GetRack()] += count(n)
		}
		var cands []cand
		var reasons []string
		for _, n := range nodes {
			if n.GetState() != poolv1.Node_READY {
				reasons = append(reasons, fmt.Sprintf("%s: %s", n.GetName(), n.GetState()))
				continue
			}
			if err := fit(n); err != nil {
				reasons = append(reasons, strings.TrimPrefix(err.Error(), apierr.ErrExhausted.Error()+": "))
				continue
			}
			cands = append(cands, cand{node: n, score: score(n), rackCount: rackLoad[n.GetRack()]})
		}
		if len(cands) == 0 {
			if len(nodes) == 0 {
				return nil, exhaustedf("no node to place %s %q: the pool is empty", kind, name)
			}
			return nil, exhaustedf("no READY node fits %s %q: %s", kind, name, strings.Join(reasons, "; "))
		}
		sort.Slice(cands, func(i, j int) bool {
			a, b := cands[i], cands[j]
			if d := a.score - b.score; d > 1e-9 || d < -1e-9 {
				return a.score > b.score
			}
			if a.rackCount != b.rackCount {
				return a.rackCount < b.rackCount
			}
			return a.node.GetName() < b.node.GetName()
		})
		for _, c := range cands {
			n, err := reserve(ctx, c.node.GetName())
			if err == nil {
				p.log.Debug("scheduled", "kind", kind, "reservation", name, "node", n.GetName())
				return n, nil
			}
			if errors.Is(err, apierr.ErrAlreadyExists) || ctx.Err() != nil {
				return nil, err
			}
			// Lost a race for this node (filled up, went NOT_READY, or was
			// deleted): try the next candidate, then re-list.
			lastErr = err
		}
	}
	return nil, fmt.Errorf("schedule %s %q: gave up after %d attempts: %w", kind, name, scheduleAttempts, lastErr)
}

// WatchNodes streams the names of nodes that change (applied, swept,
// reserved, deleted) until ctx ends or the store drops the watcher; the
// channel is closed then.
func (p *Pool) WatchNodes(ctx context.Context) (<-chan string, error) {
	evs, err := p.cfg.Store.Watch(ctx, nodePrefix)
	if err != nil {
		return nil, err
	}
	out := make(chan string, 64)
	go func() {
		defer close(out)
		for ev := range evs {
			select {
			case out <- strings.TrimPrefix(ev.KV.Key, nodePrefix):
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}
