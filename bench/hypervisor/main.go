// Command hypervisor prints hypervisor-path figures on real things (it
// asserts nothing): corrald in-process and built `corral-node hypervisor`
// processes in network namespaces (testsupport/hvlab), QEMU under TCG,
// the tiny guest image of testsupport/guestimage (and, with -cloudinit, the
// real cloud-init image).
//
//   - CreateVirtualMachine → QEMU running (the RPC returns once QEMU runs)
//     and → the guest's init has applied the NoCloud seed;
//   - volume create from an image (GenerateBlockStorage) vs image size;
//   - -vms VMs created by one `corral do --parallel N`.
//
// One node offers 4 x its CPUs in CPU limits (the pool's default
// overcommit) and every VM has at least 1 vCPU, so the VMs are spread over
// as many nodes (namespaces on this machine) as needed.
//
// Usage (root): go run ./bench/hypervisor [-samples 5] [-vms 20] [-parallel 8] [-mem 128] [-cloudinit]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"time"

	deploymentv1 "github.com/corralhq/corral/api/deployment/v1"
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
	"github.com/corralhq/corral/hypervisor/appliance"
	"github.com/corralhq/corral/hypervisor/netdev"
	"github.com/corralhq/corral/testsupport/guestimage"
	"github.com/corralhq/corral/testsupport/hvlab"
)

type benchT struct {
	dir      string
	cleanups []func()
}

func (b *benchT) Helper()                 {}
func (b *benchT) Logf(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }
func (b *benchT) Cleanup(f func())        { b.cleanups = append(b.cleanups, f) }
func (b *benchT) Fatalf(f string, a ...any) {
	fmt.Fprintf(os.Stderr, "FATAL: "+f+"\n", a...)
	b.done()
	os.Exit(1)
}
func (b *benchT) TempDir() string { d, _ := os.MkdirTemp(b.dir, "t"); return d }
func (b *benchT) done() {
	for i := len(b.cleanups) - 1; i >= 0; i-- {
		b.cleanups[i]()
	}
	b.cleanups = nil
	os.RemoveAll(b.dir)
}

func figure(format string, a ...any) { fmt.Printf("FIGURE "+format+"\n", a...) }

func stats(ds []time.Duration) string {
	if len(ds) == 0 {
		return "no samples"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	r := func(d time.Duration) time.Duration {
		if d > 10*time.Second {
			return d.Round(100 * time.Millisecond)
		}
		return d.Round(time.Millisecond / 10)
	}
	return fmt.Sprintf("median %v (min %v, max %v, n=%d)", r(s[len(s)/2]), r(s[0]), r(s[len(s)-1]), len(s))
}

func main() {
	samples := flag.Int("samples", 5, "samples per sequential figure")
	vms := flag.Int("vms", 20, "VMs created by one corral do")
	parallel := flag.Int("parallel", 8, "corral do --parallel")
	mem := flag.Int("mem", 128, "memory of each VM of the -vms run, MiB")
	cloudInit := flag.Bool("cloudinit", false, "also time the real cloud-init image (builds it once, ~2 min)")
	flag.Parse()
	if why := hvlab.Skip(); why != "" {
		fmt.Fprintln(os.Stderr, "hypervisor bench:", why)
		os.Exit(2)
	}
	dir, _ := os.MkdirTemp("", "corral-bench-hv")
	t := &benchT{dir: dir}
	defer t.done()

	start := time.Now()
	bins, err := hvlab.Build(t.TempDir(), false)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Logf("built corral-node and corral in %v", time.Since(start).Round(time.Millisecond))
	cache, err := guestimage.CacheDir()
	if err != nil {
		t.Fatalf("%v", err)
	}
	ctx := context.Background()
	start = time.Now()
	tiny, err := guestimage.Tiny(ctx, cache)
	if err != nil {
		t.Fatalf("%v", err)
	}
	figure("tiny guest image: %v (cached=%v)", time.Since(start).Round(time.Millisecond), tiny.Cached)
	files := map[string]string{"tiny.qcow2": tiny.Path}
	var ci *guestimage.Image
	if *cloudInit {
		start = time.Now()
		ci, err = guestimage.CloudInit(ctx, cache)
		if err != nil {
			t.Fatalf("%v", err)
		}
		figure("cloud-init guest image: %v (cached=%v)", time.Since(start).Round(time.Millisecond), ci.Cached)
		files["cloudinit.qcow2"] = ci.Path
	}
	l := hvlab.New(t, bins, hvlab.Options{Files: files})
	perNode := 4 * runtime.NumCPU()
	for len(l.Nodes)*perNode < *vms {
		l.AddNode(fmt.Sprintf("vm-host%d", len(l.Nodes)+1))
	}
	t.Logf("%d node(s), %d 1-vCPU VMs each at most (4 x %d CPUs)", len(l.Nodes), perNode, runtime.NumCPU())

	bsc := provisioningv1.NewBlockStorageServiceClient(l.Conn)
	imc := deploymentv1.NewImageServiceClient(l.Conn)
	vmc := provisioningv1.NewVirtualMachineServiceClient(l.Conn)
	onNode := func(n string) map[string]string {
		return map[string]string{appliance.AnnotationBlockStorageRequestNode: n, appliance.AnnotationVMRequestNode: n}
	}
	must := func(err error) {
		if err != nil {
			t.Fatalf("%v", err)
		}
	}
	register := func(node *hvlab.Node, image, file string, limit uint64) {
		bs := image + "-src"
		_, err := bsc.FetchBlockStorage(ctx, &provisioningv1.FetchBlockStorageRequest{Name: bs, Annotations: onNode(node.Name),
			RequestBytes: limit, LimitBytes: limit, SourceUrl: l.WebURL + file})
		must(err)
		_, err = imc.ApplyImage(ctx, &deploymentv1.ApplyImageRequest{Name: image})
		must(err)
		_, err = imc.RegisterBlockStorage(ctx, &deploymentv1.RegisterBlockStorageRequest{ImageName: image, BlockStorageName: bs, Tags: []string{"v1"}})
		must(err)
	}
	for _, n := range l.Nodes {
		register(n, "tiny-"+n.Name, "tiny.qcow2", 256<<20)
	}
	_, _, err = l.Do("net.yaml", "ApplyNetwork:\n  type: Network\n  action: ApplyNetwork\n  args: {name: bench-net, ipv4_cidr: 192.168.50.0/24}\n", 1)
	must(err)
	purge := func(name string) {
		_, err := bsc.DeleteBlockStorage(ctx, &provisioningv1.DeleteBlockStorageRequest{Name: name})
		must(err)
		_, err = bsc.PurgeBlockStorage(ctx, &provisioningv1.PurgeBlockStorageRequest{Name: name})
		must(err)
	}
	node0 := l.Nodes[0]

	// CreateVirtualMachine → QEMU running → init done.
	var rpc, initDone []time.Duration
	for i := 0; i < *samples; i++ {
		name := fmt.Sprintf("seq%d", i)
		_, err := imc.GenerateBlockStorage(ctx, &deploymentv1.GenerateBlockStorageRequest{ImageName: "tiny-" + node0.Name, Tag: "v1", BlockStorageName: name + "-disk", Annotations: onNode(node0.Name)})
		must(err)
		start := time.Now()
		_, err = vmc.CreateVirtualMachine(ctx, &provisioningv1.CreateVirtualMachineRequest{Name: name, Annotations: onNode(node0.Name),
			RequestCpuMilliCore: 10, LimitCpuMilliCore: 1000, RequestMemoryBytes: 256 << 20, LimitMemoryBytes: 256 << 20,
			BlockStorageNames: []string{name + "-disk"}, LoginUsername: "bench",
			Nics: []*provisioningv1.VirtualMachineNIC{{NetworkName: "bench-net", Ipv4Address: fmt.Sprintf("192.168.50.%d", 200+i)}}})
		must(err)
		rpc = append(rpc, time.Since(start))
		if _, err := node0.WaitConsole(name, 3*time.Minute, "CORRAL-TINY cloud-init done"); err != nil {
			t.Fatalf("%v", err)
		}
		initDone = append(initDone, time.Since(start))
		_, err = vmc.DeleteVirtualMachine(ctx, &provisioningv1.DeleteVirtualMachineRequest{Name: name})
		must(err)
		purge(name + "-disk")
	}
	figure("CreateVirtualMachine → QEMU running (RPC returned), tiny guest, 1 vCPU 256 MiB, TCG: %s", stats(rpc))
	figure("CreateVirtualMachine → guest init applied the NoCloud seed (hostname, user, key, address; sshd up): %s", stats(initDone))

	// Volume from image vs image size.
	sizes := []uint64{100 << 20, 1 << 30, 10 << 30, 100 << 30}
	for _, size := range sizes {
		img := fmt.Sprintf("size-%dm", size>>20)
		src := img + "-src"
		if _, err := bsc.CreateBlockStorage(ctx, &provisioningv1.CreateBlockStorageRequest{Name: src, Annotations: onNode(node0.Name), RequestBytes: size, LimitBytes: size}); err != nil {
			figure("GenerateBlockStorage from a %d MiB image: skipped (%v)", size>>20, err)
			continue
		}
		b, err := bsc.GetBlockStorage(ctx, &provisioningv1.GetBlockStorageRequest{Name: src})
		must(err)
		path := strings.TrimPrefix(b.GetAnnotations()[appliance.AnnotationBlockStorageURL], "file://")
		args := []string{"-f", "qcow2", "-c", "write -P 0x5a 0 32M"}
		for off := uint64(32 << 20); off < size; off += 1 << 30 {
			args = append(args, "-c", fmt.Sprintf("write -z %d %d", off, min(1<<30, size-off)))
		}
		if out, err := exec.Command("qemu-io", append(args, path)...).CombinedOutput(); err != nil {
			t.Fatalf("qemu-io: %v %s", err, out)
		}
		_, err = imc.ApplyImage(ctx, &deploymentv1.ApplyImageRequest{Name: img})
		must(err)
		_, err = imc.RegisterBlockStorage(ctx, &deploymentv1.RegisterBlockStorageRequest{ImageName: img, BlockStorageName: src, Tags: []string{"v1"}})
		must(err)
		var gen []time.Duration
		for i := 0; i < *samples; i++ {
			start := time.Now()
			_, err := imc.GenerateBlockStorage(ctx, &deploymentv1.GenerateBlockStorageRequest{ImageName: img, Tag: "v1", BlockStorageName: fmt.Sprintf("%s-vol%d", img, i), Annotations: onNode(node0.Name)})
			if err != nil {
				figure("GenerateBlockStorage from a %d MiB image: %v", size>>20, err)
				break
			}
			gen = append(gen, time.Since(start))
			purge(fmt.Sprintf("%s-vol%d", img, i))
		}
		figure("GenerateBlockStorage (qcow2 overlay) from a %6d MiB image (32 MiB data, rest zero-mapped): %s", size>>20, stats(gen))
	}

	// -vms VMs by one corral do --parallel N.
	var dag, inverse strings.Builder
	for i := 0; i < *vms; i++ {
		n := l.Nodes[i%len(l.Nodes)]
		fmt.Fprintf(&dag, `
Generate_vm%[1]d:
  type: Image
  action: GenerateBlockStorage
  args:
    image_name: tiny-%[2]s
    tag: v1
    block_storage_name: vm%[1]d-disk
    annotations: {n0core/provisioning/block_storage/request_node_name: %[2]s}
Create_vm%[1]d:
  type: VirtualMachine
  action: CreateVirtualMachine
  args:
    name: vm%[1]d
    annotations: {n0core/provisioning/virtual_machine/request_node_name: %[2]s}
    request_cpu_milli_core: 10
    limit_cpu_milli_core: 1000
    request_memory_bytes: %[3]d
    limit_memory_bytes: %[3]d
    block_storage_names: [vm%[1]d-disk]
    nics: [{network_name: bench-net, ipv4_address: 192.168.50.%[4]d}]
    login_username: bench
  depends_on: [Generate_vm%[1]d]
`, i, n.Name, *mem<<20, 10+i)
		fmt.Fprintf(&inverse, `
Delete_vm%[1]d:
  type: VirtualMachine
  action: DeleteVirtualMachine
  args: {name: vm%[1]d}
Delete_vm%[1]d-disk:
  type: BlockStorage
  action: DeleteBlockStorage
  args: {name: vm%[1]d-disk}
  depends_on: [Delete_vm%[1]d]
Purge_vm%[1]d-disk:
  type: BlockStorage
  action: PurgeBlockStorage
  args: {name: vm%[1]d-disk}
  depends_on: [Delete_vm%[1]d-disk]
`, i)
	}
	start = time.Now()
	out, doTime, err := l.Do("vms.yaml", dag.String(), *parallel)
	if err != nil {
		t.Fatalf("corral do: %v\n%s", err, out)
	}
	figure("%d VMs (tiny, 1 vCPU, %d MiB, TCG, %d node(s)) by one `corral do --parallel %d`: %v (all QEMU running); %s", *vms, *mem, len(l.Nodes), *parallel, doTime.Round(time.Millisecond), lastLine(out))
	for i := 0; i < *vms; i++ {
		n := l.Nodes[i%len(l.Nodes)]
		if _, err := n.WaitConsole(fmt.Sprintf("vm%d", i), 10*time.Minute, "CORRAL-TINY cloud-init done"); err != nil {
			t.Fatalf("%v", err)
		}
	}
	figure("%d VMs: corral do start → every guest's init done: %v", *vms, time.Since(start).Round(time.Millisecond))
	for k, n := range l.Nodes {
		if out, err := n.InNS(5*time.Second, "ip", "addr", "add", fmt.Sprintf("192.168.50.%d/24", 250+k), "dev", netdev.BridgeName("bench-net")); err != nil {
			t.Fatalf("%v %s", err, out)
		}
	}
	start = time.Now()
	for i := 0; i < *vms; i++ {
		if _, err := l.Nodes[i%len(l.Nodes)].WaitPing(fmt.Sprintf("192.168.50.%d", 10+i), time.Minute); err != nil {
			t.Fatalf("%v", err)
		}
	}
	figure("%d VMs: all answer ping (checked one after another in %v)", *vms, time.Since(start).Round(time.Millisecond))
	out, delTime, err := l.Do("vms-inverse.yaml", inverse.String(), *parallel)
	if err != nil {
		t.Fatalf("corral do inverse: %v\n%s", err, out)
	}
	figure("%d VMs deleted and disks purged by one `corral do --parallel %d`: %v", *vms, *parallel, delTime.Round(time.Millisecond))

	if ci != nil {
		register(node0, "debian-ci", "cloudinit.qcow2", 4<<30)
		_, err := imc.GenerateBlockStorage(ctx, &deploymentv1.GenerateBlockStorageRequest{ImageName: "debian-ci", Tag: "v1", BlockStorageName: "ci-disk", Annotations: onNode(node0.Name)})
		must(err)
		start := time.Now()
		_, err = vmc.CreateVirtualMachine(ctx, &provisioningv1.CreateVirtualMachineRequest{Name: "ci", Annotations: onNode(node0.Name),
			RequestCpuMilliCore: 10, LimitCpuMilliCore: 1000, RequestMemoryBytes: 1 << 30, LimitMemoryBytes: 1 << 30,
			BlockStorageNames: []string{"ci-disk"}, LoginUsername: "bench",
			Nics: []*provisioningv1.VirtualMachineNIC{{NetworkName: "bench-net", Ipv4Address: "192.168.50.240"}}})
		must(err)
		figure("real cloud-init image: CreateVirtualMachine → QEMU running: %v", time.Since(start).Round(time.Millisecond))
		if _, err := node0.WaitConsole("ci", 5*time.Minute, "DataSourceNoCloud"); err != nil {
			t.Fatalf("%v", err)
		}
		figure("real cloud-init image: CreateVirtualMachine → console shows DataSourceNoCloud (cloud-init prints it in its final line): %v", time.Since(start).Round(time.Millisecond))
		if _, err := node0.WaitConsole("ci", 5*time.Minute, "Cloud-init v.", "finished at"); err != nil {
			t.Fatalf("%v", err)
		}
		figure("real cloud-init image: CreateVirtualMachine → cloud-init finished: %v", time.Since(start).Round(time.Millisecond))
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
