package pool

import (
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/internal/watchstream"
	"google.golang.org/protobuf/proto"
)

// named is the watch of the pool's records stored as prefix+name (see
// watchstream.Named).
func named[T proto.Message](p *Pool, what, prefix, name string, from int64, lim *watchstream.Limiter, newT func() T, deleted func(string) T) watchstream.Config[T] {
	cfg := watchstream.Named(p.cfg.Store, what, prefix, name, newT, deleted)
	cfg.FromRevision, cfg.Limiter, cfg.Logger = from, lim, p.log
	return cfg
}

// WatchNodes streams nodes (the records ListNodes returns) as the
// corral.watch.v1 contract says.
func (s *nodeServer) WatchNodes(req *poolv1.WatchNodesRequest, stream poolv1.NodeService_WatchNodesServer) error {
	if req.GetName() != "" {
		if err := CheckName("node name", req.GetName()); err != nil {
			return toStatus(err)
		}
	}
	cfg := named(s.p, "nodes", nodePrefix, req.GetName(), req.GetFromRevision(), s.watchers, newNode,
		func(n string) *poolv1.Node { return &poolv1.Node{Name: n} })
	return toStatus(watchstream.Run(stream.Context(), cfg, func(ev watchstream.Event[*poolv1.Node]) error {
		return stream.Send(&poolv1.NodeEvent{Type: ev.Type, Revision: ev.Revision, Node: ev.Object})
	}))
}

// WatchNetworks streams networks (the records ListNetworks returns) as the
// corral.watch.v1 contract says.
func (s *networkServer) WatchNetworks(req *poolv1.WatchNetworksRequest, stream poolv1.NetworkService_WatchNetworksServer) error {
	if req.GetName() != "" {
		if err := CheckName("network name", req.GetName()); err != nil {
			return toStatus(err)
		}
	}
	cfg := named(s.p, "networks", networkPrefix, req.GetName(), req.GetFromRevision(), s.watchers, newNetwork,
		func(n string) *poolv1.Network { return &poolv1.Network{Name: n} })
	return toStatus(watchstream.Run(stream.Context(), cfg, func(ev watchstream.Event[*poolv1.Network]) error {
		return stream.Send(&poolv1.NetworkEvent{Type: ev.Type, Revision: ev.Revision, Network: ev.Object})
	}))
}
