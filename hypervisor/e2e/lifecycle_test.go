package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	deploymentv1 "github.com/corralhq/corral/api/deployment/v1"
	hypervisorv1 "github.com/corralhq/corral/api/hypervisor/v1"
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
	"github.com/corralhq/corral/hypervisor/appliance"
	"github.com/corralhq/corral/testsupport/hvlab"
	"github.com/corralhq/corral/testsupport/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Reconcile timing of corrald as built: package appliance does not expose
// appliance.Config.ReconcileInterval (default 30 s) nor a way to trigger a
// pass, and the node heartbeats every 10 s. "Within one heartbeat +
// reconcile" is therefore up to ~40 s here.
const reconcileBound = appliance.DefaultReconcileInterval + 10*time.Second

func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(st)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z"
}

func nodeVMs(t *testing.T, hv hypervisorv1.HypervisorServiceClient) map[string]hypervisorv1.VMState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := hv.ListVMs(ctx, &hypervisorv1.ListVMsRequest{})
	if err != nil {
		t.Fatalf("node ListVMs: %v", err)
	}
	out := map[string]hypervisorv1.VMState{}
	for _, v := range l.GetVms() {
		out[v.GetName()] = v.GetState()
	}
	return out
}

// TestAgentRestart: a VM keeps running while corral-node is killed and
// restarted, and the restarted agent reports it again; then its QEMU is
// killed by hand and the VM shows as not running after the next heartbeat
// and reconciler pass.
func TestAgentRestart(t *testing.T) {
	need(t)
	key, pub := sshKey(t)
	l := newTinyLab(t)
	l.MustDo("rvm.yaml", vmDAG("rvm", "192.168.0.10", "corral", pub, 256), 4)
	if _, err := l.WaitConsole("rvm", 2*time.Minute, "CORRAL-TINY cloud-init done"); err != nil {
		t.Fatal(err)
	}
	if out, err := l.InNS(5*time.Second, "ip", "addr", "add", "192.168.0.254/24", "dev", bridgeOf("test-network")); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	pids := l.QEMUPids("rvm")
	if len(pids) != 1 {
		t.Fatalf("QEMU of rvm: %v", pids)
	}
	qemu := pids[0]

	l.KillNode()
	if _, err := l.WaitPing("192.168.0.10", 30*time.Second); err != nil {
		t.Fatalf("VM unreachable with the agent dead: %v", err)
	}
	if out, _, err := sshRun(l, key, "corral", "192.168.0.10", "echo alive", 30*time.Second); err != nil || !strings.Contains(out, "alive") {
		t.Fatalf("ssh with the agent dead: %v %s", err, out)
	}
	if !alive(qemu) {
		t.Fatal("QEMU died with the agent")
	}
	restart := time.Now()
	l.StartNode()
	if err := l.WaitNodeReady(time.Minute, restart); err != nil {
		t.Fatalf("%v\n%s", err, l.NodeLogTail(3000))
	}
	figure(t, "agent restart → Node READY again: %v", time.Since(restart).Round(time.Millisecond))
	hv := l.Hypervisor()
	if got := nodeVMs(t, hv); got["rvm"] != hypervisorv1.VMState_VM_STATE_RUNNING {
		t.Fatalf("restarted agent reports %v, want rvm RUNNING", got)
	}
	if now := l.QEMUPids("rvm"); !slices.Equal(now, []int{qemu}) {
		t.Errorf("QEMU of rvm after agent restart: %v, want the same pid %d", now, qemu)
	}
	// The appliance's view, after the reconciler has seen the node again.
	deadline := time.Now().Add(reconcileBound + 15*time.Second)
	for {
		vm, err := getVM(t, l, "rvm")
		if err == nil && vm.GetState() == provisioningv1.VirtualMachine_RUNNING && vm.GetAnnotations()[appliance.AnnotationNodeStatus] == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rvm after restart: %v %v", vm, err)
		}
		time.Sleep(250 * time.Millisecond)
	}

	// Kill QEMU by hand.
	if err := syscall.Kill(qemu, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	for alive(qemu) && time.Since(killed) < 10*time.Second {
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("node reports right after the kill: %v", nodeVMs(t, hv))
	deadline = killed.Add(reconcileBound + 15*time.Second)
	for {
		vm, err := getVM(t, l, "rvm")
		if err != nil {
			t.Fatal(err)
		}
		if vm.GetState() != provisioningv1.VirtualMachine_RUNNING {
			figure(t, "QEMU killed by hand → VirtualMachine shows %s: %v (reconcile interval %v, heartbeat 10s); reason: %s",
				vm.GetState(), time.Since(killed).Round(time.Millisecond), appliance.DefaultReconcileInterval, vm.GetAnnotations()[appliance.AnnotationStateReason])
			if time.Since(killed) > reconcileBound {
				t.Errorf("took longer than one heartbeat + reconcile (%v)", reconcileBound)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rvm still RUNNING %v after its QEMU was killed", time.Since(killed))
		}
		time.Sleep(250 * time.Millisecond)
	}
	l.MustDo("rvm-inverse.yaml", vmInverseDAG("rvm"), 4)
	assertVMGone(t, l, "rvm")
}

// TestNodeDiesMidCreate kills corral-node while it handles the BootVM of
// a CreateVirtualMachine: the call fails with a clear error naming the
// node; after the node is back, the reconciler rolls the creation back
// and nothing is left: no record, QEMU, tap, compute budget entry or
// interface reservation, and the disk is AVAILABLE again.
func TestNodeDiesMidCreate(t *testing.T) {
	need(t)
	l := newTinyLab(t)
	l.MustDo("disk.yaml", `
ApplyNetwork:
  type: Network
  action: ApplyNetwork
  args: {name: test-network, ipv4_cidr: 192.168.0.0/24}
Generate:
  type: Image
  action: GenerateBlockStorage
  args:
    image_name: cloudimage-ubuntu
    tag: "18.04"
    block_storage_name: dvm-disk
    annotations: {n0core/provisioning/block_storage/request_node_name: vm-host1}
    request_bytes: 1073741824
    limit_bytes: 10737418240
`, 2)
	vms := provisioningv1.NewVirtualMachineServiceClient(l.Conn)
	vmDir := filepath.Join(l.NodeDir, "vms", "dvm")
	type result struct {
		err error
		d   time.Duration
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		_, err := vms.CreateVirtualMachine(ctx, &provisioningv1.CreateVirtualMachineRequest{
			Name:                "dvm",
			Annotations:         map[string]string{appliance.AnnotationVMRequestNode: hvlab.NodeName},
			RequestCpuMilliCore: 10, LimitCpuMilliCore: 1000,
			RequestMemoryBytes: 256 << 20, LimitMemoryBytes: 256 << 20,
			BlockStorageNames: []string{"dvm-disk"},
			Nics:              []*provisioningv1.VirtualMachineNIC{{NetworkName: "test-network", Ipv4Address: "192.168.0.30"}},
			LoginUsername:     "corral",
		})
		done <- result{err, time.Since(start)}
	}()
	// Kill the node as soon as BootVM has started on it.
	for {
		if _, err := os.Stat(vmDir); err == nil {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("CreateVirtualMachine ended before the node started BootVM: %v", r.err)
		default:
		}
		if time.Since(start) > time.Minute {
			t.Fatal("BootVM never started on the node")
		}
		time.Sleep(time.Millisecond)
	}
	// Freeze it at once (BootVM still has QEMU to start and QMP to
	// drive), then kill it.
	syscall.Kill(l.NodePID(), syscall.SIGSTOP)
	l.KillNode()
	killed := time.Since(start)
	t.Logf("QEMU of dvm when the node died: %v", l.QEMUPids("dvm"))
	r := <-done
	t.Logf("node killed %v after the call started; CreateVirtualMachine returned after %v: %v", killed.Round(time.Millisecond), r.d.Round(time.Millisecond), r.err)
	if r.err == nil {
		t.Fatal("CreateVirtualMachine succeeded although the node died during BootVM")
	}
	if c := status.Code(r.err); c != codes.Unavailable || !strings.Contains(r.err.Error(), hvlab.NodeName) {
		t.Errorf("error %v: want Unavailable naming node %s", r.err, hvlab.NodeName)
	}
	vm, err := getVM(t, l, "dvm")
	switch {
	case status.Code(err) == codes.NotFound:
		t.Log("record removed by the compensation")
	case err != nil:
		t.Fatal(err)
	default:
		t.Logf("record left %s for the reconciler; rollback_failed: %s", vm.GetState(), vm.GetAnnotations()[appliance.AnnotationRollbackFailed])
		if vm.GetState() != provisioningv1.VirtualMachine_PENDING {
			t.Errorf("half-created VM record is %s, want PENDING (for the reconciler)", vm.GetState())
		}
	}

	restart := time.Now()
	l.StartNode()
	if err := l.WaitNodeReady(time.Minute, restart); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(reconcileBound + 15*time.Second)
	for {
		_, err := getVM(t, l, "dvm")
		if status.Code(err) == codes.NotFound && len(l.QEMUPids("dvm")) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dvm not rolled back %v after the node came back: %v; QEMU %v\n%s", time.Since(restart), err, l.QEMUPids("dvm"), l.ServerLogTail(3000))
		}
		time.Sleep(250 * time.Millisecond)
	}
	figure(t, "node back → reconciler rolled back the half-created VM: %v", time.Since(restart).Round(time.Millisecond))
	assertVMGone(t, l, "dvm")
	if bs, err := getBS(t, l, "dvm-disk"); err != nil || bs.GetState() != provisioningv1.BlockStorage_AVAILABLE {
		t.Errorf("dvm-disk after rollback: %v %v", bs, err)
	}
}

// TestVolumeFromImageSize: GenerateBlockStorage from a 10 GiB image takes
// the same time as from a 100 MiB one (a qcow2 overlay on a backing file;
// nothing is copied). Both images carry 32 MiB of data at their start and
// are otherwise zero-mapped (qemu-io on the node's files).
func TestVolumeFromImageSize(t *testing.T) {
	need(t)
	require.Tool(t, "qemu-io")
	l := hvlab.New(t, bins, hvlab.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bsc := provisioningv1.NewBlockStorageServiceClient(l.Conn)
	imc := deploymentv1.NewImageServiceClient(l.Conn)
	ann := map[string]string{appliance.AnnotationBlockStorageRequestNode: hvlab.NodeName}
	sizes := []struct {
		name string
		size uint64
	}{{"img-100m", 100 << 20}, {"img-10g", 10 << 30}}
	took := map[string]time.Duration{}
	for _, s := range sizes {
		if _, err := bsc.CreateBlockStorage(ctx, &provisioningv1.CreateBlockStorageRequest{Name: s.name, Annotations: ann, RequestBytes: s.size, LimitBytes: s.size}); err != nil {
			t.Fatal(err)
		}
		path := volumePath(t, l, s.name)
		args := []string{"-f", "qcow2", "-c", "write -P 0x5a 0 32M"}
		for off := uint64(32 << 20); off < s.size; off += 1 << 30 {
			args = append(args, "-c", fmt.Sprintf("write -z %d %d", off, min(1<<30, s.size-off)))
		}
		if out, err := exec.Command("qemu-io", append(args, path)...).CombinedOutput(); err != nil {
			t.Fatalf("qemu-io %s: %v %s", path, err, out)
		}
		if _, err := imc.ApplyImage(ctx, &deploymentv1.ApplyImageRequest{Name: s.name}); err != nil {
			t.Fatal(err)
		}
		if _, err := imc.RegisterBlockStorage(ctx, &deploymentv1.RegisterBlockStorageRequest{ImageName: s.name, BlockStorageName: s.name, Tags: []string{"v1"}}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if _, err := imc.GenerateBlockStorage(ctx, &deploymentv1.GenerateBlockStorageRequest{ImageName: s.name, Tag: "v1", BlockStorageName: s.name + "-vol", Annotations: ann}); err != nil {
			t.Fatal(err)
		}
		took[s.name] = time.Since(start)
		vol := volumePath(t, l, s.name+"-vol")
		st, err := os.Stat(vol)
		if err != nil {
			t.Fatal(err)
		}
		info, _ := exec.Command("qemu-img", "info", "--output=json", vol).Output()
		if !strings.Contains(string(info), `"backing-filename"`) || st.Size() > 2<<20 {
			t.Errorf("%s-vol: %d bytes, qemu-img info %s: want a small overlay on a backing file", s.name, st.Size(), info)
		}
		figure(t, "GenerateBlockStorage from a %d MiB image: %v (overlay file %d KiB)", s.size>>20, took[s.name].Round(time.Microsecond), st.Size()>>10)
	}
	small, big := took["img-100m"], took["img-10g"]
	if big > 2*time.Second || big > 4*small+500*time.Millisecond {
		t.Errorf("10 GiB image took %v, 100 MiB %v: not independent of size", big, small)
	}
}
