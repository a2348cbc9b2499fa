package pool

import (
	"context"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/internal/paging"
	"github.com/corralhq/corral/internal/watchstream"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"
)

// Register registers the NodeService and NetworkService of p on s.
func Register(s grpc.ServiceRegistrar, p *Pool) {
	poolv1.RegisterNodeServiceServer(s, &nodeServer{p: p})
	poolv1.RegisterNetworkServiceServer(s, &networkServer{p: p})
}

type nodeServer struct {
	poolv1.UnimplementedNodeServiceServer
	p        *Pool
	watchers *watchstream.Limiter // nil: watchstream.Default
}

// ListNodes answers one page of the nodes, in name order.
func (s *nodeServer) ListNodes(ctx context.Context, req *poolv1.ListNodesRequest) (*poolv1.ListNodesResponse, error) {
	nodes, err := s.p.ListNodes(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	paging.SortByKey(nodes, (*poolv1.Node).GetName)
	page, next, err := paging.Slice(nodes, (*poolv1.Node).GetName, req.GetPageSize(), req.GetPageToken(), paging.Fingerprint())
	if err != nil {
		return nil, toStatus(err)
	}
	return &poolv1.ListNodesResponse{Nodes: page, NextPageToken: next}, nil
}

func (s *nodeServer) GetNode(ctx context.Context, req *poolv1.GetNodeRequest) (*poolv1.Node, error) {
	n, err := s.p.GetNode(ctx, req.GetName())
	if err != nil {
		return nil, toStatus(err)
	}
	return n, nil
}

func (s *nodeServer) ApplyNode(ctx context.Context, req *poolv1.ApplyNodeRequest) (*poolv1.Node, error) {
	n, err := s.p.ApplyNode(ctx, req)
	if err != nil {
		return nil, toStatus(err)
	}
	return n, nil
}

func (s *nodeServer) DeleteNode(ctx context.Context, req *poolv1.DeleteNodeRequest) (*emptypb.Empty, error) {
	if err := s.p.DeleteNode(ctx, req.GetName()); err != nil {
		return nil, toStatus(err)
	}
	return &emptypb.Empty{}, nil
}

func (s *nodeServer) ScheduleCompute(ctx context.Context, req *poolv1.ScheduleComputeRequest) (*poolv1.Node, error) {
	n, err := s.p.ScheduleCompute(ctx, req.GetComputeName(), &poolv1.Compute{
		Annotations:         req.GetAnnotations(),
		RequestCpuMilliCore: req.GetRequestCpuMilliCore(),
		LimitCpuMilliCore:   req.GetLimitCpuMilliCore(),
		RequestMemoryBytes:  req.GetRequestMemoryBytes(),
		LimitMemoryBytes:    req.GetLimitMemoryBytes(),
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return n, nil
}

func (s *nodeServer) ReserveCompute(ctx context.Context, req *poolv1.ReserveComputeRequest) (*poolv1.Node, error) {
	n, err := s.p.ReserveCompute(ctx, req.GetNodeName(), req.GetComputeName(), &poolv1.Compute{
		Annotations:         req.GetAnnotations(),
		RequestCpuMilliCore: req.GetRequestCpuMilliCore(),
		LimitCpuMilliCore:   req.GetLimitCpuMilliCore(),
		RequestMemoryBytes:  req.GetRequestMemoryBytes(),
		LimitMemoryBytes:    req.GetLimitMemoryBytes(),
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return n, nil
}

func (s *nodeServer) ReleaseCompute(ctx context.Context, req *poolv1.ReleaseComputeRequest) (*emptypb.Empty, error) {
	if err := s.p.ReleaseCompute(ctx, req.GetNodeName(), req.GetComputeName()); err != nil {
		return nil, toStatus(err)
	}
	return &emptypb.Empty{}, nil
}

func (s *nodeServer) ScheduleStorage(ctx context.Context, req *poolv1.ScheduleStorageRequest) (*poolv1.Node, error) {
	n, err := s.p.ScheduleStorage(ctx, req.GetStorageName(), &poolv1.Storage{
		Annotations:  req.GetAnnotations(),
		RequestBytes: req.GetRequestBytes(),
		LimitBytes:   req.GetLimitBytes(),
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return n, nil
}

func (s *nodeServer) ReserveStorage(ctx context.Context, req *poolv1.ReserveStorageRequest) (*poolv1.Node, error) {
	n, err := s.p.ReserveStorage(ctx, req.GetNodeName(), req.GetStorageName(), &poolv1.Storage{
		Annotations:  req.GetAnnotations(),
		RequestBytes: req.GetRequestBytes(),
		LimitBytes:   req.GetLimitBytes(),
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return n, nil
}

func (s *nodeServer) ReleaseStorage(ctx context.Context, req *poolv1.ReleaseStorageRequest) (*emptypb.Empty, error) {
	if err := s.p.ReleaseStorage(ctx, req.GetNodeName(), req.GetStorageName()); err != nil {
		return nil, toStatus(err)
	}
	return &emptypb.Empty{}, nil
}

type networkServer struct {
	poolv1.UnimplementedNetworkServiceServer
	p        *Pool
	watchers *watchstream.Limiter // nil: watchstream.Default
}

// ListNetworks answers one page of the networks, in name order.
func (s *networkServer) ListNetworks(ctx context.Context, req *poolv1.ListNetworksRequest) (*poolv1.ListNetworksResponse, error) {
	nets, err := s.p.ListNetworks(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	paging.SortByKey(nets, (*poolv1.Network).GetName)
	page, next, err := paging.Slice(nets, (*poolv1.Network).GetName, req.GetPageSize(), req.GetPageToken(), paging.Fingerprint())
	if err != nil {
		return nil, toStatus(err)
	}
	return &poolv1.ListNetworksResponse{Networks: page, NextPageToken: next}, nil
}

func (s *networkServer) GetNetwork(ctx context.Context, req *poolv1.GetNetworkRequest) (*poolv1.Network, error) {
	n, err := s.p.GetNetwork(ctx, req.GetName())
	if err != nil {
		return nil, toStatus(err)
	}
	return n, nil
}

func (s *networkServer) ApplyNetwork(ctx context.Context, req *poolv1.ApplyNetworkRequest) (*poolv1.Network, error) {
	n, err := s.p.ApplyNetwork(ctx, req)
	if err != nil {
		return nil, toStatus(err)
	}
	return n, nil
}

func (s *networkServer) DeleteNetwork(ctx context.Context, req *poolv1.DeleteNetworkRequest) (*emptypb.Empty, error) {
	if err := s.p.DeleteNetwork(ctx, req.GetName()); err != nil {
		return nil, toStatus(err)
	}
	return &emptypb.Empty{}, nil
}

func (s *networkServer) ReserveNetworkInterface(ctx context.Context, req *poolv1.ReserveNetworkInterfaceRequest) (*poolv1.Network, error) {
	n, err := s.p.ReserveNetworkInterface(ctx, req)
	if err != nil {
		return nil, toStatus(err)
	}
	return n, nil
}

func (s *networkServer) ReleaseNetworkInterface(ctx context.Context, req *poolv1.ReleaseNetworkInterfaceRequest) (*emptypb.Empty, error) {
	if err := s.p.ReleaseNetworkInterface(ctx, req.GetNetworkName(), req.GetNetworkInterfaceName()); err != nil {
		return nil, toStatus(err)
	}
	return &emptypb.Empty{}, nil
}
