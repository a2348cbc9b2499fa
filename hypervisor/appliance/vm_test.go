package appliance

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	hypervisorv1 "github.com/corralhq/corral/api/hypervisor/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
)

func TestVirtualMachineLifecycle(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.mkBS(t, "root", "n2")
	e.mkBS(t, "data", "n2")
	req := vmReq("web", "root", "data")
	req.Nics[0].Ipv4Address = "10.0.0.10"
	vm, err := e.vm.CreateVirtualMachine(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	// No request_node_name: compute goes to the disks' node.
	if vm.GetState() != vmRunning || vm.GetComputeNodeName() != "n2" || vm.GetComputeName() != "web" {
		t.Fatalf("vm = %v", vm)
	}
	if d := cmp.Diff([]string{"web-0"}, vm.GetNetworkInterfaceNames()); d != "" {
		t.Fatalf("interface names: %s", d)
	}
	if vm.GetUuid() != uuidV5(uuidNamespace, "web") || len(vm.GetAnnotations()) != 0 {
		t.Fatalf("uuid %q annotations %v", vm.GetUuid(), vm.GetAnnotations())
	}
	mac := vm.GetNics()[0].GetHardwareAddress()
	want := &hypervisorv1.VM{
		Name: "web", Uuid: vm.GetUuid(), Vcpus: 2, MemoryBytes: gib,
		Disks: []*hypervisorv1.Disk{{Volume: "root", BootIndex: 0}, {Volume: "data", BootIndex: 1}},
		Nics: []*hypervisorv1.Nic{{NetworkName: "net1", HardwareAddress: mac, Ipv4AddressCidr: "10.0.0.10/24", Ipv4Gateway: "10.0.0.1",
			Nameservers: []string{"10.0.0.53"}, Domain: "lab.example"}},
		LoginUsername: "corral", SshAuthorizedKeys: []string{"ssh-ed25519 AAAA test"},
		State: hypervisorv1.VMState_VM_STATE_RUNNING, Console: "vnc+unix:///run/corral/vms/web/vnc.sock",
	}
	if d := cmp.Diff(want, e.nodes["n2"].VM("web"), protocmp.Transform()); d != "" {
		t.Fatalf("node VM (-want +got):\n%s", d)
	}
	var applied *hypervisorv1.ApplyNetworkRequest
	for _, c := range e.nodes["n2"].Calls() {
		if r, ok := c.Request.(*hypervisorv1.ApplyNetworkRequest); ok {
			applied = r
		}
	}
	if d := cmp.Diff(&hypervisorv1.ApplyNetworkRequest{Name: "net1", VlanId: 42, GatewayCidr: "10.0.0.1/24"}, applied, protocmp.Transform()); d != "" {
		t.Fatalf("ApplyNetwork (-want +got):\n%s", d)
	}
	for _, d := range []string{"root", "data"} {
		if e.bsState(t, d) != bsInUse {
			t.Fatalf("%s is %v, want IN_USE", d, e.bsState(t, d))
		}
	}
	n2, _ := e.pool.GetNode(ctx, "n2")
	if c := n2.GetReservedComputes()["web"]; c.GetLimitCpuMilliCore() != 2000 || c.GetAnnotations()[AnnotationVMReservedBy] != "web" {
		t.Fatalf("compute = %v", c)
	}
	netw, _ := e.pool.GetNetwork(ctx, "net1")
	if ni := netw.GetReservedNetworkInterfaces()["web-0"]; ni.GetIpv4Address() != "10.0.0.10" || ni.GetHardwareAddress() != mac {
		t.Fatalf("interface = %v", ni)
	}

	// Deleting a disk in use is refused.
	_, err = e.bs.DeleteBlockStorage(ctx, &provisioningv1.DeleteBlockStorageRequest{Name: "root"})
	wantCode(t, err, codes.FailedPrecondition, `used by virtual machine web`)

	// Power operations go to the node.
	got, err := e.vm.ShutdownVirtualMachine(ctx, &provisioningv1.ShutdownVirtualMachineRequest{Name: "web", Hard: true})
	if err != nil || got.GetState() != vmShutdown {
		t.Fatalf("shutdown = %v, %v", got, err)
	}
	// Compute changes need SHUTDOWN; now allowed.
	up, err := e.vm.UpdateVirtualMachine(ctx, &provisioningv1.UpdateVirtualMachineRequest{Name: "web", LimitCpuMilliCore: 4000,
		RequestMemoryBytes: 2 * gib, LimitMemoryBytes: 2 * gib, Labels: map[string]string{"tier": "front"}})
	if err != nil {
		t.Fatal(err)
	}
	if up.GetLimitCpuMilliCore() != 4000 || up.GetState() != vmShutdown || up.GetLabels()["tier"] != "front" {
		t.Fatalf("updated = %v", up)
	}
	n2, _ = e.pool.GetNode(ctx, "n2")
	if c := n2.GetReservedComputes()["web"]; c.GetLimitCpuMilliCore() != 4000 || c.GetRequestMemoryBytes() != 2*gib {
		t.Fatalf("compute after update = %v", c)
	}
	got, err = e.vm.BootVirtualMachine(ctx, &provisioningv1.BootVirtualMachineRequest{Name: "web"})
	if err != nil || got.GetState() != vmRunning {
		t.Fatalf("boot = %v, %v", got, err)
	}
	if v := e.nodes["n2"].VM("web"); v.GetVcpus() != 4 || v.GetMemoryBytes() != 2*gib {
		t.Fatalf("node VM after resize+boot = %v", v)
	}
	_, err = e.vm.UpdateVirtualMachine(ctx, &provisioningv1.UpdateVirtualMachineRequest{Name: "web", LimitCpuMilliCore: 6000})
	wantCode(t, err, codes.FailedPrecondition, "shut it down")
	got, err = e.vm.RebootVirtualMachine(ctx, &provisioningv1.RebootVirtualMachineRequest{Name: "web"})
	if err != nil || got.GetState() != vmRunning {
		t.Fatalf("reboot = %v, %v", got, err)
	}
	con, err := e.vm.OpenConsole(ctx, &provisioningv1.OpenConsoleRequest{Name: "web"})
	if err != nil || con.GetConsoleUrl() != "vnc+unix:///run/corral/vms/web/vnc.sock" {
		t.Fatalf("console = %v, %v", con, err)
	}
	// A node failure on reboot leaves the state as it was.
	e.nodes["n2"].FailOn("RebootVM", status.Error(codes.Internal, "qmp: broken pipe"))
	_, err = e.vm.RebootVirtualMachine(ctx, &provisioningv1.RebootVirtualMachineRequest{Name: "web", Hard: true})
	wantCode(t, err, codes.Internal, "broken pipe")
	e.nodes["n2"].FailOn("RebootVM", nil)
	if v, _ := e.svc.GetVirtualMachine(ctx, "web"); v.GetState() != vmRunning || len(v.GetAnnotations()) != 0 {
		t.Fatalf("after failed reboot: %v", v)
	}

	l, err := e.vm.ListVirtualMachines(ctx, &provisioningv1.ListVirtualMachinesRequest{})
	if err != nil || len(l.GetVirtualMachines()) != 1 {
		t.Fatalf("list = %v, %v", l, err)
	}
	if _, err := e.vm.DeleteVirtualMachine(ctx, &provisioningv1.DeleteVirtualMachineRequest{Name: "web"}); err != nil {
		t.Fatal(err)
	}
	e.assertVMGone(t, "web")
	for _, d := range []string{"root", "data"} {
		if e.bsState(t, d) != bsAvailable {
			t.Fatalf("%s is %v after delete, want AVAILABLE", d, e.bsState(t, d))
		}
	}
}

func TestCreateVirtualMachineBadInput(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.mkBS(t, "d1", "n1")
	e.mkBS(t, "d2", "n2")
	e.mkBS(t, "busy", "n1")
	if _, err := e.vm.CreateVirtualMachine(ctx, vmReq("holder", "busy")); err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		mod      func(r *provisioningv1.CreateVirtualMachineRequest)
		code     codes.Code
		contains string
	}{
		"cpu not multiple of 1000": {func(r *provisioningv1.CreateVirtualMachineRequest) { r.LimitCpuMilliCore = 1500 }, codes.InvalidArgument, "multiple of 1000"},
		"cpu limit zero":           {func(r *provisioningv1.CreateVirtualMachineRequest) { r.LimitCpuMilliCore = 0 }, codes.InvalidArgument, "multiple of 1000"},
		"cpu request > limit":      {func(r *provisioningv1.CreateVirtualMachineRequest) { r.RequestCpuMilliCore = 3000 }, codes.InvalidArgument, "request_cpu_milli_core 3000"},
		"memory request != limit":  {func(r *provisioningv1.CreateVirtualMachineRequest) { r.RequestMemoryBytes = gib / 2 }, codes.InvalidArgument, "must equal limit_memory_bytes"},
		"bad uuid":                 {func(r *provisioningv1.CreateVirtualMachineRequest) { r.Uuid = "not-a-uuid" }, codes.InvalidArgument, "not a UUID"},
		"bad user":                 {func(r *provisioningv1.CreateVirtualMachineRequest) { r.LoginUsername = "Root Admin" }, codes.InvalidArgument, "login_username"},
		"unknown volume":           {func(r *provisioningv1.CreateVirtualMachineRequest) { r.BlockStorageNames = []string{"d1", "ghost"} }, codes.NotFound, `"ghost" does not exist`},
		"volume in use":            {func(r *provisioningv1.CreateVirtualMachineRequest) { r.BlockStorageNames = []string{"d1", "busy"} }, codes.FailedPrecondition, `IN_USE by virtual machine "holder"`},
		"disks on two nodes":       {func(r *provisioningv1.CreateVirtualMachineRequest) { r.BlockStorageNames = []string{"d1", "d2"} }, codes.FailedPrecondition, "all disks must be on one node"},
		"node differs from disks": {func(r *provisioningv1.CreateVirtualMachineRequest) {
			r.Annotations = map[string]string{AnnotationVMRequestNode: "n2"}
		}, codes.FailedPrecondition, "disks must be on the VM's node"},
		"address outside CIDR": {func(r *provisioningv1.CreateVirtualMachineRequest) { r.Nics[0].Ipv4Address = "192.168.1.5" }, codes.InvalidArgument, "192.168.1.5"},
		"address taken": {func(r *provisioningv1.CreateVirtualMachineRequest) {
			r.Nics = append(r.Nics, &provisioningv1.VirtualMachineNIC{NetworkName: "net1", Ipv4Address: "10.0.0.2"})
			r.Nics[0].Ipv4Address = "10.0.0.2"
		}, codes.AlreadyExists, "already reserved"},
		"unknown network": {func(r *provisioningv1.CreateVirtualMachineRequest) { r.Nics[0].NetworkName = "nonet" }, codes.NotFound, "nonet"},
		"too much memory": {func(r *provisioningv1.CreateVirtualMachineRequest) {
			r.RequestMemoryBytes, r.LimitMemoryBytes = 64*gib, 64*gib
		}, codes.ResourceExhausted, "memory request"},
		"unknown node": {func(r *provisioningv1.CreateVirtualMachineRequest) {
			r.Annotations = map[string]string{AnnotationVMRequestNode: "n9"}
			r.BlockStorageNames = nil
		}, codes.NotFound, "n9"},
		"already exists": {func(r *provisioningv1.CreateVirtualMachineRequest) { r.Name = "holder" }, codes.AlreadyExists, "already exists"},
		"system annotation": {func(r *provisioningv1.CreateVirtualMachineRequest) {
			r.Annotations = map[string]string{AnnotationPendingOwner: "me"}
		}, codes.InvalidArgument, "set by the system"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			req := vmReq("bad", "d1")
			tc.mod(req)
			_, err := e.vm.CreateVirtualMachine(ctx, req)
			wantCode(t, err, tc.code, tc.contains)
			if req.GetName() == "bad" {
				e.assertVMGone(t, "bad")
			}
			if e.bsState(t, "d1") != bsAvailable {
				t.Fatalf("d1 left %v", e.bsState(t, "d1"))
			}
			if e.bsState(t, "busy") != bsInUse {
				t.Fatalf("busy changed to %v", e.bsState(t, "busy"))
			}
		})
	}
}

// A node that fails or disappears mid-create leaves nothing behind.
func TestCreateVirtualMachineNodeFailure(t *testing.T) {
	cases := map[string]struct {
		break_   func(t *testing.T, e *env)
		code     codes.Code
		contains string
	}{
		"boot fails": {func(_ *testing.T, e *env) {
			e.nodes["n1"].FailOn("BootVM", status.Error(codes.Internal, "qemu: could not open disk"))
		}, codes.Internal, "could not open disk"},
		"node vanishes": {func(_ *testing.T, e *env) { e.nodes["n1"].SetDown(true) }, codes.Unavailable, `node "n1"`},
		"network apply fails": {func(_ *testing.T, e *env) {
			e.nodes["n1"].FailOn("ApplyNetwork", status.Error(codes.FailedPrecondition, "no 802.1Q"))
		}, codes.FailedPrecondition, "802.1Q"},
		"node NOT_READY": {func(t *testing.T, e *env) { e.setNodeState(t, "n1", poolv1.Node_NOT_READY) }, codes.FailedPrecondition, "not READY"},
		"boot lost answer": {func(_ *testing.T, e *env) {
			e.nodes["n1"].FailOn("BootVM", status.Error(codes.DeadlineExceeded, "deadline"))
		}, codes.Unavailable, "boot vm"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			ctx := context.Background()
			e.mkBS(t, "root", "n1")
			tc.break_(t, e)
			_, err := e.vm.CreateVirtualMachine(ctx, vmReq("vm1", "root"))
			wantCode(t, err, tc.code, tc.contains)
			e.assertVMGone(t, "vm1")
			if e.bsState(t, "root") != bsAvailable {
				t.Fatalf("root left %v", e.bsState(t, "root"))
			}
		})
	}
}

// When a compensation itself fails, the record stays PENDING with the
// reason and an expired deadline; the reconciler finishes the rollback.
func TestCompensationFailureLeftToReconciler(t *testing.T) {
	old := compensationBackoff
	compensationBackoff = 0
	t.Cleanup(func() { compensationBackoff = old })
	e := newEnv(t)
	ctx := context.Background()
	e.mkBS(t, "root", "n1")
	n1 := e.nodes["n1"]
	n1.FailOn("BootVM", status.Error(codes.Internal, "boom"))
	n1.FailOn("DeleteVM", status.Error(codes.Internal, "qmp gone"))
	_, err := e.vm.CreateVirtualMachine(ctx, vmReq("vm1", "root"))
	wantCode(t, err, codes.Internal, "boom")
	vm, err := e.svc.GetVirtualMachine(ctx, "vm1")
	if err != nil {
		t.Fatalf("record gone although a compensation failed: %v", err)
	}
	if vm.GetState() != vmPending || vm.GetAnnotations()[AnnotationRollbackFailed] == "" {
		t.Fatalf("record = %v", vm)
	}
	if len(e.logs.records("compensation failed")) == 0 {
		t.Fatal("no CRITICAL log for the failed compensation")
	}
	// Later calls see PENDING.
	_, err = e.vm.DeleteVirtualMachine(ctx, &provisioningv1.DeleteVirtualMachineRequest{Name: "vm1"})
	wantCode(t, err, codes.FailedPrecondition, "reconciler will resolve it")

	n1.FailOn("BootVM", nil)
	n1.FailOn("DeleteVM", nil)
	e.clock.Advance(1)
	if err := e.svc.ReconcileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	e.assertVMGone(t, "vm1")
}

func TestConcurrentCreateSameName(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := vmReq("twin")
			req.Annotations = map[string]string{AnnotationVMRequestNode: fmt.Sprintf("n%d", i%2+1)}
			_, errs[i] = e.vm.CreateVirtualMachine(ctx, req)
		}()
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		switch status.Code(err) {
		case codes.OK:
			won++
		case codes.AlreadyExists:
		default:
			t.Errorf("unexpected error %v", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d creates won, want exactly 1", won)
	}
	nodes, _ := e.pool.ListNodes(ctx)
	computes := 0
	for _, nd := range nodes {
		computes += len(nd.GetReservedComputes())
	}
	netw, _ := e.pool.GetNetwork(ctx, "net1")
	if computes != 1 || len(netw.GetReservedNetworkInterfaces()) != 1 {
		t.Fatalf("%d computes and %d interfaces reserved, want 1 and 1", computes, len(netw.GetReservedNetworkInterfaces()))
	}
}

func TestConcurrentCreateSameDisk(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.mkBS(t, "shared", "n1")
	const n = 6
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = e.vm.CreateVirtualMachine(ctx, vmReq(fmt.Sprintf("vm%d", i), "shared"))
		}()
	}
	wg.Wait()
	won := 0
	for i, err := range errs {
		if err == nil {
			won++
			continue
		}
		if c := status.Code(err); c != codes.FailedPrecondition {
			t.Errorf("vm%d: %v", i, err)
		}
		e.assertVMGone(t, fmt.Sprintf("vm%d", i))
	}
	if won != 1 {
		t.Fatalf("%d creates won the disk, want 1", won)
	}
}

func TestUpdateVirtualMachineMetadata(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.vm.CreateVirtualMachine(ctx, vmReq("m")); err != nil {
		t.Fatal(err)
	}
	got, err := e.vm.UpdateVirtualMachine(ctx, &provisioningv1.UpdateVirtualMachineRequest{Name: "m",
		Labels: map[string]string{"a": "b"}, Annotations: map[string]string{"note": "x", AnnotationExpiresAt: "2030-01-01T00:00:00Z"}})
	if err != nil {
		t.Fatal(err)
	}
	want := proto.Clone(got).(*provisioningv1.VirtualMachine)
	want.Labels = map[string]string{"a": "b"}
	want.Annotations = map[string]string{"note": "x", AnnotationExpiresAt: "2030-01-01T00:00:00Z"}
	if d := cmp.Diff(want, got, protocmp.Transform()); d != "" || got.GetState() != vmRunning {
		t.Fatalf("(-want +got):\n%s", d)
	}
	_, err = e.vm.UpdateVirtualMachine(ctx, &provisioningv1.UpdateVirtualMachineRequest{Name: "m", BlockStorageNames: []string{"x"}})
	wantCode(t, err, codes.FailedPrecondition, "not supported yet")
	_, err = e.vm.UpdateVirtualMachine(ctx, &provisioningv1.UpdateVirtualMachineRequest{Name: "nope"})
	wantCode(t, err, codes.NotFound, "nope")
}

// A node that dies right after starting QEMU: the rollback releases
// compute, interface and disk but cannot reach the node, so the record
// stays PENDING (annotated, with the node journaled); when the node is
// back the reconciler deletes the zombie VM and the record.
func TestNodeVanishesAfterBoot(t *testing.T) {
	old := compensationBackoff
	compensationBackoff = 0
	t.Cleanup(func() { compensationBackoff = old })
	e := newEnv(t)
	ctx := context.Background()
	e.mkBS(t, "root", "n1")
	e.nodes["n1"].VanishAfter("BootVM")
	_, err := e.vm.CreateVirtualMachine(ctx, vmReq("vm1", "root"))
	wantCode(t, err, codes.Unavailable, "vanished")
	if e.nodes["n1"].VM("vm1") == nil {
		t.Fatal("test setup: the fake did not start the VM")
	}
	vm, err := e.svc.GetVirtualMachine(ctx, "vm1")
	if err != nil || vm.GetState() != vmPending || vm.GetComputeNodeName() != "n1" || vm.GetAnnotations()[AnnotationRollbackFailed] == "" {
		t.Fatalf("record = %v, %v", vm, err)
	}
	n1, _ := e.pool.GetNode(ctx, "n1")
	netw, _ := e.pool.GetNetwork(ctx, "net1")
	if len(n1.GetReservedComputes()) != 0 || len(netw.GetReservedNetworkInterfaces()) != 0 || e.bsState(t, "root") != bsAvailable {
		t.Fatalf("left: computes %v interfaces %v root %v", n1.GetReservedComputes(), netw.GetReservedNetworkInterfaces(), e.bsState(t, "root"))
	}
	// Still down: the reconciler keeps the record.
	e.clock.Advance(time.Second)
	if err := e.svc.ReconcileOnce(ctx); err == nil {
		t.Fatal("reconcile succeeded against a dead node")
	}
	if _, err := e.svc.GetVirtualMachine(ctx, "vm1"); err != nil {
		t.Fatal("record dropped while the node may still run the VM")
	}
	e.nodes["n1"].SetDown(false)
	e.clock.Advance(time.Second)
	if err := e.svc.ReconcileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	e.assertVMGone(t, "vm1")
}
