package lab

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/corralhq/corral/api/clientconfig"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"google.golang.org/grpc"
)

// api is a connection to the lab's corrald.
type api struct {
	cc       *grpc.ClientConn
	machines inventoryv1.MachineServiceClient
	nodes    poolv1.NodeServiceClient
}

// dialAPI connects to the lab's corrald; in a fleet, to the first
// appliance whose process runs (any appliance serves the whole API).
func dialAPI(s *State) (*api, error) {
	if !s.Fleet() {
		return dialConfig(s.ClientConfig)
	}
	for _, a := range s.Appliances {
		if alive(a.Process.PID, a.Process.Marker) {
			return dialConfig(a.ClientConfig)
		}
	}
	return nil, errNoAppliance
}

// dialConfig connects with a corral client file.
func dialConfig(path string) (*api, error) {
	cfg, err := clientconfig.Load(path)
	if err != nil {
		return nil, err
	}
	cc, err := clientconfig.Dial(cfg)
	if err != nil {
		return nil, err
	}
	return &api{cc: cc, machines: inventoryv1.NewMachineServiceClient(cc), nodes: poolv1.NewNodeServiceClient(cc)}, nil
}

func (a *api) Close() error { return a.cc.Close() }

// view is what the lab knows of one of its machines at one moment.
type view struct {
	Machine *inventoryv1.Machine // nil until corrald has a record for the MAC
	Node    *poolv1.Node         // nil until the machine joined the pool
}

// State is the machine's lifecycle state name ("" when unknown).
func (v view) State() string {
	if v.Machine == nil {
		return ""
	}
	return v.Machine.GetState().String()
}

// NodeState is the node's state name ("" when there is none).
func (v view) NodeState() string {
	if v.Node == nil {
		return ""
	}
	return v.Node.GetState().String()
}

// snapshot reads every lab machine (by MAC) and its node.
func (a *api) snapshot(ctx context.Context, s *State) (map[string]view, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ml, err := a.machines.ListMachines(ctx, &inventoryv1.ListMachinesRequest{PageSize: 100})
	if err != nil {
		return nil, fmt.Errorf("list machines: %w", err)
	}
	nl, err := a.nodes.ListNodes(ctx, &poolv1.ListNodesRequest{PageSize: 1000}) // a lab has a handful of machines: one page
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	out := map[string]view{}
	for _, lm := range s.Machines {
		var v view
		for _, m := range ml.GetMachines() {
			if m.GetBootMac() == lm.MAC || contains(m.GetMacs(), lm.MAC) || m.GetName() == lm.Name || (m.GetSerial() != "" && m.GetSerial() == lm.Serial) {
				// Prefer the record that has the serial (the registered one).
				if v.Machine == nil || (v.Machine.GetSerial() == "" && m.GetSerial() != "") {
					v.Machine = m
				}
			}
		}
		for _, n := range nl.GetNodes() {
			if (v.Machine != nil && v.Machine.GetNodeName() != "" && n.GetName() == v.Machine.GetNodeName()) || n.GetSerial() == lm.Serial {
				v.Node = n
			}
		}
		out[lm.Name] = v
	}
	return out, nil
}

// timeline returns a machine's timeline oldest first.
func (a *api) timeline(ctx context.Context, lm Machine, v view, limit uint32) ([]*inventoryv1.TimelineEntry, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req := &inventoryv1.TimelineRequest{Mac: lm.MAC, Limit: limit}
	if v.Machine != nil {
		req = &inventoryv1.TimelineRequest{Name: v.Machine.GetName(), Limit: limit}
	}
	r, err := a.machines.Timeline(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("timeline of %s: %w", lm.Name, err)
	}
	es := r.GetEntries()
	sort.SliceStable(es, func(i, j int) bool { return es[i].GetAt().AsTime().Before(es[j].GetAt().AsTime()) })
	return es, nil
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}
