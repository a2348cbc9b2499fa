package provider

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"

	fwprovider "github.com/hashicorp/terraform-plugin-framework/provider"
	"github.com/hashicorp/terraform-plugin-framework/providerserver"
	"github.com/hashicorp/terraform-plugin-go/tfprotov6"
	tfresource "github.com/hashicorp/terraform-plugin-testing/helper/resource"
	"github.com/hashicorp/terraform-plugin-testing/terraform"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/corralhq/corral/api/client"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	osimagev1 "github.com/corralhq/corral/api/osimage/v1"
)

// fakeMachines is a MachineService holding machines in memory: allocate
// takes the first READY one, deploy makes it DEPLOYED at once, release
// ends the allocation.
type fakeMachines struct {
	inventoryv1.UnimplementedMachineServiceServer
	mu       sync.Mutex
	machines map[string]*inventoryv1.Machine
	next     int
}

func (f *fakeMachines) GetMachine(_ context.Context, req *inventoryv1.GetMachineRequest) (*inventoryv1.Machine, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.machines[req.GetName()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "machine %q", req.GetName())
	}
	return proto.CloneOf(m), nil
}

func (f *fakeMachines) AllocateMachines(_ context.Context, req *inventoryv1.AllocateMachinesRequest) (*inventoryv1.AllocateMachinesResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, name := range []string{"m1", "m2"} {
		m := f.machines[name]
		if m.GetState() == inventoryv1.Machine_READY {
			f.next++
			m.State = inventoryv1.Machine_ALLOCATED
			m.Allocation = &inventoryv1.Allocation{AllocationId: fmt.Sprintf("a%d", f.next), Selector: req.GetSelector(), AllocatedAt: timestamppb.Now()}
			m.Deployment = nil
			return &inventoryv1.AllocateMachinesResponse{Machines: []*inventoryv1.Machine{proto.CloneOf(m)}}, nil
		}
	}
	return nil, status.Error(codes.ResourceExhausted, "no READY machine matches")
}

func (f *fakeMachines) DeployMachine(_ context.Context, req *inventoryv1.DeployMachineRequest) (*inventoryv1.Machine, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.machines[req.GetName()]
	if req.GetOsImage() != "debian-12" {
		return nil, status.Errorf(codes.FailedPrecondition, "OS image %q is not READY", req.GetOsImage())
	}
	m.State = inventoryv1.Machine_DEPLOYED
	m.Deployment = &inventoryv1.Deployment{OsImage: req.GetOsImage(), Address: "10.0.0.5/24"}
	return proto.CloneOf(m), nil
}

func (f *fakeMachines) ReleaseMachine(_ context.Context, req *inventoryv1.ReleaseMachineRequest) (*inventoryv1.Machine, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.machines[req.GetName()]
	if m.GetAllocation() == nil || m.GetAllocation().GetReleasedAt() != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "machine %q is not allocated", req.GetName())
	}
	m.State = inventoryv1.Machine_READY
	m.Allocation.ReleasedAt = timestamppb.Now()
	m.Allocation.ReleaseReason = req.GetReason() + " erase=" + req.GetErase().String()
	return proto.CloneOf(m), nil
}

func (f *fakeMachines) state(name string) inventoryv1.Machine_MachineState {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.machines[name].GetState()
}

// fakeProvider serves the fakes on loopback and returns a provider
// factory whose client reaches them.
func fakeProvider(t *testing.T, machines inventoryv1.MachineServiceServer, images osimagev1.OSImageServiceServer) func() (tfprotov6.ProviderServer, error) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	if machines != nil {
		inventoryv1.RegisterMachineServiceServer(srv, machines)
	}
	if images != nil {
		osimagev1.RegisterOSImageServiceServer(srv, images)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return func() (tfprotov6.ProviderServer, error) {
		p := &corralProvider{version: "test", open: func(providerModel) (*client.Client, error) {
			return &client.Client{Conn: conn, Machines: inventoryv1.NewMachineServiceClient(conn), OSImages: osimagev1.NewOSImageServiceClient(conn)}, nil
		}}
		return providerserver.NewProtocol6WithError(fwprovider.Provider(p))()
	}
}

// tofuForTests points terraform-plugin-testing at the repository's
// OpenTofu CLI (make tools); without it the test skips, or fails with
// CI=true.
func tofuForTests(t *testing.T) {
	t.Helper()
	p, err := filepath.Abs("../../../.bin/tofu")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("the OpenTofu CLI is missing at %s: run make tools", p)
		}
		t.Skipf("the OpenTofu CLI is missing at %s: run make tools", p)
	}
	t.Setenv("TF_ACC_TERRAFORM_PATH", p)
	t.Setenv("TF_ACC_PROVIDER_NAMESPACE", "hashicorp")
	t.Setenv("TF_ACC_PROVIDER_HOST", "registry.opentofu.org")
	t.Setenv("CHECKPOINT_DISABLE", "1")
}

// TestMachineResource runs corral_machine through the OpenTofu CLI against
// a fake MachineService: allocate and deploy, a release behind
// Terraform's back planned as a new machine, import by name, a refused
// deploy as one diagnostic, and destroy releasing with the erase asked.
func TestMachineResource(t *testing.T) {
	tofuForTests(t)
	fake := &fakeMachines{machines: map[string]*inventoryv1.Machine{
		"m1": {Name: "m1", State: inventoryv1.Machine_READY, BootMac: "52:54:00:00:00:01"},
		"m2": {Name: "m2", State: inventoryv1.Machine_READY, BootMac: "52:54:00:00:00:02"},
	}}
	factory := fakeProvider(t, fake, nil)
	config := func(image string) string {
		return fmt.Sprintf(`
provider "corral" {
  endpoint = "fake:1"
}
resource "corral_machine" "web" {
  selector = "zone=a"
  os_image = %q
  erase    = "QUICK"
}
`, image)
	}
	tfresource.UnitTest(t, tfresource.TestCase{
		ProtoV6ProviderFactories: map[string]func() (tfprotov6.ProviderServer, error){"corral": factory},
		Steps: []tfresource.TestStep{
			{
				Config: config("debian-12"),
				Check: tfresource.ComposeTestCheckFunc(
					tfresource.TestCheckResourceAttr("corral_machine.web", "name", "m1"),
					tfresource.TestCheckResourceAttr("corral_machine.web", "state", "DEPLOYED"),
					tfresource.TestCheckResourceAttr("corral_machine.web", "address", "10.0.0.5/24"),
					tfresource.TestCheckResourceAttr("corral_machine.web", "allocation_id", "a1"),
				),
			},
			{
				// Released behind Terraform's back: planned again.
				PreConfig: func() {
					if _, err := fake.ReleaseMachine(context.Background(), &inventoryv1.ReleaseMachineRequest{Name: "m1"}); err != nil {
						t.Fatal(err)
					}
				},
				Config:             config("debian-12"),
				PlanOnly:           true,
				ExpectNonEmptyPlan: true,
			},
			{
				// apply allocates again (m1, READY again).
				Config: config("debian-12"),
				Check:  tfresource.TestCheckResourceAttr("corral_machine.web", "allocation_id", "a2"),
			},
			{
				ResourceName:                         "corral_machine.web",
				ImportState:                          true,
				ImportStateId:                        "m1",
				ImportStateVerify:                    true,
				ImportStateVerifyIdentifierAttribute: "name",
				ImportStateVerifyIgnore:              []string{"selector", "erase"},
			},
			{
				// A deploy corrald refuses: the RPC, its code and the reason.
				Config:      config("no-such-image"),
				ExpectError: regexp.MustCompile(`DeployMachine m[12]: FailedPrecondition`),
			},
		},
		CheckDestroy: func(*terraform.State) error {
			for _, n := range []string{"m1", "m2"} {
				if s := fake.state(n); s != inventoryv1.Machine_READY {
					return fmt.Errorf("%s is %s after destroy, want READY", n, s)
				}
			}
			return nil
		},
	})
}
