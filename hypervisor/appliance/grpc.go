package appliance

import (
	"context"

	deploymentv1 "github.com/corralhq/corral/api/deployment/v1"
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/internal/paging"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"
)

// Register registers the BlockStorageService, VirtualMachineService and
// ImageService of svc on s. Errors leave the services as gRPC statuses
// made by apierr.ToStatus, here and nowhere else.
func Register(s grpc.ServiceRegistrar, svc *Services) {
	provisioningv1.RegisterBlockStorageServiceServer(s, &bsServer{s: svc})
	provisioningv1.RegisterVirtualMachineServiceServer(s, &vmServer{s: svc})
	deploymentv1.RegisterImageServiceServer(s, &imageServer{s: svc})
}

// answer is the services' edge: the one call of apierr.ToStatus.
func answer[T any](v T, err error) (T, error) {
	if err != nil {
		var zero T
		return zero, apierr.ToStatus(err)
	}
	return v, nil
}

// empty is answer for the methods that return nothing.
func empty(err error) (*emptypb.Empty, error) { return answer(&emptypb.Empty{}, err) }

type bsServer struct {
	provisioningv1.UnimplementedBlockStorageServiceServer
	s *Services
}

func (b *bsServer) CreateBlockStorage(ctx context.Context, req *provisioningv1.CreateBlockStorageRequest) (*provisioningv1.BlockStorage, error) {
	return answer(b.s.CreateBlockStorage(ctx, req))
}

func (b *bsServer) FetchBlockStorage(ctx context.Context, req *provisioningv1.FetchBlockStorageRequest) (*provisioningv1.BlockStorage, error) {
	return answer(b.s.FetchBlockStorage(ctx, req))
}

func (b *bsServer) CopyBlockStorage(ctx context.Context, req *provisioningv1.CopyBlockStorageRequest) (*provisioningv1.BlockStorage, error) {
	return answer(b.s.CopyBlockStorage(ctx, req))
}

func (b *bsServer) ListBlockStorages(ctx context.Context, req *provisioningv1.ListBlockStoragesRequest) (*provisioningv1.ListBlockStoragesResponse, error) {
	l, err := b.s.ListBlockStorages(ctx)
	if err != nil {
		return answer[*provisioningv1.ListBlockStoragesResponse](nil, err)
	}
	paging.SortByKey(l, (*provisioningv1.BlockStorage).GetName)
	page, next, err := paging.Slice(l, (*provisioningv1.BlockStorage).GetName, req.GetPageSize(), req.GetPageToken(), paging.Fingerprint())
	return answer(&provisioningv1.ListBlockStoragesResponse{BlockStorages: page, NextPageToken: next}, err)
}

func (b *bsServer) GetBlockStorage(ctx context.Context, req *provisioningv1.GetBlockStorageRequest) (*provisioningv1.BlockStorage, error) {
	return answer(b.s.GetBlockStorage(ctx, req.GetName()))
}

func (b *bsServer) UpdateBlockStorage(ctx context.Context, req *provisioningv1.UpdateBlockStorageRequest) (*provisioningv1.BlockStorage, error) {
	return answer(b.s.UpdateBlockStorage(ctx, req))
}

func (b *bsServer) DeleteBlockStorage(ctx context.Context, req *provisioningv1.DeleteBlockStorageRequest) (*provisioningv1.BlockStorage, error) {
	return answer(b.s.DeleteBlockStorage(ctx, req.GetName()))
}

func (b *bsServer) UndeleteBlockStorage(ctx context.Context, req *provisioningv1.UndeleteBlockStorageRequest) (*provisioningv1.BlockStorage, error) {
	return answer(b.s.UndeleteBlockStorage(ctx, req.GetName()))
}

func (b *bsServer) PurgeBlockStorage(ctx context.Context, req *provisioningv1.PurgeBlockStorageRequest) (*emptypb.Empty, error) {
	return empty(b.s.PurgeBlockStorage(ctx, req.GetName()))
}

func (b *bsServer) DownloadBlockStorage(ctx context.Context, req *provisioningv1.DownloadBlockStorageRequest) (*provisioningv1.DownloadBlockStorageResponse, error) {
	u, err := b.s.DownloadBlockStorage(ctx, req.GetName())
	return answer(&provisioningv1.DownloadBlockStorageResponse{DownloadUrl: u}, err)
}

type vmServer struct {
	provisioningv1.UnimplementedVirtualMachineServiceServer
	s *Services
}

func (v *vmServer) CreateVirtualMachine(ctx context.Context, req *provisioningv1.CreateVirtualMachineRequest) (*provisioningv1.VirtualMachine, error) {
	return answer(v.s.CreateVirtualMachine(ctx, req))
}

func (v *vmServer) ListVirtualMachines(ctx context.Context, req *provisioningv1.ListVirtualMachinesRequest) (*provisioningv1.ListVirtualMachinesResponse, error) {
	l, err := v.s.ListVirtualMachines(ctx)
	if err != nil {
		return answer[*provisioningv1.ListVirtualMachinesResponse](nil, err)
	}
	paging.SortByKey(l, (*provisioningv1.VirtualMachine).GetName)
	page, next, err := paging.Slice(l, (*provisioningv1.VirtualMachine).GetName, req.GetPageSize(), req.GetPageToken(), paging.Fingerprint())
	return answer(&provisioningv1.ListVirtualMachinesResponse{VirtualMachines: page, NextPageToken: next}, err)
}

func (v *vmServer) GetVirtualMachine(ctx context.Context, req *provisioningv1.GetVirtualMachineRequest) (*provisioningv1.VirtualMachine, error) {
	return answer(v.s.GetVirtualMachine(ctx, req.GetName()))
}

func (v *vmServer) UpdateVirtualMachine(ctx context.Context, req *provisioningv1.UpdateVirtualMachineRequest) (*provisioningv1.VirtualMachine, error) {
	return answer(v.s.UpdateVirtualMachine(ctx, req))
}

func (v *vmServer) DeleteVirtualMachine(ctx context.Context, req *provisioningv1.DeleteVirtualMachineRequest) (*emptypb.Empty, error) {
	return empty(v.s.DeleteVirtualMachine(ctx, req.GetName()))
}

func (v *vmServer) BootVirtualMachine(ctx context.Context, req *provisioningv1.BootVirtualMachineRequest) (*provisioningv1.VirtualMachine, error) {
	return answer(v.s.BootVirtualMachine(ctx, req.GetName()))
}

func (v *vmServer) RebootVirtualMachine(ctx context.Context, req *provisioningv1.RebootVirtualMachineRequest) (*provisioningv1.VirtualMachine, error) {
	return answer(v.s.RebootVirtualMachine(ctx, req.GetName(), req.GetHard()))
}

func (v *vmServer) ShutdownVirtualMachine(ctx context.Context, req *provisioningv1.ShutdownVirtualMachineRequest) (*provisioningv1.VirtualMachine, error) {
	return answer(v.s.ShutdownVirtualMachine(ctx, req.GetName(), req.GetHard()))
}

func (v *vmServer) OpenConsole(ctx context.Context, req *provisioningv1.OpenConsoleRequest) (*provisioningv1.OpenConsoleResponse, error) {
	u, err := v.s.OpenConsole(ctx, req.GetName())
	return answer(&provisioningv1.OpenConsoleResponse{ConsoleUrl: u}, err)
}

type imageServer struct {
	deploymentv1.UnimplementedImageServiceServer
	s *Services
}

func (i *imageServer) ListImages(ctx context.Context, req *deploymentv1.ListImagesRequest) (*deploymentv1.ListImagesResponse, error) {
	l, err := i.s.ListImages(ctx)
	if err != nil {
		return answer[*deploymentv1.ListImagesResponse](nil, err)
	}
	paging.SortByKey(l, (*deploymentv1.Image).GetName)
	page, next, err := paging.Slice(l, (*deploymentv1.Image).GetName, req.GetPageSize(), req.GetPageToken(), paging.Fingerprint())
	return answer(&deploymentv1.ListImagesResponse{Images: page, NextPageToken: next}, err)
}

func (i *imageServer) GetImage(ctx context.Context, req *deploymentv1.GetImageRequest) (*deploymentv1.Image, error) {
	return answer(i.s.GetImage(ctx, req.GetName()))
}

func (i *imageServer) ApplyImage(ctx context.Context, req *deploymentv1.ApplyImageRequest) (*deploymentv1.Image, error) {
	return answer(i.s.ApplyImage(ctx, req))
}

func (i *imageServer) DeleteImage(ctx context.Context, req *deploymentv1.DeleteImageRequest) (*emptypb.Empty, error) {
	return empty(i.s.DeleteImage(ctx, req.GetName()))
}

func (i *imageServer) RegisterBlockStorage(ctx context.Context, req *deploymentv1.RegisterBlockStorageRequest) (*deploymentv1.Image, error) {
	return answer(i.s.RegisterBlockStorage(ctx, req))
}

func (i *imageServer) UnregisterBlockStorage(ctx context.Context, req *deploymentv1.UnregisterBlockStorageRequest) (*deploymentv1.Image, error) {
	return answer(i.s.UnregisterBlockStorage(ctx, req))
}

func (i *imageServer) GenerateBlockStorage(ctx context.Context, req *deploymentv1.GenerateBlockStorageRequest) (*provisioningv1.BlockStorage, error) {
	return answer(i.s.GenerateBlockStorage(ctx, req))
}

func (i *imageServer) TagImage(ctx context.Context, req *deploymentv1.TagImageRequest) (*deploymentv1.Image, error) {
	return answer(i.s.TagImage(ctx, req))
}

func (i *imageServer) UntagImage(ctx context.Context, req *deploymentv1.UntagImageRequest) (*deploymentv1.Image, error) {
	return answer(i.s.UntagImage(ctx, req))
}
