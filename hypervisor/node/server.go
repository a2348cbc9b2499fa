package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	hypervisorv1 "github.com/corralhq/corral/api/hypervisor/v1"
	"github.com/corralhq/corral/hypervisor/cloudinit"
	"github.com/corralhq/corral/hypervisor/internal/durable"
	"github.com/corralhq/corral/hypervisor/internal/safename"
	"github.com/corralhq/corral/hypervisor/netdev"
	"github.com/corralhq/corral/hypervisor/vm"
	"github.com/corralhq/corral/hypervisor/volume"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/internal/paging"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/emptypb"
)

// answer is the service's edge: every error a HypervisorService method
// returns is mapped to a gRPC status here, by apierr.ToStatus, and nowhere
// else in the package.
func answer[T any](v T, err error) (T, error) {
	if err != nil {
		var zero T
		return zero, apierr.ToStatus(err)
	}
	return v, nil
}

// empty is answer for the methods that return nothing.
func empty(err error) (*emptypb.Empty, error) { return answer(&emptypb.Empty{}, err) }

func volumeProto(v volume.Volume) *hypervisorv1.Volume {
	return &hypervisorv1.Volume{Name: v.Name, Path: v.Path, SizeBytes: v.SizeBytes, ActualBytes: v.ActualBytes,
		Format: v.Format, BackingFile: v.BackingFile}
}

// CreateVolume creates an empty volume, or a copy-on-write overlay of
// backing_volume.
func (s *Server) CreateVolume(ctx context.Context, req *hypervisorv1.CreateVolumeRequest) (*hypervisorv1.Volume, error) {
	var v volume.Volume
	var err error
	if req.GetBackingVolume() != "" {
		v, err = s.volumes.CreateFrom(ctx, req.GetName(), req.GetBackingVolume(), req.GetSizeBytes())
	} else {
		v, err = s.volumes.Create(ctx, req.GetName(), req.GetSizeBytes())
	}
	return answer(volumeProto(v), err)
}

// FetchVolume downloads a volume (size cap, timeout, sha256, redirect
// rules). The request carries no format, so the volume package's own
// sniff decides between qcow2 and raw, and a qcow2 that names a backing
// file, an external data file or a secret is refused (InvalidArgument);
// see hypervisor/volume's package comment.
func (s *Server) FetchVolume(ctx context.Context, req *hypervisorv1.FetchVolumeRequest) (*hypervisorv1.Volume, error) {
	v, err := s.volumes.Fetch(ctx, volume.FetchRequest{
		Name: req.GetName(), URL: req.GetSourceUrl(), SHA256: req.GetSha256(), SizeBytes: req.GetSizeBytes(),
		MaxBytes: req.GetMaxBytes(), Timeout: time.Duration(req.GetTimeoutSeconds()) * time.Second,
	})
	return answer(volumeProto(v), err)
}

// ResizeVolume grows a volume that no running VM holds open.
func (s *Server) ResizeVolume(ctx context.Context, req *hypervisorv1.ResizeVolumeRequest) (*hypervisorv1.Volume, error) {
	var v volume.Volume
	err := s.withBootLock(ctx, func() error {
		vms, err := s.vms.List(ctx)
		if err != nil {
			return err
		}
		for _, m := range vms {
			if m.PID == 0 {
				continue
			}
			for _, d := range m.Spec.Disks {
				if d.Volume == req.GetName() {
					return apierr.Preconditionf("volume %q is open in running vm %q: shut it down first", req.GetName(), m.Spec.Name)
				}
			}
		}
		v, err = s.volumes.Resize(ctx, req.GetName(), req.GetSizeBytes())
		return err
	})
	return answer(volumeProto(v), err)
}

// GetVolume inspects a volume.
func (s *Server) GetVolume(ctx context.Context, req *hypervisorv1.VolumeRequest) (*hypervisorv1.Volume, error) {
	v, err := s.volumes.Get(ctx, req.GetName())
	return answer(volumeProto(v), err)
}

// ListVolumes answers one page of the volumes, in name order.
func (s *Server) ListVolumes(ctx context.Context, req *hypervisorv1.ListVolumesRequest) (*hypervisorv1.ListVolumesResponse, error) {
	vs, err := s.volumes.List(ctx)
	out := &hypervisorv1.ListVolumesResponse{}
	for _, v := range vs {
		out.Volumes = append(out.Volumes, volumeProto(v))
	}
	if err != nil {
		return answer(out, err)
	}
	paging.SortByKey(out.Volumes, (*hypervisorv1.Volume).GetName)
	out.Volumes, out.NextPageToken, err = paging.Slice(out.Volumes, (*hypervisorv1.Volume).GetName, req.GetPageSize(), req.GetPageToken(), paging.Fingerprint())
	return answer(out, err)
}

// DeleteVolume deletes a volume no VM uses and no overlay is based on.
func (s *Server) DeleteVolume(ctx context.Context, req *hypervisorv1.VolumeRequest) (*emptypb.Empty, error) {
	return empty(s.withBootLock(ctx, func() error {
		if users, err := s.volumeUsers(ctx, req.GetName(), ""); err != nil {
			return err
		} else if len(users) > 0 {
			return apierr.Preconditionf("volume %q is attached to vm %s", req.GetName(), strings.Join(users, ", "))
		}
		return s.volumes.Delete(ctx, req.GetName())
	}))
}

func (s *Server) withBootLock(ctx context.Context, fn func() error) error {
	select {
	case s.bootLock <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-s.bootLock }()
	return fn()
}

// volumeUsers lists the VMs (other than except) with volume attached
// read-write.
func (s *Server) volumeUsers(ctx context.Context, volumeName, except string) ([]string, error) {
	vms, err := s.vms.List(ctx)
	if err != nil {
		return nil, err
	}
	var users []string
	for _, v := range vms {
		if v.Spec.Name == except {
			continue
		}
		for _, d := range v.Spec.Disks {
			if d.Volume == volumeName && !d.CDROM {
				users = append(users, v.Spec.Name)
			}
		}
	}
	return users, nil
}

// BootVM creates and starts a VM, or starts an existing one. Volumes must
// exist on this node and not be attached read-write to another VM; the
// Networks of its NICs must have been applied.
func (s *Server) BootVM(ctx context.Context, req *hypervisorv1.BootVMRequest) (*hypervisorv1.VM, error) {
	var out *hypervisorv1.VM
	err := s.withBootLock(ctx, func() error {
		spec, err := s.specFor(ctx, req.GetVm())
		if err != nil {
			return err
		}
		for _, d := range spec.Disks {
			if d.CDROM {
				continue
			}
			users, err := s.volumeUsers(ctx, d.Volume, spec.Name)
			if err != nil {
				return err
			}
			if len(users) > 0 {
				return apierr.Preconditionf("volume %q is attached to vm %s", d.Volume, strings.Join(users, ", "))
			}
		}
		v, err := s.vms.Boot(ctx, spec)
		if err != nil {
			return err
		}
		out = s.vmProto(v)
		return nil
	})
	return answer(out, err)
}

// specFor turns the API's VM into a vm.Spec: volumes resolved to paths
// (raw volumes, which are ISO images, become CD-ROMs), NICs to taps, the
// cloud-init seed from the login user, keys and NIC addressing.
func (s *Server) specFor(ctx context.Context, m *hypervisorv1.VM) (vm.Spec, error) {
	if m == nil {
		return vm.Spec{}, apierr.Invalidf("vm is required")
	}
	if err := safename.Check("vm", m.GetName()); err != nil {
		return vm.Spec{}, err
	}
	meta, err := protojson.Marshal(m)
	if err != nil {
		return vm.Spec{}, err
	}
	spec := vm.Spec{Name: m.GetName(), UUID: m.GetUuid(), VCPUs: m.GetVcpus(), MemoryBytes: m.GetMemoryBytes(), Meta: meta}
	for i, d := range m.GetDisks() {
		v, err := s.volumes.Get(ctx, d.GetVolume())
		if err != nil {
			return vm.Spec{}, fmt.Errorf("vm %q: disk %d: %w", m.GetName(), i, err)
		}
		// Raw volumes are ISO images (volume keeps nothing else raw).
		spec.Disks = append(spec.Disks, vm.Disk{Volume: v.Name, Path: v.Path, BootIndex: d.GetBootIndex(), Format: v.Format, CDROM: v.Format == "raw"})
	}
	instance := m.GetUuid()
	if instance == "" {
		instance = m.GetName()
	}
	seed := &cloudinit.Seed{InstanceID: instance, Hostname: m.GetName(), User: m.GetLoginUsername(), SSHKeys: m.GetSshAuthorizedKeys()}
	for i, n := range m.GetNics() {
		spec.NICs = append(spec.NICs, vm.NIC{Network: n.GetNetworkName(), MAC: n.GetHardwareAddress()})
		cn := cloudinit.NIC{MAC: n.GetHardwareAddress()}
		for _, a := range []string{n.GetIpv4AddressCidr(), n.GetIpv6AddressCidr()} {
			if a == "" {
				continue
			}
			p, err := netip.ParsePrefix(a)
			if err != nil {
				return vm.Spec{}, apierr.Invalidf("vm %q: nic %d: address %q: %v", m.GetName(), i, a, err)
			}
			cn.Addresses = append(cn.Addresses, p)
		}
		for gw, dst := range map[string]*netip.Addr{n.GetIpv4Gateway(): &cn.Gateway4, n.GetIpv6Gateway(): &cn.Gateway6} {
			if gw == "" {
				continue
			}
			a, err := netip.ParseAddr(gw)
			if err != nil {
				return vm.Spec{}, apierr.Invalidf("vm %q: nic %d: gateway %q: %v", m.GetName(), i, gw, err)
			}
			*dst = a
		}
		for _, ns := range n.GetNameservers() {
			a, err := netip.ParseAddr(ns)
			if err != nil {
				return vm.Spec{}, apierr.Invalidf("vm %q: nic %d: nameserver %q: %v", m.GetName(), i, ns, err)
			}
			cn.Nameservers = append(cn.Nameservers, a)
		}
		if n.GetDomain() != "" {
			cn.Search = []string{n.GetDomain()}
		}
		seed.NICs = append(seed.NICs, cn)
	}
	spec.Seed = seed
	return spec, nil
}

// vmProto reports v. Its disks, NICs and login come from the request kept
// with the VM (Spec.Meta); when that cannot be decoded the VM is still
// reported (name, size, state) and the problem is logged.
func (s *Server) vmProto(v vm.VM) *hypervisorv1.VM {
	out := &hypervisorv1.VM{}
	if len(v.Spec.Meta) > 0 {
		if err := protojson.Unmarshal(v.Spec.Meta, out); err != nil {
			s.log.Warn("vm metadata unreadable: reporting it without disks and NICs", "vm", v.Spec.Name, "err", err)
			out = &hypervisorv1.VM{}
		}
	}
	out.Name, out.Uuid, out.Vcpus, out.MemoryBytes = v.Spec.Name, v.Spec.UUID, v.Spec.VCPUs, v.Spec.MemoryBytes
	switch v.State {
	case vm.Running:
		out.State = hypervisorv1.VMState_VM_STATE_RUNNING
	case vm.Shutdown:
		out.State = hypervisorv1.VMState_VM_STATE_SHUTDOWN
	case vm.Paused:
		out.State = hypervisorv1.VMState_VM_STATE_PAUSED
	case vm.Failed:
		out.State = hypervisorv1.VMState_VM_STATE_FAILED
	case vm.StateUnspecified: // out.State stays as the metadata above left it
	}
	out.Console = v.Console
	return out
}

// RebootVM reboots a running VM (hard: reset; else Ctrl-Alt-Del).
func (s *Server) RebootVM(ctx context.Context, req *hypervisorv1.VMRequest) (*hypervisorv1.VM, error) {
	v, err := s.vms.Reboot(ctx, req.GetName(), req.GetHard())
	return answer(s.vmProto(v), err)
}

// ShutdownVM powers a VM off (ACPI then hard after the deadline; hard:
// at once).
func (s *Server) ShutdownVM(ctx context.Context, req *hypervisorv1.VMRequest) (*hypervisorv1.VM, error) {
	v, err := s.vms.Shutdown(ctx, req.GetName(), req.GetHard())
	return answer(s.vmProto(v), err)
}

// DeleteVM stops a VM hard and removes it with its taps and seed (its
// volumes stay).
func (s *Server) DeleteVM(ctx context.Context, req *hypervisorv1.VMRequest) (*emptypb.Empty, error) {
	_, err := s.vms.Delete(ctx, req.GetName())
	return empty(err)
}

// GetVM reports one VM and its state.
func (s *Server) GetVM(ctx context.Context, req *hypervisorv1.VMRequest) (*hypervisorv1.VM, error) {
	v, err := s.vms.Get(ctx, req.GetName())
	return answer(s.vmProto(v), err)
}

// ListVMs reports one page of the VMs on the node, running or not, in
// name order.
func (s *Server) ListVMs(ctx context.Context, req *hypervisorv1.ListVMsRequest) (*hypervisorv1.ListVMsResponse, error) {
	vms, err := s.vms.List(ctx)
	out := &hypervisorv1.ListVMsResponse{}
	for _, v := range vms {
		out.Vms = append(out.Vms, s.vmProto(v))
	}
	if err != nil {
		return answer(out, err)
	}
	paging.SortByKey(out.Vms, (*hypervisorv1.VM).GetName)
	out.Vms, out.NextPageToken, err = paging.Slice(out.Vms, (*hypervisorv1.VM).GetName, req.GetPageSize(), req.GetPageToken(), paging.Fingerprint())
	return answer(out, err)
}

// ApplyNetwork creates or completes a Network's bridge (and VLAN
// sub-interface) and records it so it is re-applied after a host reboot.
func (s *Server) ApplyNetwork(ctx context.Context, req *hypervisorv1.ApplyNetworkRequest) (*emptypb.Empty, error) {
	return empty(s.applyNetwork(req))
}

func (s *Server) applyNetwork(req *hypervisorv1.ApplyNetworkRequest) error {
	if req.GetVlanId() > 4094 {
		return apierr.Invalidf("network %q: vlan %d out of range", req.GetName(), req.GetVlanId())
	}
	n := netdev.Network{Name: req.GetName(), VLAN: uint16(req.GetVlanId()), GatewayCIDR: req.GetGatewayCidr()}
	if _, err := s.nets.ApplyNetwork(n); err != nil {
		return err
	}
	b, _ := json.Marshal(n)
	return writeFileAtomic(filepath.Join(s.netDir, n.Name+".json"), b)
}

// DeleteNetwork removes a Network's bridge once no tap uses it.
func (s *Server) DeleteNetwork(ctx context.Context, req *hypervisorv1.DeleteNetworkRequest) (*emptypb.Empty, error) {
	err := s.nets.DeleteNetwork(req.GetName())
	if err != nil && !(errors.Is(err, apierr.ErrNotFound) && s.networkRecorded(req.GetName())) {
		return empty(err)
	}
	// Durable: a deleted network must not be re-applied by Restore after
	// a power cut. A failure is returned; DeleteNetwork can be retried.
	if err := durable.Remove(filepath.Join(s.netDir, req.GetName()+".json")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return empty(fmt.Errorf("network %q: %w", req.GetName(), err))
	}
	return &emptypb.Empty{}, nil
}

func (s *Server) networkRecorded(name string) bool {
	if safename.Check("network", name) != nil {
		return false
	}
	_, err := os.Stat(filepath.Join(s.netDir, name+".json"))
	return err == nil
}

// Restore re-applies the recorded networks and starts the VMs whose
// desired state is running but whose QEMU is gone. Failures are logged.
func (s *Server) Restore(ctx context.Context) {
	files, _ := filepath.Glob(filepath.Join(s.netDir, "*.json"))
	for _, f := range files {
		var n netdev.Network
		b, err := os.ReadFile(f)
		if err == nil {
			err = json.Unmarshal(b, &n)
		}
		if err == nil {
			_, err = s.nets.ApplyNetwork(n)
		}
		if err != nil {
			s.log.Warn("restore network", "file", f, "err", err)
		}
	}
	vms, err := s.vms.List(ctx)
	if err != nil {
		s.log.Warn("restore vms", "err", err)
		return
	}
	for _, v := range vms {
		if v.State != vm.Failed || v.PID != 0 {
			continue
		}
		s.log.Info("restarting vm whose qemu is gone", "vm", v.Spec.Name, "reason", v.Reason)
		if _, err := s.vms.Boot(ctx, v.Spec); err != nil {
			s.log.Warn("restart vm", "vm", v.Spec.Name, "err", err)
		}
	}
}

func writeFileAtomic(path string, data []byte) error {
	return durable.WriteFile(path, data, 0o600)
}
