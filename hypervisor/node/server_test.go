package node

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	hypervisorv1 "github.com/corralhq/corral/api/hypervisor/v1"
	"github.com/corralhq/corral/hypervisor/cloudinit"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func code(err error) codes.Code { return status.Code(err) }

// TestServerLifecycle drives HypervisorService against real QEMU (a
// firmware-only guest: no OS needed), real qemu-img and real links in a
// namespace: bad input, volume in use, restart rediscovery, a killed QEMU
// reported FAILED and restarted by Restore, and a clean teardown.
func TestServerLifecycle(t *testing.T) {
	needTools(t)
	ctx := context.Background()
	ns := fmt.Sprintf("crl-node-%d-%d", os.Getpid(), time.Now().UnixNano()%100000)
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	data := t.TempDir()
	scfg := ServerConfig{DataDir: data, Accel: "tcg", NetNSPath: "/var/run/netns/" + ns,
		QEMUWrapper: []string{"ip", "netns", "exec", ns}, ShutdownTimeout: 2 * time.Second}
	s, err := NewServer(ctx, scfg)
	if err != nil {
		t.Fatal(err)
	}
	network := "n-" + ns
	if _, err := s.ApplyNetwork(ctx, &hypervisorv1.ApplyNetworkRequest{Name: network, GatewayCidr: "10.98.0.1/24"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ApplyNetwork(ctx, &hypervisorv1.ApplyNetworkRequest{Name: "v", VlanId: 5000}); code(err) != codes.InvalidArgument {
		t.Errorf("vlan 5000: %v", err)
	}
	if _, err := s.CreateVolume(ctx, &hypervisorv1.CreateVolumeRequest{Name: "base", SizeBytes: 32 << 20}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateVolume(ctx, &hypervisorv1.CreateVolumeRequest{Name: "root1", BackingVolume: "base"}); err != nil {
		t.Fatal(err)
	}
	var iso bytes.Buffer
	(cloudinit.Seed{InstanceID: "i", Hostname: "installer"}).WriteISO(&iso)
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(iso.Bytes()) }))
	defer web.Close()
	sum := sha256.Sum256(iso.Bytes())
	if v, err := s.FetchVolume(ctx, &hypervisorv1.FetchVolumeRequest{Name: "installer", SourceUrl: web.URL + "/x.iso", Sha256: hex.EncodeToString(sum[:])}); err != nil || v.GetFormat() != "raw" {
		t.Fatalf("fetch iso: %v %v", v, err)
	}
	if _, err := s.FetchVolume(ctx, &hypervisorv1.FetchVolumeRequest{Name: "bad", SourceUrl: web.URL + "/x.iso", Sha256: strings.Repeat("0", 64)}); code(err) != codes.FailedPrecondition {
		t.Errorf("wrong checksum: %v", err)
	}
	if _, err := s.FetchVolume(ctx, &hypervisorv1.FetchVolumeRequest{Name: "bad", SourceUrl: web.URL + "/x.iso", MaxBytes: 1024}); code(err) != codes.ResourceExhausted {
		t.Errorf("too large: %v", err)
	}
	vm1 := &hypervisorv1.VM{
		Name: "vm1", Uuid: "3f2a6c1e-0000-4000-8000-0000000000bb", Vcpus: 1, MemoryBytes: 128 << 20,
		Disks:             []*hypervisorv1.Disk{{Volume: "root1", BootIndex: 1}, {Volume: "installer", BootIndex: 0}},
		Nics:              []*hypervisorv1.Nic{{NetworkName: network, HardwareAddress: "52:54:00:aa:bb:01", Ipv4AddressCidr: "10.98.0.10/24", Ipv4Gateway: "10.98.0.1", Nameservers: []string{"10.98.0.1"}}},
		LoginUsername:     "corral",
		SshAuthorizedKeys: []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITestKey test@corral"},
	}
	vmsDir := filepath.Join(data, "vms")
	assertNoVM := func(name string) {
		t.Helper()
		if _, err := os.Stat(filepath.Join(vmsDir, name)); !os.IsNotExist(err) {
			t.Errorf("vm %s directory exists: %v", name, err)
		}
	}

	bad := map[string]struct {
		mut  func(*hypervisorv1.VM)
		want codes.Code
	}{
		"unknown volume": {func(v *hypervisorv1.VM) { v.Disks[0].Volume = "ghost" }, codes.NotFound},
		"traversal vol":  {func(v *hypervisorv1.VM) { v.Disks[0].Volume = "../../etc/passwd" }, codes.InvalidArgument},
		"traversal name": {func(v *hypervisorv1.VM) { v.Name = "../x" }, codes.InvalidArgument},
		"unapplied net":  {func(v *hypervisorv1.VM) { v.Nics[0].NetworkName = "nowhere" }, codes.NotFound},
		"bad address":    {func(v *hypervisorv1.VM) { v.Nics[0].Ipv4AddressCidr = "10.98.0.300/24" }, codes.InvalidArgument},
		"odd memory":     {func(v *hypervisorv1.VM) { v.MemoryBytes = 100 }, codes.InvalidArgument},
		"bad ssh key":    {func(v *hypervisorv1.VM) { v.SshAuthorizedKeys = []string{"x\ny"} }, codes.InvalidArgument},
		"bad login user": {func(v *hypervisorv1.VM) { v.LoginUsername = "Root User" }, codes.InvalidArgument},
		"no vm":          {func(v *hypervisorv1.VM) { *v = hypervisorv1.VM{} }, codes.InvalidArgument},
	}
	for name, tc := range bad {
		v := clone(vm1)
		tc.mut(v)
		if _, err := s.BootVM(ctx, &hypervisorv1.BootVMRequest{Vm: v}); code(err) != tc.want {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	assertNoVM("vm1")
	if links, _ := s.nets.Links(); len(links) != 1 {
		t.Errorf("links after refused boots: %+v", links)
	}

	start := time.Now()
	got, err := s.BootVM(ctx, &hypervisorv1.BootVMRequest{Vm: vm1})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("BENCH BootVM to QEMU running: %v", time.Since(start).Round(time.Millisecond))
	if got.GetState() != hypervisorv1.VMState_VM_STATE_RUNNING || got.GetLoginUsername() != "corral" || len(got.GetNics()) != 1 || !strings.HasPrefix(got.GetConsole(), "unix:") {
		t.Fatalf("booted %v", got)
	}
	// The seed carries the user, key and static address.
	seedISO, err := os.ReadFile(filepath.Join(vmsDir, "vm1", "seed.iso"))
	if err != nil {
		t.Fatal(err)
	}
	label, files, err := cloudinit.ReadISO(bytes.NewReader(seedISO))
	if err != nil || label != "cidata" {
		t.Fatalf("seed: %q %v", label, err)
	}
	for f, want := range map[string]string{"user-data": "name: corral", "network-config": "10.98.0.10/24", "meta-data": "instance-id: 3f2a6c1e"} {
		if !strings.Contains(string(files[f]), want) {
			t.Errorf("%s lacks %q:\n%s", f, want, files[f])
		}
	}
	if v, _ := s.vms.Get(ctx, "vm1"); len(v.Spec.Disks) != 2 || !v.Spec.Disks[1].CDROM {
		t.Errorf("ISO volume not attached as a CD-ROM: %+v", v.Spec.Disks)
	} else if cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", v.PID)); !bytes.Contains(cmdline, []byte("scsi-cd,bus=scsi0.0,drive=disk1")) {
		t.Errorf("qemu command line lacks the CD-ROM")
	}
	// Volume in use.
	vm2 := clone(vm1)
	vm2.Name, vm2.Nics = "vm2", nil
	if _, err := s.BootVM(ctx, &hypervisorv1.BootVMRequest{Vm: vm2}); code(err) != codes.FailedPrecondition {
		t.Errorf("second VM on root1: %v, want FailedPrecondition", err)
	}
	assertNoVM("vm2")
	if _, err := s.DeleteVolume(ctx, &hypervisorv1.VolumeRequest{Name: "root1"}); code(err) != codes.FailedPrecondition {
		t.Errorf("delete attached volume: %v", err)
	}
	if _, err := s.ResizeVolume(ctx, &hypervisorv1.ResizeVolumeRequest{Name: "root1", SizeBytes: 64 << 20}); code(err) != codes.FailedPrecondition {
		t.Errorf("resize volume of a running vm: %v", err)
	}
	if _, err := s.DeleteVolume(ctx, &hypervisorv1.VolumeRequest{Name: "base"}); code(err) != codes.FailedPrecondition {
		t.Errorf("delete backing volume: %v", err)
	}
	if _, err := s.DeleteNetwork(ctx, &hypervisorv1.DeleteNetworkRequest{Name: network}); code(err) != codes.FailedPrecondition {
		t.Errorf("delete network with a tap: %v", err)
	}

	// Agent restart: a new server over the same directory reports the VM.
	s2, err := NewServer(ctx, scfg)
	if err != nil {
		t.Fatal(err)
	}
	list, err := s2.ListVMs(ctx, &hypervisorv1.ListVMsRequest{})
	if err != nil || len(list.GetVms()) != 1 || list.GetVms()[0].GetState() != hypervisorv1.VMState_VM_STATE_RUNNING || list.GetVms()[0].GetNics()[0].GetIpv4AddressCidr() != "10.98.0.10/24" {
		t.Fatalf("after restart: %v %v", list, err)
	}
	// QEMU killed by hand: FAILED; Restore (next agent start) boots it.
	v, _ := s2.vms.Get(ctx, "vm1")
	syscall.Kill(v.PID, syscall.SIGKILL)
	deadline := time.Now().Add(10 * time.Second)
	for {
		g, _ := s2.GetVM(ctx, &hypervisorv1.VMRequest{Name: "vm1"})
		if g.GetState() == hypervisorv1.VMState_VM_STATE_FAILED {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("killed vm reported %v", g.GetState())
		}
		time.Sleep(100 * time.Millisecond)
	}
	s2.Restore(ctx)
	if g, _ := s2.GetVM(ctx, &hypervisorv1.VMRequest{Name: "vm1"}); g.GetState() != hypervisorv1.VMState_VM_STATE_RUNNING {
		t.Errorf("after Restore: %v", g.GetState())
	}
	// Shutdown (the firmware-only guest ignores ACPI: hard after 2 s).
	if g, err := s2.ShutdownVM(ctx, &hypervisorv1.VMRequest{Name: "vm1"}); err != nil || g.GetState() != hypervisorv1.VMState_VM_STATE_SHUTDOWN {
		t.Fatalf("shutdown: %v %v", g, err)
	}
	if _, err := s2.RebootVM(ctx, &hypervisorv1.VMRequest{Name: "vm1"}); code(err) != codes.FailedPrecondition {
		t.Errorf("reboot of a shut down vm: %v", err)
	}
	if v, err := s2.ResizeVolume(ctx, &hypervisorv1.ResizeVolumeRequest{Name: "root1", SizeBytes: 64 << 20}); err != nil || v.GetSizeBytes() != 64<<20 {
		t.Errorf("resize volume of a shut down vm: %v %v", v, err)
	}
	if g, err := s2.BootVM(ctx, &hypervisorv1.BootVMRequest{Vm: vm1}); err != nil || g.GetState() != hypervisorv1.VMState_VM_STATE_RUNNING {
		t.Fatalf("boot after shutdown: %v %v", g, err)
	}

	// Teardown: nothing left.
	if _, err := s2.DeleteVM(ctx, &hypervisorv1.VMRequest{Name: "vm1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s2.DeleteVM(ctx, &hypervisorv1.VMRequest{Name: "vm1"}); code(err) != codes.NotFound {
		t.Errorf("second delete: %v", err)
	}
	for _, vol := range []string{"root1", "base", "installer"} {
		if _, err := s2.DeleteVolume(ctx, &hypervisorv1.VolumeRequest{Name: vol}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s2.DeleteNetwork(ctx, &hypervisorv1.DeleteNetworkRequest{Name: network}); err != nil {
		t.Fatal(err)
	}
	if links, _ := s2.nets.Links(); len(links) != 0 {
		t.Errorf("links left: %+v", links)
	}
	for _, d := range []string{"vms", "volumes", "networks"} {
		es, _ := os.ReadDir(filepath.Join(data, d))
		var names []string
		for _, e := range es {
			names = append(names, e.Name())
		}
		if len(names) != 0 && !slices.Equal(names, []string{}) {
			t.Errorf("%s left: %v", d, names)
		}
	}
}
