package appliance

import (
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/internal/watchstream"
	"google.golang.org/protobuf/proto"
)

// watchNamed is the watch of protobuf records stored as prefix+name: all
// of them, or the one called name. deleted makes the object sent for a
// deleted record from its name.
func watchNamed[T proto.Message](s *Services, what, prefix, name string, from int64, newT func() T, deleted func(string) T) (watchstream.Config[T], error) {
	if name != "" {
		if err := checkName("name", name); err != nil {
			return watchstream.Config[T]{}, err
		}
	}
	cfg := watchstream.Named(s.cfg.Store, what, prefix, name, newT, deleted)
	cfg.FromRevision, cfg.Logger = from, s.log
	return cfg, nil
}

// WatchBlockStorages streams block storages (the records
// ListBlockStorages returns) as the corral.watch.v1 contract says.
func (b *bsServer) WatchBlockStorages(req *provisioningv1.WatchBlockStoragesRequest, stream provisioningv1.BlockStorageService_WatchBlockStoragesServer) error {
	cfg, err := watchNamed(b.s, "block storages", bsPrefix, req.GetName(), req.GetFromRevision(), newBS,
		func(n string) *provisioningv1.BlockStorage { return &provisioningv1.BlockStorage{Name: n} })
	if err == nil {
		err = watchstream.Run(stream.Context(), cfg, func(ev watchstream.Event[*provisioningv1.BlockStorage]) error {
			return stream.Send(&provisioningv1.BlockStorageEvent{Type: ev.Type, Revision: ev.Revision, BlockStorage: ev.Object})
		})
	}
	return apierr.ToStatus(err)
}

// WatchVirtualMachines streams virtual machines (the records
// ListVirtualMachines returns) as the corral.watch.v1 contract says.
func (v *vmServer) WatchVirtualMachines(req *provisioningv1.WatchVirtualMachinesRequest, stream provisioningv1.VirtualMachineService_WatchVirtualMachinesServer) error {
	cfg, err := watchNamed(v.s, "virtual machines", vmPrefix, req.GetName(), req.GetFromRevision(), newVM,
		func(n string) *provisioningv1.VirtualMachine { return &provisioningv1.VirtualMachine{Name: n} })
	if err == nil {
		err = watchstream.Run(stream.Context(), cfg, func(ev watchstream.Event[*provisioningv1.VirtualMachine]) error {
			return stream.Send(&provisioningv1.VirtualMachineEvent{Type: ev.Type, Revision: ev.Revision, VirtualMachine: ev.Object})
		})
	}
	return apierr.ToStatus(err)
}
