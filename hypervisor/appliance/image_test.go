package appliance

import (
	"context"
	"testing"
	"time"

	deploymentv1 "github.com/corralhq/corral/api/deployment/v1"
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func TestImageLifecycle(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.mkBS(t, "deb12", "n1")
	e.mkBS(t, "other", "n1")
	if _, err := e.image.ApplyImage(ctx, &deploymentv1.ApplyImageRequest{Name: "debian", Labels: map[string]string{"os": "debian"}}); err != nil {
		t.Fatal(err)
	}
	_, err := e.image.RegisterBlockStorage(ctx, &deploymentv1.RegisterBlockStorageRequest{ImageName: "nope", BlockStorageName: "deb12"})
	wantCode(t, err, codes.NotFound, "nope")
	im, err := e.image.RegisterBlockStorage(ctx, &deploymentv1.RegisterBlockStorageRequest{ImageName: "debian", BlockStorageName: "deb12", Tags: []string{"latest", "12"}})
	if err != nil {
		t.Fatal(err)
	}
	want := &deploymentv1.Image{Name: "debian", Labels: map[string]string{"os": "debian"},
		RegisteredBlockStorages: []*deploymentv1.Image_RegisteredBlockStorage{{BlockStorageName: "deb12", RegisteredAt: timestamppb.New(t0)}},
		Tags:                    map[string]string{"latest": "deb12", "12": "deb12"}}
	if d := cmp.Diff(want, im, protocmp.Transform()); d != "" {
		t.Fatalf("registered (-want +got):\n%s", d)
	}
	if e.bsState(t, "deb12") != bsProtected {
		t.Fatalf("deb12 is %v", e.bsState(t, "deb12"))
	}
	_, err = e.bs.DeleteBlockStorage(ctx, &provisioningv1.DeleteBlockStorageRequest{Name: "deb12"})
	wantCode(t, err, codes.FailedPrecondition, "registered in image debian")
	_, err = e.vm.CreateVirtualMachine(ctx, vmReq("direct", "deb12"))
	wantCode(t, err, codes.FailedPrecondition, "PROTECTED")
	e.assertVMGone(t, "direct")

	_, err = e.image.TagImage(ctx, &deploymentv1.TagImageRequest{Name: "debian", Tag: "x", RegisteredBlockStorageName: "other"})
	wantCode(t, err, codes.NotFound, "not registered")
	if _, err := e.image.TagImage(ctx, &deploymentv1.TagImageRequest{Name: "debian", Tag: "stable", RegisteredBlockStorageName: "deb12"}); err != nil {
		t.Fatal(err)
	}
	if im, err := e.image.UntagImage(ctx, &deploymentv1.UntagImageRequest{Name: "debian", Tag: "12"}); err != nil || len(im.GetTags()) != 2 {
		t.Fatalf("untag = %v, %v", im, err)
	}
	_, err = e.image.UntagImage(ctx, &deploymentv1.UntagImageRequest{Name: "debian", Tag: "12"})
	wantCode(t, err, codes.NotFound, "no tag")

	// Generate: a copy-on-write overlay on the image's node.
	gen, err := e.image.GenerateBlockStorage(ctx, &deploymentv1.GenerateBlockStorageRequest{ImageName: "debian", Tag: "latest", BlockStorageName: "vm-root",
		RequestBytes: gib, LimitBytes: 4 * gib})
	if err != nil {
		t.Fatal(err)
	}
	if gen.GetNodeName() != "n1" || gen.GetState() != bsAvailable || e.nodes["n1"].Volume("vm-root").GetBackingFile() == "" {
		t.Fatalf("generated = %v (volume %v)", gen, e.nodes["n1"].Volume("vm-root"))
	}
	n1, _ := e.pool.GetNode(ctx, "n1")
	if _, ok := n1.GetReservedStorages()["vm-root"]; !ok {
		t.Fatal("no storage reserved for the generated volume")
	}
	_, err = e.image.GenerateBlockStorage(ctx, &deploymentv1.GenerateBlockStorageRequest{ImageName: "debian", Tag: "nope", BlockStorageName: "x"})
	wantCode(t, err, codes.NotFound, "no tag")
	if _, err := e.vm.CreateVirtualMachine(ctx, vmReq("from-image", "vm-root")); err != nil {
		t.Fatalf("VM on a generated volume: %v", err)
	}

	// Unregister drops its tags and sets it AVAILABLE (it still backs
	// vm-root, so it is not attachable).
	im, err = e.image.UnregisterBlockStorage(ctx, &deploymentv1.UnregisterBlockStorageRequest{ImageName: "debian", BlockStorageName: "deb12"})
	if err != nil || len(im.GetTags()) != 0 || len(im.GetRegisteredBlockStorages()) != 0 {
		t.Fatalf("unregister = %v, %v", im, err)
	}
	if e.bsState(t, "deb12") != bsAvailable {
		t.Fatalf("deb12 is %v", e.bsState(t, "deb12"))
	}
	_, err = e.image.UnregisterBlockStorage(ctx, &deploymentv1.UnregisterBlockStorageRequest{ImageName: "debian", BlockStorageName: "deb12"})
	wantCode(t, err, codes.NotFound, "not registered")

	// Delete sets registered storages AVAILABLE.
	if _, err := e.image.RegisterBlockStorage(ctx, &deploymentv1.RegisterBlockStorageRequest{ImageName: "debian", BlockStorageName: "other"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.image.DeleteImage(ctx, &deploymentv1.DeleteImageRequest{Name: "debian"}); err != nil {
		t.Fatal(err)
	}
	if e.bsState(t, "other") != bsAvailable {
		t.Fatalf("other is %v after image delete", e.bsState(t, "other"))
	}
	l, err := e.image.ListImages(ctx, &deploymentv1.ListImagesRequest{})
	if err != nil || len(l.GetImages()) != 0 {
		t.Fatalf("list = %v, %v", l, err)
	}
	_, err = e.image.GetImage(ctx, &deploymentv1.GetImageRequest{Name: "debian"})
	wantCode(t, err, codes.NotFound, "debian")
}

// A PROTECTED block storage no image lists (a crash between Register's two
// writes) is released by the reconciler after a grace period.
func TestReconcileOrphanProtected(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.mkBS(t, "orphan", "n1")
	if err := e.svc.protect(ctx, "orphan", "ghost"); err != nil {
		t.Fatal(err)
	}
	if err := e.svc.ReconcileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if e.bsState(t, "orphan") != bsProtected {
		t.Fatal("released within the grace period")
	}
	e.clock.Advance(2 * time.Minute)
	if err := e.svc.ReconcileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if e.bsState(t, "orphan") != bsAvailable {
		t.Fatalf("orphan is %v", e.bsState(t, "orphan"))
	}
}

// The same flow on the bolt store.
func TestOnBolt(t *testing.T) {
	e := newBoltEnv(t)
	ctx := context.Background()
	e.mkBS(t, "root", "n1")
	if _, err := e.vm.CreateVirtualMachine(ctx, vmReq("vm1", "root")); err != nil {
		t.Fatal(err)
	}
	e.nodes["n1"].FailOn("BootVM", errBoot)
	req := vmReq("vm2")
	req.Annotations = map[string]string{AnnotationVMRequestNode: "n1"}
	_, err := e.vm.CreateVirtualMachine(ctx, req)
	if err == nil {
		t.Fatal("vm2 booted on a failing node")
	}
	e.assertVMGone(t, "vm2")
	e.nodes["n1"].KillVM("vm1")
	if err := e.svc.ReconcileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if vm, _ := e.svc.GetVirtualMachine(ctx, "vm1"); vm.GetState() != vmShutdown {
		t.Fatalf("vm1 = %v", vm)
	}
	if _, err := e.vm.DeleteVirtualMachine(ctx, &provisioningv1.DeleteVirtualMachineRequest{Name: "vm1"}); err != nil {
		t.Fatal(err)
	}
	e.assertVMGone(t, "vm1")
}

// n0stack's idempotent usecase files soft-delete a volume and generate it
// again under the same name: the DELETED tombstone is purged first.
func TestRecreateOverDeletedTombstone(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.mkBS(t, "ubuntu-1804", "n1")
	if _, err := e.image.ApplyImage(ctx, &deploymentv1.ApplyImageRequest{Name: "cloudimage-ubuntu"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.image.RegisterBlockStorage(ctx, &deploymentv1.RegisterBlockStorageRequest{ImageName: "cloudimage-ubuntu", BlockStorageName: "ubuntu-1804", Tags: []string{"18.04"}}); err != nil {
		t.Fatal(err)
	}
	gen := &deploymentv1.GenerateBlockStorageRequest{ImageName: "cloudimage-ubuntu", Tag: "18.04", BlockStorageName: "test-blockstorage",
		Annotations: map[string]string{AnnotationBlockStorageRequestNode: "n1"}, RequestBytes: gib, LimitBytes: 10 * gib}
	for round := range 3 {
		if _, err := e.image.GenerateBlockStorage(ctx, gen); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if _, err := e.bs.DeleteBlockStorage(ctx, &provisioningv1.DeleteBlockStorageRequest{Name: "test-blockstorage"}); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
	// An AVAILABLE one is not replaced.
	if _, err := e.image.GenerateBlockStorage(ctx, gen); err != nil {
		t.Fatal(err)
	}
	_, err := e.image.GenerateBlockStorage(ctx, gen)
	wantCode(t, err, codes.AlreadyExists, "already exists")
	n1, _ := e.pool.GetNode(ctx, "n1")
	if len(n1.GetReservedStorages()) != 2 {
		t.Fatalf("reservations %v, want the image and one overlay", n1.GetReservedStorages())
	}
}

// With DeletedRetention the reconciler purges old tombstones.
func TestDeletedRetention(t *testing.T) {
	e := newEnv(t)
	e.svc.cfg.DeletedRetention = time.Hour
	ctx := context.Background()
	e.mkBS(t, "old", "n1")
	if _, err := e.bs.DeleteBlockStorage(ctx, &provisioningv1.DeleteBlockStorageRequest{Name: "old"}); err != nil {
		t.Fatal(err)
	}
	if err := e.svc.ReconcileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if e.bsState(t, "old") != bsDeleted {
		t.Fatal("purged before the retention passed")
	}
	e.clock.Advance(time.Hour)
	if err := e.svc.ReconcileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	e.assertBSGone(t, "old")
}
