package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	osimagev1 "github.com/corralhq/corral/api/osimage/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
	"github.com/corralhq/corral/testsupport/hvlab"
	"github.com/corralhq/corral/testsupport/require"
)

// TestTofuProvider drives the Terraform/OpenTofu provider
// (terraform-provider-corral, built here with go build) with the OpenTofu
// CLI (.bin/tofu, built by make tools from tools/tofu) against corrald and
// a real corral-node: the provider is found through a CLI configuration's
// dev_overrides, with no tofu init and no registry. apply creates a
// network, a volume on the node, a VM on both and an OS image downloaded
// from the lab's web server, and allocates a machine of the pool (one
// registered and accepted into pool "tf" over gRPC: allocation needs no
// boot); a change made over gRPC behind tofu's back shows in
// `plan -detailed-exitcode` (exit 2) and the next apply puts it back (a
// machine released behind its back is allocated again); import adopts an
// object by name; destroy leaves the List RPCs empty and the machine
// READY in its pool, unallocated.
func TestTofuProvider(t *testing.T) {
	need(t)
	tofu, err := filepath.Abs("../../.bin/tofu")
	if err != nil {
		t.Fatal(err)
	}
	require.File(t, tofu, "the OpenTofu CLI (make tools builds it from tools/tofu)")
	start := time.Now()

	// The provider, built from its own module.
	pdir := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(pdir, "terraform-provider-corral"), ".")
	build.Dir = "../../terraform-provider-corral"
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build terraform-provider-corral: %v\n%s", err, out)
	}
	figure(t, "provider built in %v", time.Since(start).Round(time.Millisecond))

	// An OS image for corral_os_image, served by the lab's web server.
	raw := filepath.Join(t.TempDir(), "os.raw")
	img := bytes.Repeat([]byte("corral-os-image\n"), 65536) // 1 MiB
	if err := os.WriteFile(raw, img, 0o644); err != nil {
		t.Fatal(err)
	}
	l := hvlab.New(t, bins, hvlab.Options{Files: map[string]string{"os.raw": raw}})
	labReady := time.Now()

	work := t.TempDir()
	rc := filepath.Join(work, "dev.tfrc")
	if err := os.WriteFile(rc, fmt.Appendf(nil, `provider_installation {
  dev_overrides {
    "corralhq/corral" = %q
  }
  direct {}
}
`, pdir), 0o644); err != nil {
		t.Fatal(err)
	}
	tf := func(extra string) string {
		return fmt.Sprintf(`terraform {
  required_providers {
    corral = { source = "corralhq/corral" }
  }
}

provider "corral" {
  config_path = %q
}

resource "corral_network" "net" {
  name      = "tf-net"
  ipv4_cidr = "192.168.77.0/24"
  domain    = "tf.example"
  labels    = { team = "infra" }
}

resource "corral_block_storage" "disk" {
  name          = "tf-disk"
  node_name     = %q
  request_bytes = 67108864
  limit_bytes   = 134217728
  labels        = { role = "root" }
}

resource "corral_virtual_machine" "vm" {
  name                   = "tf-vm"
  request_cpu_milli_core = 100
  limit_cpu_milli_core   = 1000
  request_memory_bytes   = 67108864
  limit_memory_bytes     = 67108864
  block_storage_names    = [corral_block_storage.disk.name]
  nics                   = [{ network_name = corral_network.net.name, ipv4_address = "192.168.77.10" }]
  labels                 = { app = "web" }
}

resource "corral_os_image" "os" {
  name       = "tf-os"
  source_url = "%sos.raw"
  sha256     = "%x"
  format     = "RAW"
}

resource "corral_machine" "m" {
  pool  = "tf"
  erase = "NONE"
}

data "corral_nodes" "all" {}

data "corral_machines" "ready" {
  state = "READY"
}

output "nodes" {
  value = [for n in data.corral_nodes.all.nodes : "${n.name}=${n.state}"]
}
%s`, l.AdminConf, hvlab.NodeName, l.WebURL, sha256.Sum256(img), extra)
	}
	if err := os.WriteFile(filepath.Join(work, "main.tf"), []byte(tf("")), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(want int, args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		// Options follow the (sub)command: "state rm" takes no -input.
		n, flags := 1, []string{"-no-color", "-input=false"}
		if args[0] == "state" {
			n, flags = 2, flags[:1]
		}
		cmd := exec.CommandContext(ctx, tofu, append(append(slices.Clone(args[:n]), flags...), args[n:]...)...)
		cmd.Dir = work
		cmd.Env = append(os.Environ(), "TF_CLI_CONFIG_FILE="+rc, "TF_IN_AUTOMATION=1", "CHECKPOINT_DISABLE=1",
			"HOME="+work, "TF_DATA_DIR="+filepath.Join(work, ".tofu"))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		t0 := time.Now()
		err := cmd.Run()
		code := 0
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("tofu %s: %v", strings.Join(args, " "), err)
		}
		t.Logf("tofu %s: exit %d in %v", strings.Join(args, " "), code, time.Since(t0).Round(time.Millisecond))
		if code != want {
			t.Fatalf("tofu %s: exit %d, want %d\n%s\ncorrald:\n%s", strings.Join(args, " "), code, want, out.String(), l.ServerLogTail(3000))
		}
		return out.String()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	nets := poolv1.NewNetworkServiceClient(l.Conn)
	volumes := provisioningv1.NewBlockStorageServiceClient(l.Conn)
	vms := provisioningv1.NewVirtualMachineServiceClient(l.Conn)
	images := osimagev1.NewOSImageServiceClient(l.Conn)

	machines := inventoryv1.NewMachineServiceClient(l.Conn)

	// A machine of pool "tf": registered (as the agent would; agent tokens
	// come from the boot server only, an admin token may Register too),
	// accepted into the pool (READY, nothing installed).
	reg, err := nodev1.NewAgentServiceClient(l.Conn).Register(ctx, &nodev1.RegisterRequest{BootMac: "52:54:00:7f:00:01",
		Facts: &inventoryv1.Facts{System: &inventoryv1.Facts_System{Serial: "SN-TF-1", Uuid: "6f1c2a84-6c1c-4b0e-9d5b-5f1e0d3e7a01"}}})
	if err != nil {
		t.Fatalf("Register: %v", err)
	}
	mname := reg.GetMachineName()
	if _, err := machines.AcceptMachine(ctx, &inventoryv1.AcceptMachineRequest{Name: mname, Target: inventoryv1.AcceptTarget_ACCEPT_TARGET_POOL}); err != nil {
		t.Fatalf("AcceptMachine: %v", err)
	}
	if _, err := machines.LabelMachine(ctx, &inventoryv1.LabelMachineRequest{Name: mname, Set: map[string]string{"pool": "tf"}}); err != nil {
		t.Fatalf("LabelMachine: %v", err)
	}
	allocation := func() *inventoryv1.Machine {
		t.Helper()
		m, err := machines.GetMachine(ctx, &inventoryv1.GetMachineRequest{Name: mname})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}

	// Plan, then apply.
	out := run(2, "plan", "-detailed-exitcode")
	if !strings.Contains(out, "5 to add") {
		t.Fatalf("plan:\n%s", out)
	}
	out = run(0, "apply", "-auto-approve")
	if !strings.Contains(out, `"vm-host1=READY"`) {
		t.Errorf("corral_nodes output lacks the READY node:\n%s", out)
	}
	vm, err := vms.GetVirtualMachine(ctx, &provisioningv1.GetVirtualMachineRequest{Name: "tf-vm"})
	if err != nil || vm.GetState() != provisioningv1.VirtualMachine_RUNNING || vm.GetComputeNodeName() != hvlab.NodeName {
		t.Fatalf("tf-vm after apply: %v %v", vm, err)
	}
	if pids := l.QEMUPids("tf-vm"); len(pids) != 1 {
		t.Fatalf("QEMU of tf-vm on the node: %v, want one", pids)
	}
	if bs, err := volumes.GetBlockStorage(ctx, &provisioningv1.GetBlockStorageRequest{Name: "tf-disk"}); err != nil || bs.GetState() != provisioningv1.BlockStorage_IN_USE {
		t.Fatalf("tf-disk after apply: %v %v", bs, err)
	}
	if got, err := images.GetOSImage(ctx, &osimagev1.GetOSImageRequest{Name: "tf-os"}); err != nil || got.GetOsImage().GetState() != osimagev1.OSImageState_OS_IMAGE_STATE_READY {
		t.Fatalf("tf-os after apply: %v %v", got, err)
	}
	m := allocation()
	firstAlloc := m.GetAllocation().GetAllocationId()
	if m.GetState() != inventoryv1.Machine_ALLOCATED || firstAlloc == "" {
		t.Fatalf("%s after apply: state %v, allocation %v", mname, m.GetState(), m.GetAllocation())
	}
	run(0, "plan", "-detailed-exitcode") // nothing to do right after apply

	// The machine released behind tofu's back: its allocation is gone, so
	// the plan allocates again (exit 2), and apply does.
	if _, err := machines.ReleaseMachine(ctx, &inventoryv1.ReleaseMachineRequest{Name: mname, Reason: "behind tofu's back", Erase: inventoryv1.EraseLevel_ERASE_LEVEL_NONE}); err != nil {
		t.Fatalf("ReleaseMachine: %v", err)
	}
	out = run(2, "plan", "-detailed-exitcode")
	if !strings.Contains(out, "corral_machine.m will be created") || !strings.Contains(out, "1 to add") {
		t.Errorf("plan after the release behind tofu's back:\n%s", out)
	}
	run(0, "apply", "-auto-approve")
	if m := allocation(); m.GetState() != inventoryv1.Machine_ALLOCATED || m.GetAllocation().GetAllocationId() == firstAlloc {
		t.Errorf("%s after the second apply: state %v, allocation %v (first %s)", mname, m.GetState(), m.GetAllocation(), firstAlloc)
	}
	run(0, "plan", "-detailed-exitcode")

	// Changes behind tofu's back, over gRPC: the network's domain, the
	// volume's and the VM's labels. plan sees them (exit 2), apply puts
	// them back.
	n, err := nets.GetNetwork(ctx, &poolv1.GetNetworkRequest{Name: "tf-net"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nets.ApplyNetwork(ctx, &poolv1.ApplyNetworkRequest{Name: "tf-net", Ipv4Cidr: n.GetIpv4Cidr(), Domain: "changed.example", Labels: n.GetLabels()}); err != nil {
		t.Fatal(err)
	}
	if _, err := volumes.UpdateBlockStorage(ctx, &provisioningv1.UpdateBlockStorageRequest{Name: "tf-disk", Labels: map[string]string{"role": "scratch"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := vms.UpdateVirtualMachine(ctx, &provisioningv1.UpdateVirtualMachineRequest{Name: "tf-vm", Labels: map[string]string{"app": "db"}}); err != nil {
		t.Fatal(err)
	}
	out = run(2, "plan", "-detailed-exitcode")
	for _, want := range []string{`"changed.example" -> "tf.example"`, `"scratch" -> "root"`, `"db" -> "web"`, "3 to change"} {
		if !strings.Contains(out, want) {
			t.Errorf("drift plan lacks %q:\n%s", want, out)
		}
	}
	run(0, "apply", "-auto-approve")
	if n, err := nets.GetNetwork(ctx, &poolv1.GetNetworkRequest{Name: "tf-net"}); err != nil || n.GetDomain() != "tf.example" {
		t.Errorf("tf-net after the corrective apply: %v %v", n, err)
	}
	run(0, "plan", "-detailed-exitcode")

	// Import: forget the network, adopt it again by name; nothing to do.
	run(0, "state", "rm", "corral_network.net")
	run(0, "import", "corral_network.net", "tf-net")
	run(0, "plan", "-detailed-exitcode")

	// A corrald error is one clear diagnostic: shrinking is refused.
	if err := os.WriteFile(filepath.Join(work, "main.tf"), []byte(strings.Replace(tf(""), "limit_bytes   = 134217728", "limit_bytes   = 67108864", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	out = strings.Join(strings.Fields(run(1, "apply", "-auto-approve")), " ") // tofu wraps lines
	if !strings.Contains(out, "UpdateBlockStorage tf-disk: InvalidArgument") || !strings.Contains(out, "shrinking a volume is not supported") {
		t.Errorf("refused shrink: want the RPC, its code and corrald's reason:\n%s", out)
	}
	if err := os.WriteFile(filepath.Join(work, "main.tf"), []byte(tf("")), 0o644); err != nil {
		t.Fatal(err)
	}

	// Destroy leaves nothing.
	run(0, "destroy", "-auto-approve")
	ln, err := nets.ListNetworks(ctx, &poolv1.ListNetworksRequest{})
	if err != nil || len(ln.GetNetworks()) != 0 {
		t.Errorf("networks after destroy: %v %v", ln.GetNetworks(), err)
	}
	lb, err := volumes.ListBlockStorages(ctx, &provisioningv1.ListBlockStoragesRequest{})
	if err != nil || len(lb.GetBlockStorages()) != 0 {
		t.Errorf("block storages after destroy: %v %v", lb.GetBlockStorages(), err)
	}
	lv, err := vms.ListVirtualMachines(ctx, &provisioningv1.ListVirtualMachinesRequest{})
	if err != nil || len(lv.GetVirtualMachines()) != 0 {
		t.Errorf("virtual machines after destroy: %v %v", lv.GetVirtualMachines(), err)
	}
	li, err := images.ListOSImages(ctx, &osimagev1.ListOSImagesRequest{})
	if err != nil || len(li.GetOsImages()) != 0 {
		t.Errorf("OS images after destroy: %v %v", li.GetOsImages(), err)
	}
	if pids := l.QEMUPids("tf-vm"); len(pids) > 0 {
		t.Errorf("QEMU of tf-vm still running: %v", pids)
	}
	if m := allocation(); m.GetState() != inventoryv1.Machine_READY || (m.GetAllocation() != nil && m.GetAllocation().GetReleasedAt() == nil) {
		t.Errorf("%s after destroy: state %v, allocation %v; want READY and released", mname, m.GetState(), m.GetAllocation())
	}
	figure(t, "tofu plan/apply/drift/import/destroy against corrald and a node: %v (lab up in %v)",
		time.Since(labReady).Round(time.Millisecond), labReady.Sub(start).Round(time.Millisecond))
}
