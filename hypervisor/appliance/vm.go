package appliance

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"strconv"

	"google.golang.org/protobuf/proto"

	hypervisorv1 "github.com/corralhq/corral/api/hypervisor/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/inventory/pool"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
)

const vmKind = "virtual machine"

// maxVMName leaves room for the "-<index>" interface suffix within the
// pool's 128-character names.
const maxVMName = 120

type vmState = provisioningv1.VirtualMachine_VirtualMachineState

const (
	vmUnspecified = provisioningv1.VirtualMachine_UNSPECIFIED
	vmPending     = provisioningv1.VirtualMachine_PENDING
	vmRunning     = provisioningv1.VirtualMachine_RUNNING
	vmShutdown    = provisioningv1.VirtualMachine_SHUTDOWN
	vmPaused      = provisioningv1.VirtualMachine_PAUSED
)

func newVM() *provisioningv1.VirtualMachine { return &provisioningv1.VirtualMachine{} }

// GetVirtualMachine returns one VM record.
func (s *Services) GetVirtualMachine(ctx context.Context, name string) (*provisioningv1.VirtualMachine, error) {
	if err := checkName("name", name); err != nil {
		return nil, err
	}
	vm := newVM()
	if _, err := record.Get(ctx, s.cfg.Store, vmPrefix+name, vm); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, apierr.NotFoundf("virtual machine %q", name)
		}
		return nil, err
	}
	return vm, nil
}

// ListVirtualMachines returns every VM record in name order.
func (s *Services) ListVirtualMachines(ctx context.Context) ([]*provisioningv1.VirtualMachine, error) {
	return record.List(ctx, s.cfg.Store, vmPrefix, newVM)
}

// CreateVirtualMachine validates the spec, persists it PENDING, then
// attaches the disks (AVAILABLE → IN_USE), books compute (on the
// request_node_name annotation's node; else on the disks' node; else
// wherever the pool schedules it), reserves one interface per NIC, and
// boots the VM on the node. Any failure unwinds every step done so far and
// removes the record. It blocks for at most OpTimeout.
func (s *Services) CreateVirtualMachine(ctx context.Context, req *provisioningv1.CreateVirtualMachineRequest) (*provisioningv1.VirtualMachine, error) {
	id, err := validateVM(req)
	if err != nil {
		return nil, err
	}
	name := req.GetName()
	ctx, cancel := s.opContext(ctx)
	defer cancel()

	ann := make(map[string]string, len(req.GetAnnotations()))
	maps.Copy(ann, req.GetAnnotations())
	s.setPending(ann, opCreate, "")
	cl := claimOf(ann)
	key := vmPrefix + name
	vm := &provisioningv1.VirtualMachine{
		Name: name, Annotations: ann, Labels: maps.Clone(req.GetLabels()),
		RequestCpuMilliCore: req.GetRequestCpuMilliCore(), LimitCpuMilliCore: req.GetLimitCpuMilliCore(),
		RequestMemoryBytes: req.GetRequestMemoryBytes(), LimitMemoryBytes: req.GetLimitMemoryBytes(),
		BlockStorageNames: req.GetBlockStorageNames(), Uuid: id,
		LoginUsername: req.GetLoginUsername(), SshAuthorizedKeys: req.GetSshAuthorizedKeys(),
		State: vmPending, ComputeName: name,
	}
	for _, n := range req.GetNics() {
		vm.Nics = append(vm.Nics, proto.CloneOf(n))
	}
	if _, err := record.Put(ctx, s.cfg.Store, key, vm, 0); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return nil, apierr.Existsf("virtual machine %q already exists", name)
		}
		return nil, err
	}
	tx := s.begin(vmKind, name)
	fail := func(err error) (*provisioningv1.VirtualMachine, error) {
		return nil, abandonNew(ctx, s, vmKind, key, name, newVM, cl, tx, err)
	}

	// Disks.
	diskNode, diskNodeOf := "", ""
	for _, d := range vm.GetBlockStorageNames() {
		bs, err := s.attachDisk(ctx, d, name)
		if err != nil {
			return fail(err)
		}
		tx.push("detach "+d, func(ctx context.Context) error { return s.detachDisk(ctx, d, name) })
		switch {
		case diskNode == "":
			diskNode, diskNodeOf = bs.GetNodeName(), d
		case diskNode != bs.GetNodeName():
			return fail(apierr.Preconditionf("virtual machine %q: block storage %q is on node %q but %q is on node %q: all disks must be on one node",
				name, diskNodeOf, diskNode, d, bs.GetNodeName()))
		}
	}

	// Compute.
	node := req.GetAnnotations()[AnnotationVMRequestNode]
	if node != "" && diskNode != "" && node != diskNode {
		return fail(apierr.Preconditionf("virtual machine %q: %s is %q but its disks are on node %q: disks must be on the VM's node",
			name, AnnotationVMRequestNode, node, diskNode))
	}
	if node == "" {
		node = diskNode
	}
	compute := &poolv1.Compute{
		Annotations:         map[string]string{AnnotationVMReservedBy: name},
		RequestCpuMilliCore: vm.GetRequestCpuMilliCore(), LimitCpuMilliCore: vm.GetLimitCpuMilliCore(),
		RequestMemoryBytes: vm.GetRequestMemoryBytes(), LimitMemoryBytes: vm.GetLimitMemoryBytes(),
	}
	if node != "" {
		_, err = s.cfg.Pool.ReserveCompute(ctx, node, name, compute)
	} else {
		var n *poolv1.Node
		n, err = s.cfg.Pool.ScheduleCompute(ctx, name, compute)
		node = n.GetName()
	}
	if err != nil {
		return fail(err)
	}
	tx.push("release compute on "+node, func(ctx context.Context) error {
		return ignoreNotFound(s.cfg.Pool.ReleaseCompute(ctx, node, name))
	})
	// Journal the node before touching it, so that a rollback finished by
	// the reconciler knows where QEMU may run.
	if _, err := updateClaimed(ctx, s, vmKind, key, name, newVM, cl, func(m *provisioningv1.VirtualMachine) (bool, error) {
		m.ComputeNodeName = node
		return false, nil
	}); err != nil {
		return fail(err)
	}

	// Interfaces.
	var ifaces []string
	for i, nic := range vm.Nics {
		iface := ifaceName(name, i)
		nann := make(map[string]string, len(nic.GetAnnotations()))
		maps.Copy(nann, nic.GetAnnotations())
		nann[AnnotationVMReservedBy] = name
		netw, err := s.cfg.Pool.ReserveNetworkInterface(ctx, &poolv1.ReserveNetworkInterfaceRequest{
			NetworkName: nic.GetNetworkName(), NetworkInterfaceName: iface, Annotations: nann,
			HardwareAddress: nic.GetHardwareAddress(), Ipv4Address: nic.GetIpv4Address(), Ipv6Address: nic.GetIpv6Address(),
		})
		if err != nil {
			return fail(fmt.Errorf("nics[%d]: %w", i, err))
		}
		netName := nic.GetNetworkName()
		tx.push("release interface "+iface, func(ctx context.Context) error {
			return ignoreNotFound(s.cfg.Pool.ReleaseNetworkInterface(ctx, netName, iface))
		})
		got := netw.GetReservedNetworkInterfaces()[iface]
		nic.HardwareAddress, nic.Ipv4Address, nic.Ipv6Address = got.GetHardwareAddress(), got.GetIpv4Address(), got.GetIpv6Address()
		ifaces = append(ifaces, iface)
	}
	vm.NetworkInterfaceNames = ifaces
	vm.ComputeNodeName = node

	// Boot.
	booted, err := s.bootOnNode(ctx, vm, tx)
	if err != nil {
		return fail(err)
	}

	out, err := updateClaimed(ctx, s, vmKind, key, name, newVM, cl, func(m *provisioningv1.VirtualMachine) (bool, error) {
		clearPending(m.Annotations)
		m.Nics = vm.Nics
		m.NetworkInterfaceNames = ifaces
		m.ComputeNodeName = node
		m.ComputeName = name
		m.State = vmStateFromNode(booted.GetState())
		return false, nil
	})
	if err != nil {
		return fail(err)
	}
	s.log.Info("virtual machine created", "vm", name, "node", node, "state", out.GetState().String())
	return out, nil
}

// bootOnNode makes the VM's networks exist on its node and boots it. When
// tx is not nil the inverse (node DeleteVM) is pushed.
func (s *Services) bootOnNode(ctx context.Context, vm *provisioningv1.VirtualMachine, tx *txn) (*hypervisorv1.VM, error) {
	node := vm.GetComputeNodeName()
	spec, nets, err := s.nodeSpec(ctx, vm)
	if err != nil {
		return nil, err
	}
	c, err := s.nodeClient(ctx, node)
	if err != nil {
		return nil, err
	}
	for _, n := range nets {
		cctx, cancel := s.callContext(ctx)
		_, err := c.ApplyNetwork(cctx, n)
		cancel()
		if err != nil {
			return nil, nodeErr(node, "apply network "+n.GetName(), err)
		}
	}
	cctx, cancel := s.callContext(ctx)
	defer cancel()
	got, err := c.BootVM(cctx, &hypervisorv1.BootVMRequest{Vm: spec})
	if tx != nil {
		// Pushed even on error: the node may have started QEMU before
		// failing (or before the answer was lost).
		tx.push("delete vm on "+node, func(ctx context.Context) error { return s.deleteVMOnNode(ctx, node, vm.GetName()) })
	}
	if err != nil {
		return nil, nodeErr(node, "boot vm", err)
	}
	return got, nil
}

// deleteVMOnNode removes the VM on its node (NotFound is success).
func (s *Services) deleteVMOnNode(ctx context.Context, node, name string) error {
	c, err := s.dial(ctx, node)
	if err != nil {
		return err
	}
	cctx, cancel := s.callContext(ctx)
	defer cancel()
	_, err = c.DeleteVM(cctx, &hypervisorv1.VMRequest{Name: name, Hard: true})
	return ignoreNotFound(nodeErr(node, "delete vm "+name, err))
}

// nodeSpec builds the node's VM (disks, NICs with gateway and DNS from the
// Networks) and the networks to apply on the node.
func (s *Services) nodeSpec(ctx context.Context, vm *provisioningv1.VirtualMachine) (*hypervisorv1.VM, []*hypervisorv1.ApplyNetworkRequest, error) {
	spec := &hypervisorv1.VM{
		Name: vm.GetName(), Uuid: vm.GetUuid(),
		Vcpus: vm.GetLimitCpuMilliCore() / 1000, MemoryBytes: vm.GetLimitMemoryBytes(),
		LoginUsername: vm.GetLoginUsername(), SshAuthorizedKeys: vm.GetSshAuthorizedKeys(),
	}
	for i, d := range vm.GetBlockStorageNames() {
		bs, err := s.GetBlockStorage(ctx, d)
		if err != nil {
			return nil, nil, err
		}
		spec.Disks = append(spec.Disks, &hypervisorv1.Disk{Volume: bs.GetStorageName(), BootIndex: uint32(i)})
	}
	gw := 0
	for i, n := range vm.GetNics() {
		if _, ok := n.GetAnnotations()[AnnotationIsGateway]; ok {
			gw = i
		}
	}
	var nets []*hypervisorv1.ApplyNetworkRequest
	seen := map[string]bool{}
	for i, n := range vm.GetNics() {
		netw, err := s.cfg.Pool.GetNetwork(ctx, n.GetNetworkName())
		if err != nil {
			return nil, nil, fmt.Errorf("nics[%d]: %w", i, err)
		}
		hn := &hypervisorv1.Nic{
			NetworkName: n.GetNetworkName(), HardwareAddress: n.GetHardwareAddress(),
			Nameservers: netw.GetDnsServers(), Domain: netw.GetDomain(),
		}
		if p, err := netip.ParsePrefix(netw.GetIpv4Cidr()); err == nil && n.GetIpv4Address() != "" {
			hn.Ipv4AddressCidr = n.GetIpv4Address() + "/" + strconv.Itoa(p.Bits())
		}
		if p, err := netip.ParsePrefix(netw.GetIpv6Cidr()); err == nil && n.GetIpv6Address() != "" {
			hn.Ipv6AddressCidr = n.GetIpv6Address() + "/" + strconv.Itoa(p.Bits())
		}
		if i == gw {
			hn.Ipv4Gateway, hn.Ipv6Gateway = netw.GetIpv4Gateway(), netw.GetIpv6Gateway()
		}
		spec.Nics = append(spec.Nics, hn)
		if !seen[netw.GetName()] {
			seen[netw.GetName()] = true
			nets = append(nets, applyNetworkOf(netw))
		}
	}
	return spec, nets, nil
}

// applyNetworkOf is what a node needs to wire a Network: its VLAN (field,
// else n0stack's annotation) and gateway as address/prefix.
func applyNetworkOf(n *poolv1.Network) *hypervisorv1.ApplyNetworkRequest {
	r := &hypervisorv1.ApplyNetworkRequest{Name: n.GetName(), VlanId: n.GetVlanId()}
	if r.VlanId == 0 {
		if v, err := strconv.ParseUint(n.GetAnnotations()[pool.AnnotationVLANID], 10, 12); err == nil {
			r.VlanId = uint32(v)
		}
	}
	if p, err := netip.ParsePrefix(n.GetIpv4Cidr()); err == nil && n.GetIpv4Gateway() != "" {
		r.GatewayCidr = n.GetIpv4Gateway() + "/" + strconv.Itoa(p.Bits())
	}
	return r
}

func vmStateFromNode(st hypervisorv1.VMState) vmState {
	switch st {
	case hypervisorv1.VMState_VM_STATE_RUNNING:
		return vmRunning
	case hypervisorv1.VMState_VM_STATE_SHUTDOWN:
		return vmShutdown
	case hypervisorv1.VMState_VM_STATE_PAUSED:
		return vmPaused
	default: // FAILED has no VirtualMachine state of its own: reconcile notes the node's word beside UNSPECIFIED
		return vmUnspecified
	}
}

// pendVM moves an existing VM to PENDING for op; check may refuse.
func (s *Services) pendVM(ctx context.Context, name, op string, check func(*provisioningv1.VirtualMachine) error) (*provisioningv1.VirtualMachine, claim, error) {
	if err := checkName("name", name); err != nil {
		return nil, claim{}, err
	}
	var cl claim
	var before *provisioningv1.VirtualMachine
	_, err := record.Update(ctx, s.cfg.Store, vmPrefix+name, newVM, func(vm *provisioningv1.VirtualMachine, exists bool) (bool, error) {
		if !exists {
			return false, apierr.NotFoundf("virtual machine %q", name)
		}
		if vm.GetState() == vmPending {
			return false, s.pendingErr(vmKind, name, vm.GetAnnotations())
		}
		if check != nil {
			if err := check(vm); err != nil {
				return false, err
			}
		}
		before = proto.CloneOf(vm)
		if vm.Annotations == nil {
			vm.Annotations = map[string]string{}
		}
		s.setPending(vm.Annotations, op, vm.GetState().String())
		cl = claimOf(vm.Annotations)
		vm.State = vmPending
		return false, nil
	})
	return before, cl, err
}

// unpendVM restores the saved state after a failed operation.
func (s *Services) unpendVM(ctx context.Context, name string, cl claim) {
	_, err := updateClaimed(ctx, s, vmKind, vmPrefix+name, name, newVM, cl, func(vm *provisioningv1.VirtualMachine) (bool, error) {
		restoreVMState(vm)
		return false, nil
	})
	if err != nil {
		s.log.Warn("could not restore virtual machine after a failed operation; the reconciler will", "vm", name, "err", err.Error())
	}
}

func restoreVMState(vm *provisioningv1.VirtualMachine) {
	prev := pendingOf(vm.GetAnnotations()).prev
	vm.State = vmState(provisioningv1.VirtualMachine_VirtualMachineState_value[prev])
	if vm.State == vmPending {
		vm.State = vmUnspecified
	}
	clearPending(vm.Annotations)
}

// vmNodeOp runs one node call on an existing VM under PENDING and stores
// the state the node reports.
func (s *Services) vmNodeOp(ctx context.Context, name, op string,
	call func(ctx context.Context, c hypervisorv1.HypervisorServiceClient, vm *provisioningv1.VirtualMachine) (*hypervisorv1.VM, error)) (*provisioningv1.VirtualMachine, error) {
	ctx, cancel := s.opContext(ctx)
	defer cancel()
	vm, cl, err := s.pendVM(ctx, name, op, nil)
	if err != nil {
		return nil, err
	}
	failed := func(err error) (*provisioningv1.VirtualMachine, error) {
		cctx, cancel := s.cleanupContext(ctx)
		defer cancel()
		s.unpendVM(cctx, name, cl)
		return nil, err
	}
	c, err := s.nodeClient(ctx, vm.GetComputeNodeName())
	if err != nil {
		return failed(err)
	}
	got, err := call(ctx, c, vm)
	if err != nil {
		return failed(err)
	}
	out, err := updateClaimed(ctx, s, vmKind, vmPrefix+name, name, newVM, cl, func(m *provisioningv1.VirtualMachine) (bool, error) {
		clearPending(m.Annotations)
		delete(m.Annotations, AnnotationStateReason)
		m.State = vmStateFromNode(got.GetState())
		return false, nil
	})
	if err != nil {
		return failed(err)
	}
	s.log.Info("virtual machine "+op, "vm", name, "node", vm.GetComputeNodeName(), "state", out.GetState().String())
	return out, nil
}

// BootVirtualMachine (re)starts the VM on its node with its full spec.
func (s *Services) BootVirtualMachine(ctx context.Context, name string) (*provisioningv1.VirtualMachine, error) {
	return s.vmNodeOp(ctx, name, opBoot, func(ctx context.Context, _ hypervisorv1.HypervisorServiceClient, vm *provisioningv1.VirtualMachine) (*hypervisorv1.VM, error) {
		return s.bootOnNode(ctx, vm, nil)
	})
}

// RebootVirtualMachine reboots the VM (hard: reset; else ACPI).
func (s *Services) RebootVirtualMachine(ctx context.Context, name string, hard bool) (*provisioningv1.VirtualMachine, error) {
	return s.vmNodeOp(ctx, name, opReboot, func(ctx context.Context, c hypervisorv1.HypervisorServiceClient, vm *provisioningv1.VirtualMachine) (*hypervisorv1.VM, error) {
		cctx, cancel := s.callContext(ctx)
		defer cancel()
		got, err := c.RebootVM(cctx, &hypervisorv1.VMRequest{Name: name, Hard: hard})
		return got, nodeErr(vm.GetComputeNodeName(), "reboot vm", err)
	})
}

// ShutdownVirtualMachine stops the VM (hard: power off; else ACPI, then
// hard after the node's deadline).
func (s *Services) ShutdownVirtualMachine(ctx context.Context, name string, hard bool) (*provisioningv1.VirtualMachine, error) {
	return s.vmNodeOp(ctx, name, opShutdown, func(ctx context.Context, c hypervisorv1.HypervisorServiceClient, vm *provisioningv1.VirtualMachine) (*hypervisorv1.VM, error) {
		cctx, cancel := s.callContext(ctx)
		defer cancel()
		got, err := c.ShutdownVM(cctx, &hypervisorv1.VMRequest{Name: name, Hard: hard})
		return got, nodeErr(vm.GetComputeNodeName(), "shutdown vm", err)
	})
}

// OpenConsole returns the node's console endpoint for the VM.
func (s *Services) OpenConsole(ctx context.Context, name string) (string, error) {
	vm, err := s.GetVirtualMachine(ctx, name)
	if err != nil {
		return "", err
	}
	if vm.GetState() == vmPending {
		return "", s.pendingErr(vmKind, name, vm.GetAnnotations())
	}
	c, err := s.nodeClient(ctx, vm.GetComputeNodeName())
	if err != nil {
		return "", err
	}
	cctx, cancel := s.callContext(ctx)
	defer cancel()
	got, err := c.GetVM(cctx, &hypervisorv1.VMRequest{Name: name})
	if err != nil {
		return "", nodeErr(vm.GetComputeNodeName(), "get vm", err)
	}
	if got.GetConsole() == "" {
		return "", apierr.Preconditionf("virtual machine %q has no console on node %q", name, vm.GetComputeNodeName())
	}
	return got.GetConsole(), nil
}

// DeleteVirtualMachine removes the VM in reverse order of creation: the
// node deletes the VM (and its taps), then compute and interfaces are
// released, the disks set AVAILABLE and the record removed. If the node
// refuses, nothing changes; once the node has deleted the VM the rest is
// rolled forward (by the reconciler if this call fails).
func (s *Services) DeleteVirtualMachine(ctx context.Context, name string) error {
	ctx, cancel := s.opContext(ctx)
	defer cancel()
	vm, cl, err := s.pendVM(ctx, name, opDelete, nil)
	if err != nil {
		return err
	}
	if node := vm.GetComputeNodeName(); node != "" {
		err := func() error {
			if _, err := s.nodeClient(ctx, node); err != nil {
				return err
			}
			return s.deleteVMOnNode(ctx, node, name)
		}()
		if err != nil {
			cctx, cancel := s.cleanupContext(ctx)
			defer cancel()
			s.unpendVM(cctx, name, cl)
			return err
		}
		s.deleteNodeNetworks(ctx, node, vm)
	}
	cctx, ccancel := s.cleanupContext(ctx)
	defer ccancel()
	if err := s.finishDeleteVM(cctx, vm, cl); err != nil {
		s.log.Log(cctx, LevelCritical, "virtual machine delete incomplete; the reconciler will finish it", "vm", name, "err", err.Error())
		markRollbackFailed(cctx, s, vmKind, vmPrefix+name, name, newVM, cl, err)
		return err
	}
	return nil
}

// deleteNodeNetworks asks node to remove the bridges of vm's Networks;
// the node refuses (FailedPrecondition) while other VMs' taps use one.
// Best effort: a bridge left behind is harmless and the next delete of a
// VM on that Network tries again.
func (s *Services) deleteNodeNetworks(ctx context.Context, node string, vm *provisioningv1.VirtualMachine) {
	seen := map[string]bool{}
	for _, nic := range vm.GetNics() {
		network := nic.GetNetworkName()
		if network == "" || seen[network] {
			continue
		}
		seen[network] = true
		c, err := s.dial(ctx, node)
		if err != nil {
			return
		}
		cctx, cancel := s.callContext(ctx)
		_, err = c.DeleteNetwork(cctx, &hypervisorv1.DeleteNetworkRequest{Name: network})
		cancel()
		if err = ignoreNotFound(nodeErr(node, "delete network "+network, err)); err != nil && !errors.Is(err, apierr.ErrPrecondition) {
			s.log.Warn("network bridge left on node", "vm", vm.GetName(), "node", node, "network", network, "err", err.Error())
		}
	}
}

// finishDeleteVM is everything after the node deleted the VM; every step
// is idempotent and driven by the record and the pool's reserved_by marks.
func (s *Services) finishDeleteVM(ctx context.Context, vm *provisioningv1.VirtualMachine, cl claim) error {
	name := vm.GetName()
	if err := s.releaseVMResources(ctx, vm); err != nil {
		return err
	}
	if _, err := updateClaimed(ctx, s, vmKind, vmPrefix+name, name, newVM, cl, func(*provisioningv1.VirtualMachine) (bool, error) { return true, nil }); err != nil {
		return err
	}
	s.log.Info("virtual machine deleted", "vm", name, "node", vm.GetComputeNodeName())
	return nil
}

// releaseVMResources releases the VM's compute (wherever the pool has it
// reserved by this VM), its interfaces and its disks. Idempotent.
func (s *Services) releaseVMResources(ctx context.Context, vm *provisioningv1.VirtualMachine) error {
	name := vm.GetName()
	var errs []error
	nodes, err := s.computeNodesOf(ctx, name)
	if err != nil {
		return err
	}
	for _, node := range nodes {
		errs = append(errs, ignoreNotFound(s.cfg.Pool.ReleaseCompute(ctx, node, name)))
	}
	for i, n := range vm.GetNics() {
		errs = append(errs, s.releaseIfaceOwned(ctx, n.GetNetworkName(), ifaceName(name, i), name))
	}
	for _, d := range vm.GetBlockStorageNames() {
		errs = append(errs, s.detachDisk(ctx, d, name))
	}
	return errors.Join(errs...)
}

// computeNodesOf finds the nodes holding a compute reservation made by vm.
func (s *Services) computeNodesOf(ctx context.Context, vm string) ([]string, error) {
	nodes, err := s.cfg.Pool.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range nodes {
		if c, ok := n.GetReservedComputes()[vm]; ok && c.GetAnnotations()[AnnotationVMReservedBy] == vm {
			out = append(out, n.GetName())
		}
	}
	return out, nil
}

// releaseIfaceOwned releases an interface if vm reserved it.
func (s *Services) releaseIfaceOwned(ctx context.Context, network, iface, vm string) error {
	n, err := s.cfg.Pool.GetNetwork(ctx, network)
	if err != nil {
		return ignoreNotFound(err)
	}
	ni, ok := n.GetReservedNetworkInterfaces()[iface]
	if !ok || ni.GetAnnotations()[AnnotationVMReservedBy] != vm {
		return nil
	}
	return ignoreNotFound(s.cfg.Pool.ReleaseNetworkInterface(ctx, network, iface))
}

// UpdateVirtualMachine replaces labels and user annotations in any state
// but PENDING. Compute changes (non-zero fields that differ) need the VM
// SHUTDOWN: compute is re-reserved on the same node and the stopped QEMU is
// removed on the node, so the next Boot starts it with the new size.
// Changing block_storage_names is not supported yet.
func (s *Services) UpdateVirtualMachine(ctx context.Context, req *provisioningv1.UpdateVirtualMachineRequest) (*provisioningv1.VirtualMachine, error) {
	name := req.GetName()
	if err := checkName("name", name); err != nil {
		return nil, err
	}
	userAnn := userOnly(req.GetAnnotations())
	if err := checkUserMeta(userAnn, req.GetLabels()); err != nil {
		return nil, err
	}
	cur, err := s.GetVirtualMachine(ctx, name)
	if err != nil {
		return nil, err
	}
	if d := req.GetBlockStorageNames(); len(d) > 0 && !equalStrings(d, cur.GetBlockStorageNames()) {
		return nil, apierr.Preconditionf("virtual machine %q: changing block_storage_names is not supported yet", name)
	}
	pick32 := func(v, c uint32) uint32 {
		if v == 0 {
			return c
		}
		return v
	}
	pick64 := func(v, c uint64) uint64 {
		if v == 0 {
			return c
		}
		return v
	}
	reqCPU, limCPU := pick32(req.GetRequestCpuMilliCore(), cur.GetRequestCpuMilliCore()), pick32(req.GetLimitCpuMilliCore(), cur.GetLimitCpuMilliCore())
	reqMem, limMem := pick64(req.GetRequestMemoryBytes(), cur.GetRequestMemoryBytes()), pick64(req.GetLimitMemoryBytes(), cur.GetLimitMemoryBytes())
	key := vmPrefix + name
	resize := reqCPU != cur.GetRequestCpuMilliCore() || limCPU != cur.GetLimitCpuMilliCore() || reqMem != cur.GetRequestMemoryBytes() || limMem != cur.GetLimitMemoryBytes()
	if !resize {
		return record.Update(ctx, s.cfg.Store, key, newVM, func(vm *provisioningv1.VirtualMachine, exists bool) (bool, error) {
			if !exists {
				return false, apierr.NotFoundf("virtual machine %q", name)
			}
			if vm.GetState() == vmPending {
				return false, s.pendingErr(vmKind, name, vm.GetAnnotations())
			}
			vm.Annotations = mergeUserAnnotations(vm.GetAnnotations(), userAnn)
			vm.Labels = maps.Clone(req.GetLabels())
			return false, nil
		})
	}
	if err := checkResources(name, reqCPU, limCPU, reqMem, limMem); err != nil {
		return nil, err
	}
	ctx, cancel := s.opContext(ctx)
	defer cancel()
	old, cl, err := s.pendVM(ctx, name, opUpdate, func(vm *provisioningv1.VirtualMachine) error {
		if vm.GetState() != vmShutdown {
			return apierr.Preconditionf("virtual machine %q is %s: shut it down before changing its compute", name, vm.GetState())
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	node := old.GetComputeNodeName()
	tx := s.begin(vmKind, name)
	fail := func(err error) (*provisioningv1.VirtualMachine, error) {
		cctx, cancel := s.cleanupContext(ctx)
		defer cancel()
		if rb := tx.rollback(cctx, err); rb != nil {
			markRollbackFailed(cctx, s, vmKind, key, name, newVM, cl, rb)
			return nil, errors.Join(err, rb)
		}
		s.unpendVM(cctx, name, cl)
		return nil, err
	}
	oldC := computeOf(old)
	newC := &poolv1.Compute{Annotations: map[string]string{AnnotationVMReservedBy: name},
		RequestCpuMilliCore: reqCPU, LimitCpuMilliCore: limCPU, RequestMemoryBytes: reqMem, LimitMemoryBytes: limMem}
	// The pool has no atomic replace: release, then reserve.
	if err := ignoreNotFound(s.cfg.Pool.ReleaseCompute(ctx, node, name)); err != nil {
		return fail(err)
	}
	tx.push("re-reserve old compute", func(ctx context.Context) error {
		_, err := s.cfg.Pool.ReserveCompute(ctx, node, name, oldC)
		if errors.Is(err, apierr.ErrAlreadyExists) {
			return nil
		}
		return err
	})
	if _, err := s.cfg.Pool.ReserveCompute(ctx, node, name, newC); err != nil {
		return fail(err)
	}
	tx.push("release new compute", func(ctx context.Context) error { return ignoreNotFound(s.cfg.Pool.ReleaseCompute(ctx, node, name)) })
	if _, err := s.nodeClient(ctx, node); err != nil {
		return fail(err)
	}
	if err := s.deleteVMOnNode(ctx, node, name); err != nil {
		return fail(err)
	}
	out, err := updateClaimed(ctx, s, vmKind, key, name, newVM, cl, func(vm *provisioningv1.VirtualMachine) (bool, error) {
		restoreVMState(vm)
		vm.Annotations = mergeUserAnnotations(vm.Annotations, userAnn)
		vm.Labels = maps.Clone(req.GetLabels())
		vm.RequestCpuMilliCore, vm.LimitCpuMilliCore, vm.RequestMemoryBytes, vm.LimitMemoryBytes = reqCPU, limCPU, reqMem, limMem
		return false, nil
	})
	if err != nil {
		return fail(err)
	}
	return out, nil
}

func computeOf(vm *provisioningv1.VirtualMachine) *poolv1.Compute {
	return &poolv1.Compute{Annotations: map[string]string{AnnotationVMReservedBy: vm.GetName()},
		RequestCpuMilliCore: vm.GetRequestCpuMilliCore(), LimitCpuMilliCore: vm.GetLimitCpuMilliCore(),
		RequestMemoryBytes: vm.GetRequestMemoryBytes(), LimitMemoryBytes: vm.GetLimitMemoryBytes()}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
