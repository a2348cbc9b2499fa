package cli

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	deploymentv1 "github.com/corralhq/corral/api/deployment/v1"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
	"github.com/corralhq/corral/deploy"
)

// kind is how the CLI lists, gets, deletes and draws the records of one
// kind of deploy.DefaultRegistry, which owns the kind's names, aliases and
// apply action (shared with `corral do`).
type kind struct {
	name string // the registry kind's canonical name, as printed in "<kind>/<name>"

	columns []string
	row     func(proto.Message) []string
	// wide and wideRow are the extra columns of -o wide (none when nil).
	wide    []string
	wideRow func(proto.Message) []string

	// page reads one page of the kind's list (list.go).
	page func(ctx context.Context, cc grpc.ClientConnInterface, q pageQuery) ([]proto.Message, string, error)
	get  func(ctx context.Context, cc grpc.ClientConnInterface, name string) (proto.Message, error)
	del  func(ctx context.Context, cc grpc.ClientConnInterface, name string) error
	// watch opens the kind's Watch stream (nil: the kind cannot be
	// watched); see watch.go.
	watch func(ctx context.Context, cc grpc.ClientConnInterface, q watchQuery) (recvFunc, error)
}

// kinds is every kind the CLI can list and get.
var kinds = []*kind{nodeKind, networkKind, virtualMachineKind, blockStorageKind, imageKind, osImageKind, machineKind}

// tableOf returns the CLI's kind for a registry kind.
func tableOf(rk *deploy.Kind) (*kind, bool) {
	for _, k := range kinds {
		if k.name == rk.Name {
			return k, true
		}
	}
	return nil, false
}

// lookupKind resolves a kind name or alias through the registry.
func lookupKind(name string) (*kind, bool) {
	rk, ok := deploy.DefaultRegistry().Kind(name)
	if !ok {
		return nil, false
	}
	return tableOf(rk)
}

// kindArg resolves a kind given on the command line, or returns a usage
// error listing the valid kinds.
func kindArg(name string) (*kind, error) {
	k, ok := lookupKind(name)
	if !ok {
		return nil, usageErrorf("unknown kind %q (valid: %s)", name, kindList())
	}
	return k, nil
}

// kindList is "node|nodes, network|networks|net, ..." for messages: the
// registry's kinds the CLI has a table for, in registry order.
func kindList() string {
	var parts []string
	for _, rk := range deploy.DefaultRegistry().Kinds() {
		if _, ok := tableOf(rk); ok {
			parts = append(parts, strings.Join(append([]string{rk.Name}, rk.Aliases...), "|"))
		}
	}
	return strings.Join(parts, ", ")
}

// subject names one record in messages: `node "n1"`.
func (k *kind) subject(name string) string {
	return fmt.Sprintf("%s %q", k.name, name)
}

// plural names the records of k in sentences: "machines", "virtual
// machines".
func (k *kind) plural() string {
	return strings.ReplaceAll(k.name, "_", " ") + "s"
}

// recordName returns the "name" field of any record or request (the "id"
// of records without a name, such as audit events).
func recordName(m proto.Message) string {
	r := m.ProtoReflect()
	fd := r.Descriptor().Fields().ByName("name")
	if fd == nil {
		fd = r.Descriptor().Fields().ByName("id")
	}
	if fd == nil || fd.Kind() != protoreflect.StringKind {
		return ""
	}
	return r.Get(fd).String()
}

func sortByName(ms []proto.Message) {
	sort.SliceStable(ms, func(i, j int) bool { return recordName(ms[i]) < recordName(ms[j]) })
}

func messages[T proto.Message](items []T) []proto.Message {
	out := make([]proto.Message, len(items))
	for i, it := range items {
		out[i] = it
	}
	return out
}

// cell renders an empty table value as "-".
func cell(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// stateName shortens enum value names for tables: NODE_UNSPECIFIED and
// POWER_STATE_UNSPECIFIED print as UNSPECIFIED, POWER_STATE_ON as ON.
func stateName(s string, prefix string) string {
	if strings.HasSuffix(s, "UNSPECIFIED") {
		return "UNSPECIFIED"
	}
	return strings.TrimPrefix(s, prefix)
}

func joinSorted(ss []string) string {
	ss = append([]string(nil), ss...)
	sort.Strings(ss)
	return cell(strings.Join(ss, ","))
}

var nodeKind = &kind{
	name:    "node",
	columns: []string{"NAME", "STATE", "ADDRESS", "RACK", "CPU", "MEMORY", "STORAGE", "RESERVATIONS"},
	row: func(m proto.Message) []string {
		n := m.(*poolv1.Node)
		var cpu uint64
		var mem, disk uint64
		for _, c := range n.GetReservedComputes() {
			cpu += uint64(c.GetRequestCpuMilliCore())
			mem += c.GetRequestMemoryBytes()
		}
		for _, s := range n.GetReservedStorages() {
			disk += s.GetRequestBytes()
		}
		return []string{
			n.GetName(),
			stateName(n.GetState().String(), ""),
			cell(n.GetAddress()),
			cell(n.GetRack()),
			fmt.Sprintf("%d/%dm", cpu, n.GetCpuMilliCores()),
			humanBytes(mem) + "/" + humanBytes(n.GetMemoryBytes()),
			humanBytes(disk) + "/" + humanBytes(n.GetStorageBytes()),
			fmt.Sprintf("compute=%d,storage=%d", len(n.GetReservedComputes()), len(n.GetReservedStorages())),
		}
	},
	wide: []string{"SERIAL", "BMC", "LOCATION", "HYPERVISOR", "LAST-HEARTBEAT", "LABELS"},
	wideRow: func(m proto.Message) []string {
		n := m.(*poolv1.Node)
		var loc []string
		for _, p := range []string{n.GetDatacenter(), n.GetAvailabilityZone(), n.GetCell(), n.GetRack()} {
			if p != "" {
				loc = append(loc, p)
			}
		}
		if n.GetUnit() != 0 {
			loc = append(loc, "u"+strconv.FormatUint(uint64(n.GetUnit()), 10))
		}
		hv := "-"
		if n.GetAddress() != "" {
			port := n.GetHypervisorPort()
			if port == 0 {
				port = 20181
			}
			hv = net.JoinHostPort(n.GetAddress(), strconv.FormatUint(uint64(port), 10))
		}
		beat := "-"
		if hb := n.GetLastHeartbeat(); hb != nil {
			beat = shortAge(time.Since(hb.AsTime())) + " ago"
		}
		return []string{cell(n.GetSerial()), cell(n.GetIpmiAddress()), cell(strings.Join(loc, "/")), hv, beat, labelsCell(n.GetLabels())}
	},
	page: func(ctx context.Context, cc grpc.ClientConnInterface, q pageQuery) ([]proto.Message, string, error) {
		resp, err := poolv1.NewNodeServiceClient(cc).ListNodes(ctx, &poolv1.ListNodesRequest{PageSize: q.size, PageToken: q.token})
		return messages(resp.GetNodes()), resp.GetNextPageToken(), err
	},
	get: func(ctx context.Context, cc grpc.ClientConnInterface, name string) (proto.Message, error) {
		return poolv1.NewNodeServiceClient(cc).GetNode(ctx, &poolv1.GetNodeRequest{Name: name})
	},
	del: func(ctx context.Context, cc grpc.ClientConnInterface, name string) error {
		_, err := poolv1.NewNodeServiceClient(cc).DeleteNode(ctx, &poolv1.DeleteNodeRequest{Name: name})
		return err
	},
}

var networkKind = &kind{
	name:    "network",
	columns: []string{"NAME", "STATE", "IPV4", "IPV6", "GATEWAY", "VLAN", "INTERFACES"},
	row: func(m proto.Message) []string {
		n := m.(*poolv1.Network)
		var gw []string
		for _, g := range []string{n.GetIpv4Gateway(), n.GetIpv6Gateway()} {
			if g != "" {
				gw = append(gw, g)
			}
		}
		vlan := "-"
		if n.GetVlanId() != 0 {
			vlan = strconv.FormatUint(uint64(n.GetVlanId()), 10)
		}
		return []string{
			n.GetName(),
			stateName(n.GetState().String(), ""),
			cell(n.GetIpv4Cidr()),
			cell(n.GetIpv6Cidr()),
			cell(strings.Join(gw, ",")),
			vlan,
			strconv.Itoa(len(n.GetReservedNetworkInterfaces())),
		}
	},
	wide: []string{"DOMAIN", "DNS", "LABELS"},
	wideRow: func(m proto.Message) []string {
		n := m.(*poolv1.Network)
		return []string{cell(n.GetDomain()), cell(strings.Join(n.GetDnsServers(), ",")), labelsCell(n.GetLabels())}
	},
	page: func(ctx context.Context, cc grpc.ClientConnInterface, q pageQuery) ([]proto.Message, string, error) {
		resp, err := poolv1.NewNetworkServiceClient(cc).ListNetworks(ctx, &poolv1.ListNetworksRequest{PageSize: q.size, PageToken: q.token})
		return messages(resp.GetNetworks()), resp.GetNextPageToken(), err
	},
	get: func(ctx context.Context, cc grpc.ClientConnInterface, name string) (proto.Message, error) {
		return poolv1.NewNetworkServiceClient(cc).GetNetwork(ctx, &poolv1.GetNetworkRequest{Name: name})
	},
	del: func(ctx context.Context, cc grpc.ClientConnInterface, name string) error {
		_, err := poolv1.NewNetworkServiceClient(cc).DeleteNetwork(ctx, &poolv1.DeleteNetworkRequest{Name: name})
		return err
	},
}

var virtualMachineKind = &kind{
	name:    "virtual_machine",
	columns: []string{"NAME", "STATE", "NODE", "CPU", "MEMORY", "DISKS", "ADDRESSES"},
	row: func(m proto.Message) []string {
		vm := m.(*provisioningv1.VirtualMachine)
		var addrs []string
		for _, nic := range vm.GetNics() {
			var a []string
			for _, ip := range []string{nic.GetIpv4Address(), nic.GetIpv6Address()} {
				if ip != "" {
					a = append(a, nic.GetNetworkName()+"="+ip)
				}
			}
			if len(a) == 0 {
				a = []string{nic.GetNetworkName()}
			}
			addrs = append(addrs, a...)
		}
		state := stateName(vm.GetState().String(), "")
		if vm.GetAnnotations()[annVMNodeStatus] != "" {
			state += "(unverified)"
		}
		cpu := fmt.Sprintf("%dm", vm.GetLimitCpuMilliCore())
		if r := vm.GetRequestCpuMilliCore(); r != vm.GetLimitCpuMilliCore() {
			cpu = fmt.Sprintf("%d/%dm", r, vm.GetLimitCpuMilliCore())
		}
		return []string{
			vm.GetName(),
			state,
			cell(vm.GetComputeNodeName()),
			cpu,
			sizePair(vm.GetRequestMemoryBytes(), vm.GetLimitMemoryBytes()),
			cell(strings.Join(vm.GetBlockStorageNames(), ",")),
			cell(strings.Join(addrs, ",")),
		}
	},
	wide: []string{"MACS", "UUID", "LOGIN", "LABELS"},
	wideRow: func(m proto.Message) []string {
		vm := m.(*provisioningv1.VirtualMachine)
		var macs []string
		for _, nic := range vm.GetNics() {
			if a := nic.GetHardwareAddress(); a != "" {
				macs = append(macs, a)
			}
		}
		return []string{cell(strings.Join(macs, ",")), cell(vm.GetUuid()), cell(vm.GetLoginUsername()), labelsCell(vm.GetLabels())}
	},
	page: func(ctx context.Context, cc grpc.ClientConnInterface, q pageQuery) ([]proto.Message, string, error) {
		resp, err := provisioningv1.NewVirtualMachineServiceClient(cc).ListVirtualMachines(ctx, &provisioningv1.ListVirtualMachinesRequest{PageSize: q.size, PageToken: q.token})
		return messages(resp.GetVirtualMachines()), resp.GetNextPageToken(), err
	},
	get: func(ctx context.Context, cc grpc.ClientConnInterface, name string) (proto.Message, error) {
		return provisioningv1.NewVirtualMachineServiceClient(cc).GetVirtualMachine(ctx, &provisioningv1.GetVirtualMachineRequest{Name: name})
	},
	del: func(ctx context.Context, cc grpc.ClientConnInterface, name string) error {
		_, err := provisioningv1.NewVirtualMachineServiceClient(cc).DeleteVirtualMachine(ctx, &provisioningv1.DeleteVirtualMachineRequest{Name: name})
		return err
	},
}

var blockStorageKind = &kind{
	name:    "block_storage",
	columns: []string{"NAME", "STATE", "NODE", "SIZE", "USED-BY"},
	row: func(m proto.Message) []string {
		bs := m.(*provisioningv1.BlockStorage)
		return []string{
			bs.GetName(),
			stateName(bs.GetState().String(), ""),
			cell(bs.GetNodeName()),
			sizePair(bs.GetRequestBytes(), bs.GetLimitBytes()),
			bsUsedBy(bs),
		}
	},
	wide: []string{"STORAGE", "REQUESTED-NODE", "LABELS"},
	wideRow: func(m proto.Message) []string {
		bs := m.(*provisioningv1.BlockStorage)
		return []string{cell(bs.GetStorageName()), cell(bs.GetAnnotations()[annBSRequestNode]), labelsCell(bs.GetLabels())}
	},
	page: func(ctx context.Context, cc grpc.ClientConnInterface, q pageQuery) ([]proto.Message, string, error) {
		resp, err := provisioningv1.NewBlockStorageServiceClient(cc).ListBlockStorages(ctx, &provisioningv1.ListBlockStoragesRequest{PageSize: q.size, PageToken: q.token})
		return messages(resp.GetBlockStorages()), resp.GetNextPageToken(), err
	},
	get: func(ctx context.Context, cc grpc.ClientConnInterface, name string) (proto.Message, error) {
		return provisioningv1.NewBlockStorageServiceClient(cc).GetBlockStorage(ctx, &provisioningv1.GetBlockStorageRequest{Name: name})
	},
	del: func(ctx context.Context, cc grpc.ClientConnInterface, name string) error {
		_, err := provisioningv1.NewBlockStorageServiceClient(cc).DeleteBlockStorage(ctx, &provisioningv1.DeleteBlockStorageRequest{Name: name})
		return err
	},
}

var imageKind = &kind{
	name:    "image",
	columns: []string{"NAME", "TAGS", "REGISTERED"},
	row: func(m proto.Message) []string {
		img := m.(*deploymentv1.Image)
		var bss, tags []string
		for _, r := range img.GetRegisteredBlockStorages() {
			bss = append(bss, r.GetBlockStorageName())
		}
		for t, bs := range img.GetTags() {
			tags = append(tags, t+"="+bs)
		}
		return []string{img.GetName(), joinSorted(tags), joinSorted(bss)}
	},
	page: func(ctx context.Context, cc grpc.ClientConnInterface, q pageQuery) ([]proto.Message, string, error) {
		resp, err := deploymentv1.NewImageServiceClient(cc).ListImages(ctx, &deploymentv1.ListImagesRequest{PageSize: q.size, PageToken: q.token})
		return messages(resp.GetImages()), resp.GetNextPageToken(), err
	},
	get: func(ctx context.Context, cc grpc.ClientConnInterface, name string) (proto.Message, error) {
		return deploymentv1.NewImageServiceClient(cc).GetImage(ctx, &deploymentv1.GetImageRequest{Name: name})
	},
	del: func(ctx context.Context, cc grpc.ClientConnInterface, name string) error {
		_, err := deploymentv1.NewImageServiceClient(cc).DeleteImage(ctx, &deploymentv1.DeleteImageRequest{Name: name})
		return err
	},
}

var machineKind = &kind{
	name:    "machine",
	columns: []string{"NAME", "SERIAL", "VENDOR/PRODUCT", "CPUS", "MEMORY", "DISKS", "STATE", "POWER", "LAST-SEEN"},
	row: func(m proto.Message) []string {
		mc := m.(*inventoryv1.Machine)
		f := mc.GetFacts()
		vp := strings.TrimSpace(f.GetSystem().GetVendor() + " " + f.GetSystem().GetProduct())
		cpus, mem, disks := "-", "-", "-"
		if f != nil {
			cpus = strconv.Itoa(int(f.GetCpu().GetThreads()))
			mem = humanBytes(f.GetMemory().GetTotalBytes())
			var total uint64
			for _, d := range f.GetDisks() {
				total += d.GetSizeBytes()
			}
			disks = fmt.Sprintf("%d (%s)", len(f.GetDisks()), humanBytes(total))
		}
		state := machineStateCell(mc)
		if len(mc.GetFlags()) > 0 {
			state += "!" // flagged: describe shows why
		}
		return []string{
			mc.GetName(),
			cell(mc.GetSerial()),
			cell(vp),
			cpus, mem, disks,
			state,
			powerCell(mc.GetPowerState(), mc.GetPowerReadAt(), time.Now()),
			lastSeen(mc.GetAnnotations()["corral/last_seen"], time.Now()),
		}
	},
	wide: []string{"MACS", "BMC", "CPU-MODEL", "INTENT", "NODE", "REASON", "ZONE", "POOL", "OWNER", "LABELS"},
	wideRow: func(m proto.Message) []string {
		mc := m.(*inventoryv1.Machine)
		macs := append([]string(nil), mc.GetMacs()...)
		if b := mc.GetBootMac(); b != "" && !slices.Contains(macs, b) {
			macs = append(macs, b)
		}
		// The boot MAC first, the others sorted.
		sort.Slice(macs, func(i, j int) bool {
			if (macs[i] == mc.GetBootMac()) != (macs[j] == mc.GetBootMac()) {
				return macs[i] == mc.GetBootMac()
			}
			return macs[i] < macs[j]
		})
		bmc := "-"
		if b := mc.GetBmc(); b.GetAddress() != "" {
			bmc = b.GetAddress()
			if p := b.GetProvider(); p != "" {
				bmc += "(" + p + ")"
			}
		} else if a := b.GetInbandAddress(); a != "" {
			bmc = a + "(in-band, not enrolled)"
		}
		model := "-"
		if c := mc.GetFacts().GetCpu(); c.GetModel() != "" {
			model = c.GetModel()
			if c.GetSockets() > 1 {
				model = fmt.Sprintf("%dx %s", c.GetSockets(), model)
			}
		}
		return []string{
			cell(strings.Join(macs, ",")),
			bmc,
			model,
			stateName(mc.GetBootIntent().String(), "BOOT_INTENT_"),
			cell(mc.GetNodeName()),
			cell(mc.GetStateReason()),
			cell(mc.GetZone()),
			cell(mc.GetPool()),
			cell(ownerCell(mc.GetAllocation())),
			cell(labelsCell(mc.GetLabels())),
		}
	},
	page: func(ctx context.Context, cc grpc.ClientConnInterface, q pageQuery) ([]proto.Message, string, error) {
		req := &inventoryv1.ListMachinesRequest{View: inventoryv1.MachineView_MACHINE_VIEW_SUMMARY}
		if q.machines != nil {
			req = proto.CloneOf(q.machines)
		}
		req.PageSize, req.PageToken = q.size, q.token
		resp, err := inventoryv1.NewMachineServiceClient(cc).ListMachines(ctx, req)
		return messages(resp.GetMachines()), resp.GetNextPageToken(), err
	},
	get: func(ctx context.Context, cc grpc.ClientConnInterface, name string) (proto.Message, error) {
		return inventoryv1.NewMachineServiceClient(cc).GetMachine(ctx, &inventoryv1.GetMachineRequest{Name: name})
	},
	del: func(ctx context.Context, cc grpc.ClientConnInterface, name string) error {
		_, err := inventoryv1.NewMachineServiceClient(cc).DeleteMachine(ctx, &inventoryv1.DeleteMachineRequest{Name: name})
		return err
	},
}

// ownerCell is the owner of a held allocation ("" for none or an ended one).
func ownerCell(a *inventoryv1.Allocation) string {
	if a.GetOwner() == "" || a.GetReleasedAt() != nil {
		return ""
	}
	return a.GetOwner()
}

// labelsCell renders labels as sorted k=v pairs.
func labelsCell(l map[string]string) string {
	var kv []string
	for k, v := range l {
		kv = append(kv, k+"="+v)
	}
	return joinSorted(kv)
}

// lastSeen renders the agent's last report as an age ("-" when never).
func lastSeen(rfc3339 string, now time.Time) string {
	t, err := time.Parse(time.RFC3339, rfc3339)
	if err != nil {
		return "-"
	}
	return shortAge(now.Sub(t)) + " ago"
}
