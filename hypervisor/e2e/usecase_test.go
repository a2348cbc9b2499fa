package e2e

import (
	"context"
	"fmt"
	"github.com/corralhq/corral/deploy"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
	"github.com/corralhq/corral/hypervisor/appliance"
	"github.com/corralhq/corral/hypervisor/netdev"
	"github.com/corralhq/corral/testsupport/hvlab"
	"github.com/corralhq/corral/testsupport/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const usecaseKeyComment = "testkey" // the ecdsa key in n0stack's usecase file

// newTinyLab starts a lab serving the tiny guest as guest-tiny.qcow2 and
// registers it as image cloudimage-ubuntu (tags latest, 18.04) with
// n0stack's register-blockstorage-as-image usecase, with corral do's
// default parallelism. That file races: RegisterBlockStorage depends only
// on ApplyImage, not on FetchISO, so it can meet the block storage still
// PENDING (the appliance answers FailedPrecondition "retry later"); corral
// do sends such a task again until the record's deadline.
func newTinyLab(t *testing.T) *hvlab.Lab {
	t.Helper()
	img := tiny(t)
	l := hvlab.New(t, bins, hvlab.Options{Files: map[string]string{"guest-tiny.qcow2": img}})
	out, d := l.MustDo("register.yaml", usecase(t, l, "register-blockstorage-as-image.yaml"), deploy.DefaultParallel)
	t.Logf("register-blockstorage-as-image.yaml in %v:\n%s", d.Round(time.Millisecond), out)
	return l
}

// vmDAG creates block storage <vm>-disk from image cloudimage-ubuntu:18.04
// and VM vm on test-network with a static address, login user and key.
func vmDAG(vm, addr, user, key string, memMiB int) string {
	return fmt.Sprintf(`
ApplyNetwork:
  type: Network
  action: ApplyNetwork
  args:
    name: test-network
    ipv4_cidr: 192.168.0.0/24
Generate_%[1]s:
  type: Image
  action: GenerateBlockStorage
  args:
    image_name: cloudimage-ubuntu
    tag: "18.04"
    block_storage_name: %[1]s-disk
    annotations:
      n0core/provisioning/block_storage/request_node_name: vm-host1
    request_bytes: 1073741824
    limit_bytes: 10737418240
Create_%[1]s:
  type: VirtualMachine
  action: CreateVirtualMachine
  args:
    name: %[1]s
    annotations:
      n0core/provisioning/virtual_machine/request_node_name: vm-host1
    request_cpu_milli_core: 10
    limit_cpu_milli_core: 1000
    request_memory_bytes: %[5]d
    limit_memory_bytes: %[5]d
    block_storage_names: [%[1]s-disk]
    nics:
      - network_name: test-network
        ipv4_address: %[2]s
    login_username: %[3]s
    ssh_authorized_keys:
      - %[4]s
  depends_on: [Generate_%[1]s, ApplyNetwork]
`, vm, addr, user, key, memMiB<<20)
}

// vmInverseDAG deletes and purges what vmDAG created (not the network).
func vmInverseDAG(vm string) string {
	return fmt.Sprintf(`
Delete_%[1]s:
  type: VirtualMachine
  action: DeleteVirtualMachine
  args: {name: %[1]s}
Delete_%[1]s-disk:
  type: BlockStorage
  action: DeleteBlockStorage
  args: {name: %[1]s-disk}
  depends_on: [Delete_%[1]s]
Purge_%[1]s-disk:
  type: BlockStorage
  action: PurgeBlockStorage
  args: {name: %[1]s-disk}
  depends_on: [Delete_%[1]s-disk]
`, vm)
}

// sshKey makes an ed25519 key pair and returns the private key path and
// the public key line.
func sshKey(t *testing.T) (string, string) {
	t.Helper()
	require.Tool(t, "ssh-keygen", "ssh")
	p := filepath.Join(t.TempDir(), "id_ed25519")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "e2e@corral", "-f", p).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v %s", err, out)
	}
	pub, err := os.ReadFile(p + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	return p, strings.TrimSpace(string(pub))
}

// sshRun runs cmd on user@addr from the namespace, retrying until the
// server answers or timeout.
func sshRun(l *hvlab.Lab, key, user, addr, cmd string, timeout time.Duration) (string, time.Duration, error) {
	start := time.Now()
	var out string
	var err error
	for time.Since(start) < timeout {
		out, err = l.InNS(30*time.Second, "ssh", "-i", key, "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
			"-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR", user+"@"+addr, cmd)
		if err == nil {
			return out, time.Since(start), nil
		}
		time.Sleep(time.Second)
	}
	return out, time.Since(start), err
}

func getVM(t *testing.T, l *hvlab.Lab, name string) (*provisioningv1.VirtualMachine, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return provisioningv1.NewVirtualMachineServiceClient(l.Conn).GetVirtualMachine(ctx, &provisioningv1.GetVirtualMachineRequest{Name: name})
}

func getBS(t *testing.T, l *hvlab.Lab, name string) (*provisioningv1.BlockStorage, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return provisioningv1.NewBlockStorageServiceClient(l.Conn).GetBlockStorage(ctx, &provisioningv1.GetBlockStorageRequest{Name: name})
}

func getNode(t *testing.T, l *hvlab.Lab) *poolv1.Node {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := l.Pool().GetNode(ctx, &poolv1.GetNodeRequest{Name: hvlab.NodeName})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// volumePath is the node file of a block storage (its url annotation).
func volumePath(t *testing.T, l *hvlab.Lab, bs string) string {
	t.Helper()
	b, err := getBS(t, l, bs)
	if err != nil {
		t.Fatalf("block storage %s: %v", bs, err)
	}
	u := b.GetAnnotations()[appliance.AnnotationBlockStorageURL]
	p, ok := strings.CutPrefix(u, "file://")
	if !ok {
		t.Fatalf("block storage %s url %q", bs, u)
	}
	return p
}

// assertVMGone checks that nothing of vm is left: record, QEMU, tap,
// compute budget, interface reservation on test-network.
func assertVMGone(t *testing.T, l *hvlab.Lab, vm string) {
	t.Helper()
	if _, err := getVM(t, l, vm); status.Code(err) != codes.NotFound {
		t.Errorf("vm %s: %v, want NotFound", vm, err)
	}
	if pids := l.QEMUPids(vm); len(pids) > 0 {
		t.Errorf("vm %s: QEMU still running: %v", vm, pids)
	}
	links, err := l.Links()
	if err != nil {
		t.Fatal(err)
	}
	if tap := netdev.TapName(vm, 0); slices.Contains(links, tap) {
		t.Errorf("vm %s: tap %s left in %s: %v", vm, tap, l.NS, links)
	}
	n := getNode(t, l)
	if _, ok := n.GetReservedComputes()[vm]; ok {
		t.Errorf("vm %s: compute budget entry left on node: %v", vm, n.GetReservedComputes())
	}
	if _, err := os.Stat(filepath.Join(l.NodeDir, "vms", vm)); !os.IsNotExist(err) {
		t.Errorf("vm %s: directory left on node: %v", vm, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	netw, err := poolv1.NewNetworkServiceClient(l.Conn).GetNetwork(ctx, &poolv1.GetNetworkRequest{Name: "test-network"})
	if err == nil {
		for name, r := range netw.GetReservedNetworkInterfaces() {
			if r.GetAnnotations()[appliance.AnnotationVMReservedBy] == vm || strings.HasPrefix(name, vm+"-") {
				t.Errorf("vm %s: interface reservation %s left on test-network", vm, name)
			}
		}
	} else if status.Code(err) != codes.NotFound {
		t.Errorf("get network: %v", err)
	}
}

// TestBootVMFromImageUsecase runs n0stack's "boot VM from image" usecase
// through the corral CLI against corrald and a real node: the tiny guest
// boots under TCG and applies hostname, user, key and static address from
// the NoCloud seed; a second VM on the same Network pings the first over
// SSH; the inverse usecase removes VMs, volumes, taps and the bridge.
func TestBootVMFromImageUsecase(t *testing.T) {
	need(t)
	key, pub := sshKey(t)
	l := newTinyLab(t)

	out, d := l.MustDo("boot.yaml", usecase(t, l, "boot-vm-from-image.yaml"), 4)
	t.Logf("boot-vm-from-image.yaml in %v:\n%s", d.Round(time.Millisecond), out)
	figure(t, "corral do boot-vm-from-image.yaml (GenerateBlockStorage+ApplyNetwork+CreateVirtualMachine, QEMU running): %v", d.Round(time.Millisecond))
	if vm, err := getVM(t, l, "test-vm"); err != nil || vm.GetState() != provisioningv1.VirtualMachine_RUNNING || vm.GetComputeNodeName() != hvlab.NodeName {
		t.Fatalf("test-vm after create: %v %v", vm, err)
	}
	wait, err := l.WaitConsole("test-vm", 2*time.Minute,
		"CORRAL-TINY hostname=test-vm ",
		"CORRAL-TINY user=n0user uid=1000 keys=1",
		"CORRAL-TINY key user=n0user type=ecdsa-sha2-nistp256 comment="+usecaseKeyComment,
		"CORRAL-TINY address dev=eth0 mac=",
		"addr=192.168.0.1/24",
		"CORRAL-TINY cloud-init done")
	if err != nil {
		t.Fatal(err)
	}
	figure(t, "test-vm: CreateVirtualMachine returned → tiny init applied the seed: %v", wait.Round(time.Millisecond))
	checkVMConsole(t, l, "test-vm")

	// The Network's bridge exists on the node; give the namespace an
	// address on it to reach the guests.
	bridge := bridgeOf("test-network")
	if out, err := l.InNS(5*time.Second, "ip", "addr", "add", "192.168.0.254/24", "dev", bridge); err != nil {
		t.Fatalf("address on bridge %s: %v %s", bridge, err, out)
	}
	if d, err := l.WaitPing("192.168.0.1", time.Minute); err != nil {
		t.Fatal(err)
	} else {
		t.Logf("test-vm answers ping from the namespace after %v", d.Round(time.Millisecond))
	}

	// A second VM on the same Network, with our own key, pings the first.
	out, d = l.MustDo("vm2.yaml", vmDAG("test-vm2", "192.168.0.2", "corral", pub, 256), 4)
	t.Logf("vm2 in %v:\n%s", d.Round(time.Millisecond), out)
	if _, err := l.WaitConsole("test-vm2", 2*time.Minute, "CORRAL-TINY hostname=test-vm2 ", "addr=192.168.0.2/24", "CORRAL-TINY cloud-init done"); err != nil {
		t.Fatal(err)
	}
	got, sshWait, err := sshRun(l, key, "corral", "192.168.0.2", "hostname; id -un; ping -c 3 -W 2 192.168.0.1", time.Minute)
	if err != nil {
		t.Fatalf("ssh corral@192.168.0.2: %v\n%s\nconsole:\n%s", err, got, l.Console("test-vm2"))
	}
	t.Logf("ssh into test-vm2 (after %v):\n%s", sshWait.Round(time.Millisecond), got)
	if !strings.HasPrefix(got, "test-vm2\ncorral\n") || !strings.Contains(got, "3 packets transmitted, 3 packets received") {
		t.Errorf("test-vm2 over ssh: want hostname, user and 3/3 pings of test-vm:\n%s", got)
	}

	// Inverse: our VM, then n0stack's inverse file.
	disk2 := volumePath(t, l, "test-vm2-disk")
	disk1 := volumePath(t, l, "test-blockstorage")
	l.MustDo("vm2-inverse.yaml", vmInverseDAG("test-vm2"), 4)
	out, d = l.MustDo("inverse.yaml", usecase(t, l, "boot-vm-from-image-inverse.yaml"), 4)
	t.Logf("boot-vm-from-image-inverse.yaml in %v:\n%s", d.Round(time.Millisecond), out)
	// n0stack's DeleteBlockStorage is a soft delete (DELETED keeps the
	// file and budget until purged); purge it to check nothing is left.
	if bs, err := getBS(t, l, "test-blockstorage"); err != nil || bs.GetState() != provisioningv1.BlockStorage_DELETED {
		t.Errorf("test-blockstorage after inverse: %v %v", bs, err)
	}
	l.MustDo("purge.yaml", "Purge:\n  type: BlockStorage\n  action: PurgeBlockStorage\n  args: {name: test-blockstorage}\n", 1)

	for _, vm := range []string{"test-vm", "test-vm2"} {
		assertVMGone(t, l, vm)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := poolv1.NewNetworkServiceClient(l.Conn).GetNetwork(ctx, &poolv1.GetNetworkRequest{Name: "test-network"}); status.Code(err) != codes.NotFound {
		t.Errorf("test-network after inverse: %v", err)
	}
	links, _ := l.Links()
	if slices.Contains(links, bridge) {
		t.Errorf("bridge %s left: %v", bridge, links)
	}
	for _, p := range []string{disk1, disk2} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("volume file %s left: %v", p, err)
		}
	}
	for _, bs := range []string{"test-blockstorage", "test-vm2-disk"} {
		if _, err := getBS(t, l, bs); status.Code(err) != codes.NotFound {
			t.Errorf("block storage %s: %v", bs, err)
		}
	}
	n := getNode(t, l)
	if len(n.GetReservedComputes()) != 0 {
		t.Errorf("compute budget left: %v", n.GetReservedComputes())
	}
	storages := []string{}
	for k := range n.GetReservedStorages() {
		storages = append(storages, k)
	}
	if len(storages) != 1 || storages[0] != "cloudimage-ubuntu-1804" {
		t.Errorf("storage budget: %v, want only the image's cloudimage-ubuntu-1804", storages)
	}
	if pids := l.QEMUPids(""); len(pids) != 0 {
		t.Errorf("QEMU processes left: %v", pids)
	}
}

// bridgeOf is the node's bridge of a Network.
func bridgeOf(network string) string { return netdev.BridgeName(network) }
