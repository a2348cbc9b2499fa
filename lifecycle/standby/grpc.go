package standby

import (
	"context"

	"google.golang.org/grpc"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/internal/paging"
)

// server is StandbyPoolService: the gRPC edge of a Service. Errors become
// status codes here only (apierr.ToStatus).
type server struct {
	inventoryv1.UnimplementedStandbyPoolServiceServer
	s *Service
}

// Register serves s as StandbyPoolService on r.
func Register(r grpc.ServiceRegistrar, s *Service) {
	inventoryv1.RegisterStandbyPoolServiceServer(r, &server{s: s})
}

func (e *server) ApplyStandbyPool(ctx context.Context, req *inventoryv1.ApplyStandbyPoolRequest) (*inventoryv1.ApplyStandbyPoolResponse, error) {
	p, err := e.s.Apply(ctx, req.GetPool())
	if err != nil {
		return nil, apierr.ToStatus(err)
	}
	return &inventoryv1.ApplyStandbyPoolResponse{Pool: p}, nil
}

func (e *server) GetStandbyPool(ctx context.Context, req *inventoryv1.GetStandbyPoolRequest) (*inventoryv1.GetStandbyPoolResponse, error) {
	p, err := e.s.Get(ctx, req.GetName())
	if err != nil {
		return nil, apierr.ToStatus(err)
	}
	return &inventoryv1.GetStandbyPoolResponse{Pool: p}, nil
}

func (e *server) ListStandbyPools(ctx context.Context, req *inventoryv1.ListStandbyPoolsRequest) (*inventoryv1.ListStandbyPoolsResponse, error) {
	l, err := e.s.List(ctx)
	if err != nil {
		return nil, apierr.ToStatus(err)
	}
	paging.SortByKey(l, (*inventoryv1.StandbyPool).GetName)
	page, next, err := paging.Slice(l, (*inventoryv1.StandbyPool).GetName, req.GetPageSize(), req.GetPageToken(), paging.Fingerprint())
	if err != nil {
		return nil, apierr.ToStatus(err)
	}
	return &inventoryv1.ListStandbyPoolsResponse{Pools: page, NextPageToken: next}, nil
}

func (e *server) DeleteStandbyPool(ctx context.Context, req *inventoryv1.DeleteStandbyPoolRequest) (*inventoryv1.DeleteStandbyPoolResponse, error) {
	if err := e.s.Delete(ctx, req.GetName()); err != nil {
		return nil, apierr.ToStatus(err)
	}
	return &inventoryv1.DeleteStandbyPoolResponse{}, nil
}
