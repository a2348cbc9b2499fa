package provider

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/terraform-plugin-go/tfprotov6"
	tfresource "github.com/hashicorp/terraform-plugin-testing/helper/resource"
	"github.com/hashicorp/terraform-plugin-testing/terraform"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	osimagev1 "github.com/corralhq/corral/api/osimage/v1"
)

// fakeImages is an OSImageService in memory: a registered image is
// DOWNLOADING, and READY (or FAILED when its sha256 starts with "bad") at
// the next Get.
type fakeImages struct {
	osimagev1.UnimplementedOSImageServiceServer
	mu     sync.Mutex
	images map[string]*osimagev1.OSImage
}

func (f *fakeImages) RegisterOSImage(_ context.Context, req *osimagev1.RegisterOSImageRequest) (*osimagev1.RegisterOSImageResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.images[req.GetName()]; ok {
		return nil, status.Errorf(codes.AlreadyExists, "OS image %q exists", req.GetName())
	}
	img := &osimagev1.OSImage{Name: req.GetName(), Labels: req.GetLabels(), SourceUrl: req.GetSourceUrl(), Sha256: req.GetSha256(),
		Format: req.GetFormat(), State: osimagev1.OSImageState_OS_IMAGE_STATE_DOWNLOADING}
	f.images[img.Name] = img
	return &osimagev1.RegisterOSImageResponse{OsImage: proto.CloneOf(img)}, nil
}

func (f *fakeImages) GetOSImage(_ context.Context, req *osimagev1.GetOSImageRequest) (*osimagev1.GetOSImageResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	img, ok := f.images[req.GetName()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "OS image %q", req.GetName())
	}
	if img.State == osimagev1.OSImageState_OS_IMAGE_STATE_DOWNLOADING {
		if strings.HasPrefix(img.Sha256, "bad") {
			img.State, img.Reason = osimagev1.OSImageState_OS_IMAGE_STATE_FAILED, "sha256 mismatch"
		} else {
			img.State, img.SizeBytes, img.VirtualSizeBytes = osimagev1.OSImageState_OS_IMAGE_STATE_READY, 1000, 4096
		}
	}
	return &osimagev1.GetOSImageResponse{OsImage: proto.CloneOf(img)}, nil
}

func (f *fakeImages) DeleteOSImage(_ context.Context, req *osimagev1.DeleteOSImageRequest) (*osimagev1.DeleteOSImageResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.images[req.GetName()]; !ok {
		return nil, status.Errorf(codes.NotFound, "OS image %q", req.GetName())
	}
	delete(f.images, req.GetName())
	return &osimagev1.DeleteOSImageResponse{}, nil
}

// TestOSImageResource runs corral_os_image through the OpenTofu CLI
// against a fake OSImageService: register and wait for READY, a delete
// behind Terraform's back planned again, import, a failed download as an
// error, destroy leaving nothing.
func TestOSImageResource(t *testing.T) {
	tofuForTests(t)
	fake := &fakeImages{images: map[string]*osimagev1.OSImage{}}
	config := func(sha string) string {
		return fmt.Sprintf(`
provider "corral" {
  endpoint = "fake:1"
}
resource "corral_os_image" "debian" {
  name       = "debian-12"
  source_url = "http://images.example/debian-12.raw"
  sha256     = %q
  format     = "RAW"
}
`, sha)
	}
	good := strings.Repeat("ab", 32)
	tfresource.UnitTest(t, tfresource.TestCase{
		ProtoV6ProviderFactories: map[string]func() (tfprotov6.ProviderServer, error){"corral": fakeProvider(t, nil, fake)},
		Steps: []tfresource.TestStep{
			{
				Config: config(good),
				Check: tfresource.ComposeTestCheckFunc(
					tfresource.TestCheckResourceAttr("corral_os_image.debian", "state", "READY"),
					tfresource.TestCheckResourceAttr("corral_os_image.debian", "virtual_size_bytes", "4096"),
				),
			},
			{
				PreConfig: func() {
					if _, err := fake.DeleteOSImage(context.Background(), &osimagev1.DeleteOSImageRequest{Name: "debian-12"}); err != nil {
						t.Fatal(err)
					}
				},
				Config:             config(good),
				PlanOnly:           true,
				ExpectNonEmptyPlan: true,
			},
			{Config: config(good)},
			{
				ResourceName:                         "corral_os_image.debian",
				ImportState:                          true,
				ImportStateId:                        "debian-12",
				ImportStateVerify:                    true,
				ImportStateVerifyIdentifierAttribute: "name",
			},
			{
				Config:      config("bad" + good[3:]),
				ExpectError: regexp.MustCompile(`OS image debian-12 FAILED`),
			},
		},
		CheckDestroy: func(*terraform.State) error {
			fake.mu.Lock()
			defer fake.mu.Unlock()
			if len(fake.images) != 0 {
				return fmt.Errorf("images after destroy: %v", fake.images)
			}
			return nil
		},
	})
}
