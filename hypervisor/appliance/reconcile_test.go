package appliance

import (
	"context"
	"strings"
	"testing"
	"time"

	hypervisorv1 "github.com/corralhq/corral/api/hypervisor/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/grpc/codes"
)

// crashed returns a Services of a process that dies mid-operation: the
// test drives its steps by hand.
func (e *env) crashed(t *testing.T) *Services {
	t.Helper()
	dead, err := New(Config{Store: e.st, Pool: e.pool, Nodes: e.svc.cfg.Nodes, Now: e.clock.Now, Owner: "dead-process", OpTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return dead
}

// pendVMRecord writes a VM record as a crashed CreateVirtualMachine left
// it.
func (e *env) pendVMRecord(t *testing.T, dead *Services, req *provisioningv1.CreateVirtualMachineRequest) {
	t.Helper()
	ann := map[string]string{}
	dead.setPending(ann, opCreate, "")
	vm := &provisioningv1.VirtualMachine{Name: req.GetName(), Annotations: ann, State: vmPending, ComputeName: req.GetName(),
		RequestCpuMilliCore: req.GetRequestCpuMilliCore(), LimitCpuMilliCore: req.GetLimitCpuMilliCore(),
		RequestMemoryBytes: req.GetRequestMemoryBytes(), LimitMemoryBytes: req.GetLimitMemoryBytes(),
		BlockStorageNames: req.GetBlockStorageNames(), Nics: req.GetNics()}
	if _, err := record.Put(context.Background(), e.st, vmPrefix+req.GetName(), vm, 0); err != nil {
		t.Fatal(err)
	}
}

func TestReconcileResolvesExpiredPending(t *testing.T) {
	ctx := context.Background()
	cases := map[string]struct {
		crash func(t *testing.T, e *env, dead *Services)
		check func(t *testing.T, e *env)
	}{
		"vm create crashed after boot": {
			crash: func(t *testing.T, e *env, dead *Services) {
				req := vmReq("vm1", "root")
				e.pendVMRecord(t, dead, req)
				if _, err := dead.attachDisk(ctx, "root", "vm1"); err != nil {
					t.Fatal(err)
				}
				if _, err := e.pool.ReserveCompute(ctx, "n1", "vm1", computeOf(&provisioningv1.VirtualMachine{Name: "vm1",
					RequestCpuMilliCore: 1000, LimitCpuMilliCore: 2000, RequestMemoryBytes: gib, LimitMemoryBytes: gib})); err != nil {
					t.Fatal(err)
				}
				if _, err := e.pool.ReserveNetworkInterface(ctx, &poolv1.ReserveNetworkInterfaceRequest{NetworkName: "net1", NetworkInterfaceName: "vm1-0",
					Annotations: map[string]string{AnnotationVMReservedBy: "vm1"}}); err != nil {
					t.Fatal(err)
				}
				c := e.nodes["n1"].Client()
				if _, err := c.ApplyNetwork(ctx, &hypervisorv1.ApplyNetworkRequest{Name: "net1"}); err != nil {
					t.Fatal(err)
				}
				if _, err := c.BootVM(ctx, &hypervisorv1.BootVMRequest{Vm: &hypervisorv1.VM{Name: "vm1", Disks: []*hypervisorv1.Disk{{Volume: "root"}},
					Nics: []*hypervisorv1.Nic{{NetworkName: "net1"}}}}); err != nil {
					t.Fatal(err)
				}
			},
			check: func(t *testing.T, e *env) {
				e.assertVMGone(t, "vm1")
				if e.bsState(t, "root") != bsAvailable {
					t.Fatalf("root is %v", e.bsState(t, "root"))
				}
			},
		},
		"vm create crashed right after the record": {
			crash: func(t *testing.T, e *env, dead *Services) { e.pendVMRecord(t, dead, vmReq("vm1", "root")) },
			check: func(t *testing.T, e *env) { e.assertVMGone(t, "vm1") },
		},
		"block storage create crashed after the volume": {
			crash: func(t *testing.T, e *env, dead *Services) {
				ann := map[string]string{}
				dead.setPending(ann, opCreate, "")
				if _, err := record.Put(ctx, e.st, bsPrefix+"vol", &provisioningv1.BlockStorage{Name: "vol", Annotations: ann, State: bsPending,
					RequestBytes: gib, LimitBytes: gib, StorageName: "vol"}, 0); err != nil {
					t.Fatal(err)
				}
				if _, err := e.pool.ReserveStorage(ctx, "n2", "vol", &poolv1.Storage{RequestBytes: gib, LimitBytes: gib,
					Annotations: map[string]string{AnnotationBlockStorageReservedBy: "vol"}}); err != nil {
					t.Fatal(err)
				}
				if _, err := e.nodes["n2"].Client().CreateVolume(ctx, &hypervisorv1.CreateVolumeRequest{Name: "vol", SizeBytes: gib}); err != nil {
					t.Fatal(err)
				}
			},
			check: func(t *testing.T, e *env) { e.assertBSGone(t, "vol") },
		},
		"vm delete crashed after the node deleted it": {
			crash: func(t *testing.T, e *env, dead *Services) {
				if _, err := e.svc.CreateVirtualMachine(ctx, vmReq("vm1", "root")); err != nil {
					t.Fatal(err)
				}
				if _, _, err := dead.pendVM(ctx, "vm1", opDelete, nil); err != nil {
					t.Fatal(err)
				}
				e.nodes["n1"].KillVM("vm1")
			},
			check: func(t *testing.T, e *env) {
				e.assertVMGone(t, "vm1")
				if e.bsState(t, "root") != bsAvailable {
					t.Fatalf("root is %v", e.bsState(t, "root"))
				}
			},
		},
		"vm shutdown crashed": {
			crash: func(t *testing.T, e *env, dead *Services) {
				if _, err := e.svc.CreateVirtualMachine(ctx, vmReq("vm1", "root")); err != nil {
					t.Fatal(err)
				}
				if _, _, err := dead.pendVM(ctx, "vm1", opShutdown, nil); err != nil {
					t.Fatal(err)
				}
			},
			check: func(t *testing.T, e *env) {
				vm, err := e.svc.GetVirtualMachine(ctx, "vm1")
				if err != nil || vm.GetState() != vmRunning || len(vm.GetAnnotations()) != 0 {
					t.Fatalf("vm = %v, %v", vm, err)
				}
			},
		},
		"block storage purge crashed": {
			crash: func(t *testing.T, e *env, dead *Services) {
				if _, err := e.svc.DeleteBlockStorage(ctx, "root"); err != nil {
					t.Fatal(err)
				}
				if _, err := record.Update(ctx, e.st, bsPrefix+"root", newBS, func(bs *provisioningv1.BlockStorage, _ bool) (bool, error) {
					dead.setPending(bs.Annotations, opPurge, bs.GetState().String())
					bs.State = bsPending
					return false, nil
				}); err != nil {
					t.Fatal(err)
				}
			},
			check: func(t *testing.T, e *env) { e.assertBSGone(t, "root") },
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			e.mkBS(t, "root", "n1")
			tc.crash(t, e, e.crashed(t))

			// Before the deadline: left alone, and calls are refused.
			if err := e.svc.ReconcileOnce(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := e.vm.DeleteVirtualMachine(ctx, &provisioningv1.DeleteVirtualMachineRequest{Name: "vm1"}); strings.HasPrefix(name, "vm") {
				wantCode(t, err, codes.FailedPrecondition, "PENDING")
			}

			e.clock.Advance(2 * time.Minute)
			if err := e.svc.ReconcileOnce(ctx); err != nil {
				t.Fatal(err)
			}
			tc.check(t, e)
			if len(e.logs.records("resolved expired PENDING record")) != 1 {
				t.Fatal("no log of the resolution")
			}
		})
	}
}

func TestReconcileVMStateAgainstNode(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.vm.CreateVirtualMachine(ctx, vmReq("vm1")); err != nil {
		t.Fatal(err)
	}
	get := func() *provisioningv1.VirtualMachine {
		vm, err := e.svc.GetVirtualMachine(ctx, "vm1")
		if err != nil {
			t.Fatal(err)
		}
		return vm
	}
	node := get().GetComputeNodeName()
	fake := e.nodes[node]

	// QEMU dies: SHUTDOWN with a reason.
	fake.KillVM("vm1")
	if err := e.svc.ReconcileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	vm := get()
	if vm.GetState() != vmShutdown || !strings.Contains(vm.GetAnnotations()[AnnotationStateReason], "QEMU is not running") {
		t.Fatalf("after kill: %v", vm)
	}
	// A second pass rewrites nothing.
	rev1, _ := record.Get(ctx, e.st, vmPrefix+"vm1", newVM())
	if err := e.svc.ReconcileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if rev2, _ := record.Get(ctx, e.st, vmPrefix+"vm1", newVM()); rev2 != rev1 {
		t.Fatal("an idle pass rewrote the record")
	}
	// Boot brings it back and clears the reason.
	if vm, err := e.vm.BootVirtualMachine(ctx, &provisioningv1.BootVirtualMachineRequest{Name: "vm1"}); err != nil || vm.GetState() != vmRunning || vm.GetAnnotations()[AnnotationStateReason] != "" {
		t.Fatalf("boot: %v, %v", vm, err)
	}

	// Unreachable node: state kept, annotated.
	fake.SetDown(true)
	if err := e.svc.ReconcileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	vm = get()
	if vm.GetState() != vmRunning || !strings.Contains(vm.GetAnnotations()[AnnotationNodeStatus], "unreachable") {
		t.Fatalf("node down: %v", vm)
	}
	fake.SetDown(false)

	// NOT_READY node: state kept, annotated, node not even asked.
	e.setNodeState(t, node, poolv1.Node_NOT_READY)
	before := len(fake.Calls())
	fake.KillVM("vm1")
	if err := e.svc.ReconcileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	vm = get()
	if vm.GetState() != vmRunning || !strings.Contains(vm.GetAnnotations()[AnnotationNodeStatus], "NOT_READY") {
		t.Fatalf("node NOT_READY: %v", vm)
	}
	if len(fake.Calls()) != before {
		t.Fatalf("a NOT_READY node was called: %v", fake.Methods()[before:])
	}
	// Back to READY: annotation removed, the dead QEMU seen.
	e.setNodeState(t, node, poolv1.Node_READY)
	if err := e.svc.ReconcileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	vm = get()
	if vm.GetState() != vmShutdown || vm.GetAnnotations()[AnnotationNodeStatus] != "" {
		t.Fatalf("node back: %v", vm)
	}
}

func TestExpiry(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	exp := t0.Add(time.Hour).Format(time.RFC3339)
	e.mkBS(t, "keep-disk", "n1")
	e.mkBS(t, "used-disk", "n1")
	if _, err := e.bs.CreateBlockStorage(ctx, &provisioningv1.CreateBlockStorageRequest{Name: "tmp-disk", RequestBytes: gib, LimitBytes: gib,
		Annotations: map[string]string{AnnotationExpiresAt: exp}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.UpdateBlockStorage(ctx, &provisioningv1.UpdateBlockStorageRequest{Name: "used-disk", Annotations: map[string]string{AnnotationExpiresAt: exp}}); err != nil {
		t.Fatal(err)
	}
	req := vmReq("tmp-vm", "keep-disk")
	req.Annotations = map[string]string{AnnotationExpiresAt: exp}
	if _, err := e.vm.CreateVirtualMachine(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := e.vm.CreateVirtualMachine(ctx, vmReq("keeper", "used-disk")); err != nil {
		t.Fatal(err)
	}

	if err := e.svc.ReconcileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.GetVirtualMachine(ctx, "tmp-vm"); err != nil {
		t.Fatal("decommissioned before expiry")
	}

	e.clock.Advance(2 * time.Hour)
	if err := e.svc.ReconcileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	e.assertVMGone(t, "tmp-vm")
	e.assertBSGone(t, "tmp-disk")
	if e.bsState(t, "keep-disk") != bsAvailable {
		t.Fatalf("keep-disk is %v", e.bsState(t, "keep-disk"))
	}
	used, _ := e.svc.GetBlockStorage(ctx, "used-disk")
	if used.GetState() != bsInUse || !strings.Contains(used.GetAnnotations()[AnnotationDecommissioned], "not purged: IN_USE by virtual machine keeper") {
		t.Fatalf("used-disk = %v", used)
	}
	if _, err := e.svc.GetVirtualMachine(ctx, "keeper"); err != nil {
		t.Fatal(err)
	}
	recs := e.logs.records("decommissioning expired virtual machine")
	if len(recs) != 1 || recs[0]["name"] != "tmp-vm" || recs[0]["reason"] != "expired" || recs[0]["expires_at"] != exp || recs[0]["level"] != "INFO" {
		t.Fatalf("decommission log = %v", recs)
	}
	if recs := e.logs.records("decommissioning expired block storage"); len(recs) != 1 || recs[0]["name"] != "tmp-disk" {
		t.Fatalf("block storage decommission log = %v", recs)
	}
}

func TestRunStopsWithContext(t *testing.T) {
	e := newEnv(t)
	e.svc.cfg.ReconcileInterval = time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.svc.Run(ctx) }()
	time.Sleep(20 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}
