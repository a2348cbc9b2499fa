package appliance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	deploymentv1 "github.com/corralhq/corral/api/deployment/v1"
	hypervisorv1 "github.com/corralhq/corral/api/hypervisor/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/protobuf/proto"
)

// Run is the reconciler: every ReconcileInterval (and once at start) it
// resolves expired PENDING records, decommissions expired VMs and volumes,
// releases PROTECTED volumes no image lists, and reflects what nodes report
// about their VMs. It blocks until ctx ends and then returns nil; errors of
// one pass are logged, not returned.
//
// Several appliances may run it on one store: every write is a CAS and a
// PENDING record is taken over by CAS before it is rolled back.
func (s *Services) Run(ctx context.Context) error {
	t := time.NewTicker(s.cfg.ReconcileInterval)
	defer t.Stop()
	for {
		if err := s.ReconcileOnce(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("reconcile pass failed", "err", err.Error())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// ReconcileOnce runs one reconciler pass. It returns the errors of the
// pass joined; it stops early only when ctx ends.
func (s *Services) ReconcileOnce(ctx context.Context) error {
	var errs []error
	errs = append(errs, s.reconcileBlockStorages(ctx))
	errs = append(errs, s.reconcileVMs(ctx))
	return errors.Join(errs...)
}

// stored is a decoded record with the revision it was read at.
type stored[M proto.Message] struct {
	msg M
	rev int64
}

func listStored[M proto.Message](ctx context.Context, st store.Store, prefix string, newMsg func() M) ([]stored[M], error) {
	kvs, err := st.List(ctx, prefix)
	if err != nil {
		return nil, err
	}
	out := make([]stored[M], 0, len(kvs))
	for _, kv := range kvs {
		m := newMsg()
		if err := record.Unmarshal(kv.Value, m); err != nil {
			return nil, fmt.Errorf("%s: %w", kv.Key, err)
		}
		out = append(out, stored[M]{msg: m, rev: kv.Revision})
	}
	return out, nil
}

// expiredPending reports whether a record is PENDING past its deadline.
func (s *Services) expiredPending(ann map[string]string) bool {
	p := pendingOf(ann)
	return p.op != "" && !s.cfg.Now().Before(p.deadline)
}

// expiry returns the record's corral/expires_at when it has passed.
func (s *Services) expiry(ann map[string]string) (time.Time, bool) {
	v, ok := ann[AnnotationExpiresAt]
	if !ok {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil || !s.cfg.Now().After(t) {
		return time.Time{}, false
	}
	return t, true
}

// takeOver claims an expired PENDING record for the reconciler by CAS.
func takeOver[M annotated](ctx context.Context, s *Services, key string, newMsg func() M) (M, claim, error) {
	var cl claim
	m, err := record.Update(ctx, s.cfg.Store, key, newMsg, func(m M, exists bool) (bool, error) {
		if !exists || !s.expiredPending(m.GetAnnotations()) {
			return false, errNoChange
		}
		ann := m.GetAnnotations()
		ann[AnnotationPendingOwner] = s.cfg.Owner + "#reconciler"
		ann[AnnotationPendingDeadline] = s.cfg.Now().Add(s.cfg.OpTimeout).UTC().Format(time.RFC3339Nano)
		cl = claimOf(ann)
		return false, nil
	})
	return m, cl, err
}

// setAnnotations writes annotations on a record at the revision it was read
// (a concurrent change wins; the next pass looks again).
func setAnnotations[M annotated](ctx context.Context, s *Services, key string, m M, rev int64, kv map[string]string) error {
	m = proto.CloneOf(m)
	ann := m.GetAnnotations()
	changed := false
	for k, v := range kv {
		if ann[k] != v {
			ann[k] = v
			changed = true
		}
	}
	if !changed {
		return nil
	}
	_, err := record.Put(ctx, s.cfg.Store, key, m, rev)
	if errors.Is(err, store.ErrConflict) {
		return nil
	}
	return err
}

func (s *Services) reconcileBlockStorages(ctx context.Context) error {
	all, err := listStored(ctx, s.cfg.Store, bsPrefix, newBS)
	if err != nil {
		return err
	}
	var images map[string]*deploymentv1.Image
	var errs []error
	for _, r := range all {
		bs := r.msg
		ann := bs.GetAnnotations()
		switch {
		case bs.GetState() == bsPending:
			if s.expiredPending(ann) {
				errs = append(errs, s.recoverBS(ctx, bs.GetName()))
			}
		case bs.GetState() == bsProtected:
			if images == nil {
				images = map[string]*deploymentv1.Image{}
				list, err := s.ListImages(ctx)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				for _, im := range list {
					images[im.GetName()] = im
				}
			}
			errs = append(errs, s.releaseOrphanProtected(ctx, bs, images))
		}
		if _, ok := s.expiry(ann); ok && bs.GetState() != bsPending {
			errs = append(errs, s.expireBS(ctx, r))
			continue
		}
		if bs.GetState() == bsDeleted && s.cfg.DeletedRetention > 0 {
			at, err := time.Parse(time.RFC3339, ann[AnnotationDeletedAt])
			if err == nil && !s.cfg.Now().Before(at.Add(s.cfg.DeletedRetention)) {
				s.log.Info("purging block storage past its DELETED retention", logAttrs(bsKind, bs.GetName(),
					"reason", "deleted_retention", "deleted_at", ann[AnnotationDeletedAt], "node", bs.GetNodeName())...)
				if err := s.PurgeBlockStorage(ctx, bs.GetName()); err != nil {
					errs = append(errs, fmt.Errorf("purge DELETED block storage %q: %w", bs.GetName(), err))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// releaseOrphanProtected sets AVAILABLE a PROTECTED volume whose image
// does not list it (a crash between the writes of Register, Unregister or
// DeleteImage).
func (s *Services) releaseOrphanProtected(ctx context.Context, bs *provisioningv1.BlockStorage, images map[string]*deploymentv1.Image) error {
	image := bs.GetAnnotations()[AnnotationProtectedBy]
	at, _ := time.Parse(time.RFC3339Nano, bs.GetAnnotations()[AnnotationProtectedAt])
	if s.cfg.Now().Sub(at) < orphanProtectGrace {
		return nil
	}
	if im, ok := images[image]; ok && slices.ContainsFunc(im.GetRegisteredBlockStorages(), func(r *deploymentv1.Image_RegisteredBlockStorage) bool {
		return r.GetBlockStorageName() == bs.GetName()
	}) {
		return nil
	}
	s.log.Info("releasing PROTECTED block storage no image lists", "block_storage", bs.GetName(), "image", image)
	return s.unprotect(ctx, bs.GetName(), image)
}

// recoverBS resolves one expired PENDING block storage: a creation is
// rolled back (volume deleted on the node holding its reservation, budget
// released, backing hold released, record removed); a purge is rolled
// forward; an update gets its recorded budget back.
func (s *Services) recoverBS(ctx context.Context, name string) error {
	key := bsPrefix + name
	bs, cl, err := takeOver(ctx, s, key, newBS)
	if errors.Is(err, errNoChange) {
		return nil
	}
	if err != nil {
		return err
	}
	p := pendingOf(bs.GetAnnotations())
	s.log.Info("resolving expired PENDING record", "kind", bsKind, "name", name, "op", p.op, "rollback_failed", bs.GetAnnotations()[AnnotationRollbackFailed])
	err = func() error {
		switch p.op {
		case opPurge:
			if bs.GetNodeName() != "" {
				if err := s.deleteVolume(ctx, bs.GetNodeName(), bs.GetStorageName()); err != nil {
					return err
				}
			}
			return s.finishPurge(ctx, bs, cl)
		case opUpdate:
			if err := s.ensureStorage(ctx, bs); err != nil {
				return err
			}
			_, err := updateClaimed(ctx, s, bsKind, key, name, newBS, cl, func(m *provisioningv1.BlockStorage) (bool, error) {
				restoreBSState(m)
				return false, nil
			})
			return err
		default: // a creation
			nodes, err := s.cfg.Pool.ListNodes(ctx)
			if err != nil {
				return err
			}
			for _, n := range nodes {
				st, ok := n.GetReservedStorages()[name]
				holds := ok && st.GetAnnotations()[AnnotationBlockStorageReservedBy] == name
				if !holds && n.GetName() != bs.GetNodeName() {
					continue
				}
				if err := s.deleteVolume(ctx, n.GetName(), name); err != nil {
					return err
				}
				if holds {
					if err := ignoreNotFound(s.cfg.Pool.ReleaseStorage(ctx, n.GetName(), name)); err != nil {
						return err
					}
				}
			}
			if src := bs.GetAnnotations()[AnnotationBackingStorage]; src != "" {
				if err := s.releaseBacking(ctx, src, name); err != nil {
					return err
				}
			}
			_, err = updateClaimed(ctx, s, bsKind, key, name, newBS, cl, func(*provisioningv1.BlockStorage) (bool, error) { return true, nil })
			return err
		}
	}()
	if err != nil {
		markRollbackFailed(ctx, s, bsKind, key, name, newBS, cl, err)
		return fmt.Errorf("block storage %q: resolve PENDING %s: %w", name, p.op, err)
	}
	s.log.Info("resolved expired PENDING record", "kind", bsKind, "name", name, "op", p.op)
	return nil
}

// ensureStorage makes the pool's reservation match the record.
func (s *Services) ensureStorage(ctx context.Context, bs *provisioningv1.BlockStorage) error {
	n, err := s.cfg.Pool.GetNode(ctx, bs.GetNodeName())
	if err != nil {
		return err
	}
	want := &poolv1.Storage{Annotations: map[string]string{AnnotationBlockStorageReservedBy: bs.GetName()}, RequestBytes: bs.GetRequestBytes(), LimitBytes: bs.GetLimitBytes()}
	if got, ok := n.GetReservedStorages()[bs.GetName()]; ok {
		if got.GetRequestBytes() == want.GetRequestBytes() && got.GetLimitBytes() == want.GetLimitBytes() {
			return nil
		}
		if err := ignoreNotFound(s.cfg.Pool.ReleaseStorage(ctx, n.GetName(), bs.GetName())); err != nil {
			return err
		}
	}
	_, err = s.cfg.Pool.ReserveStorage(ctx, n.GetName(), bs.GetName(), want)
	return err
}

// ensureCompute makes the pool's compute reservation match the VM record.
func (s *Services) ensureCompute(ctx context.Context, vm *provisioningv1.VirtualMachine) error {
	n, err := s.cfg.Pool.GetNode(ctx, vm.GetComputeNodeName())
	if err != nil {
		return err
	}
	want := computeOf(vm)
	if got, ok := n.GetReservedComputes()[vm.GetName()]; ok {
		if proto.Equal(got, want) {
			return nil
		}
		if err := ignoreNotFound(s.cfg.Pool.ReleaseCompute(ctx, n.GetName(), vm.GetName())); err != nil {
			return err
		}
	}
	_, err = s.cfg.Pool.ReserveCompute(ctx, n.GetName(), vm.GetName(), want)
	return err
}

// expireBS decommissions a volume whose corral/expires_at passed: an
// AVAILABLE or DELETED volume is soft-deleted and purged; one in use,
// protected or backing a copy is only annotated.
func (s *Services) expireBS(ctx context.Context, r stored[*provisioningv1.BlockStorage]) error {
	bs := r.msg
	name := bs.GetName()
	exp, _ := s.expiry(bs.GetAnnotations())
	now := s.cfg.Now().UTC()
	blocked := ""
	switch {
	case bs.GetState() == bsInUse:
		blocked = "IN_USE by virtual machine " + bs.GetAnnotations()[AnnotationUsedBy]
	case bs.GetState() == bsProtected:
		blocked = "PROTECTED by image " + bs.GetAnnotations()[AnnotationProtectedBy]
	case len(overlaysOf(bs)) > 0:
		blocked = fmt.Sprintf("backs %v", overlaysOf(bs))
	}
	if blocked != "" {
		reason := fmt.Sprintf("expired at %s; not purged: %s", exp.Format(time.RFC3339), blocked)
		if bs.GetAnnotations()[AnnotationDecommissioned] != reason {
			s.log.Warn("expired block storage not decommissioned", logAttrs(bsKind, name, "expires_at", exp.Format(time.RFC3339), "blocked_by", blocked)...)
		}
		return setAnnotations(ctx, s, bsPrefix+name, bs, r.rev, map[string]string{AnnotationDecommissioned: reason})
	}
	reason := fmt.Sprintf("expired at %s; purged by the reconciler at %s", exp.Format(time.RFC3339), now.Format(time.RFC3339))
	if _, err := record.Update(ctx, s.cfg.Store, bsPrefix+name, newBS, func(m *provisioningv1.BlockStorage, exists bool) (bool, error) {
		if !exists || (m.GetState() != bsAvailable && m.GetState() != bsDeleted) || m.GetAnnotations()[AnnotationExpiresAt] != bs.GetAnnotations()[AnnotationExpiresAt] {
			return false, errNoChange
		}
		m.State = bsDeleted
		m.Annotations[AnnotationDecommissioned] = reason
		return false, nil
	}); err != nil {
		if errors.Is(err, errNoChange) {
			return nil
		}
		return err
	}
	s.log.Info("decommissioning expired block storage", logAttrs(bsKind, name,
		"reason", "expired", "expires_at", exp.Format(time.RFC3339), "node", bs.GetNodeName(),
		"request_bytes", bs.GetRequestBytes(), "limit_bytes", bs.GetLimitBytes())...)
	if err := s.PurgeBlockStorage(ctx, name); err != nil {
		return fmt.Errorf("expire block storage %q: %w", name, err)
	}
	return nil
}

func (s *Services) reconcileVMs(ctx context.Context) error {
	all, err := listStored(ctx, s.cfg.Store, vmPrefix, newVM)
	if err != nil {
		return err
	}
	var errs []error
	byNode := map[string][]stored[*provisioningv1.VirtualMachine]{}
	var nodes []string
	for _, r := range all {
		vm := r.msg
		ann := vm.GetAnnotations()
		switch {
		case vm.GetState() == vmPending:
			if s.expiredPending(ann) {
				errs = append(errs, s.recoverVM(ctx, vm.GetName()))
			}
			continue
		}
		if exp, ok := s.expiry(ann); ok {
			errs = append(errs, s.expireVM(ctx, r, exp))
			continue
		}
		if node := vm.GetComputeNodeName(); node != "" {
			if _, ok := byNode[node]; !ok {
				nodes = append(nodes, node)
			}
			byNode[node] = append(byNode[node], r)
		}
	}
	for _, node := range nodes {
		errs = append(errs, s.reconcileNode(ctx, node, byNode[node]))
	}
	return errors.Join(errs...)
}

// recoverVM resolves one expired PENDING VM: a creation is rolled back
// (VM deleted on the node holding its compute, compute, interfaces and
// disks released by their reserved_by/used_by marks, record removed); a
// delete is rolled forward; an update gets its recorded compute back;
// boot, reboot and shutdown restore the previous state (the next pass
// reads the real one from the node).
func (s *Services) recoverVM(ctx context.Context, name string) error {
	key := vmPrefix + name
	vm, cl, err := takeOver(ctx, s, key, newVM)
	if errors.Is(err, errNoChange) {
		return nil
	}
	if err != nil {
		return err
	}
	p := pendingOf(vm.GetAnnotations())
	s.log.Info("resolving expired PENDING record", "kind", vmKind, "name", name, "op", p.op, "rollback_failed", vm.GetAnnotations()[AnnotationRollbackFailed])
	err = func() error {
		switch p.op {
		case opCreate:
			nodes, err := s.computeNodesOf(ctx, name)
			if err != nil {
				return err
			}
			if n := vm.GetComputeNodeName(); n != "" && !slices.Contains(nodes, n) {
				nodes = append(nodes, n)
			}
			for _, node := range nodes {
				if err := s.deleteVMOnNode(ctx, node, name); err != nil {
					return err
				}
			}
			if err := s.releaseVMResources(ctx, vm); err != nil {
				return err
			}
			_, err = updateClaimed(ctx, s, vmKind, key, name, newVM, cl, func(*provisioningv1.VirtualMachine) (bool, error) { return true, nil })
			return err
		case opDelete:
			if node := vm.GetComputeNodeName(); node != "" {
				if err := s.deleteVMOnNode(ctx, node, name); err != nil {
					return err
				}
			}
			return s.finishDeleteVM(ctx, vm, cl)
		case opUpdate:
			if err := s.ensureCompute(ctx, vm); err != nil {
				return err
			}
		}
		_, err := updateClaimed(ctx, s, vmKind, key, name, newVM, cl, func(m *provisioningv1.VirtualMachine) (bool, error) {
			restoreVMState(m)
			return false, nil
		})
		return err
	}()
	if err != nil {
		markRollbackFailed(ctx, s, vmKind, key, name, newVM, cl, err)
		return fmt.Errorf("virtual machine %q: resolve PENDING %s: %w", name, p.op, err)
	}
	s.log.Info("resolved expired PENDING record", "kind", vmKind, "name", name, "op", p.op)
	return nil
}

// expireVM records why and deletes a VM whose corral/expires_at passed.
func (s *Services) expireVM(ctx context.Context, r stored[*provisioningv1.VirtualMachine], exp time.Time) error {
	vm := r.msg
	name := vm.GetName()
	now := s.cfg.Now().UTC()
	reason := fmt.Sprintf("expired at %s; deleted by the reconciler", exp.Format(time.RFC3339))
	if err := setAnnotations(ctx, s, vmPrefix+name, vm, r.rev, map[string]string{AnnotationDecommissioned: reason}); err != nil {
		return err
	}
	s.log.Info("decommissioning expired virtual machine", logAttrs(vmKind, name,
		"reason", "expired", "expires_at", exp.Format(time.RFC3339), "decided_at", now.Format(time.RFC3339), "node", vm.GetComputeNodeName(),
		"limit_cpu_milli_core", vm.GetLimitCpuMilliCore(), "limit_memory_bytes", vm.GetLimitMemoryBytes())...)
	if err := s.DeleteVirtualMachine(ctx, name); err != nil {
		cur, rev, gerr := getStored(ctx, s, vmPrefix+name, newVM)
		if gerr == nil {
			_ = setAnnotations(ctx, s, vmPrefix+name, cur, rev, map[string]string{AnnotationDecommissioned: fmt.Sprintf("expired at %s; delete failed (retried every pass): %v", exp.Format(time.RFC3339), err)})
		}
		return fmt.Errorf("expire virtual machine %q: %w", name, err)
	}
	return nil
}

func getStored[M proto.Message](ctx context.Context, s *Services, key string, newMsg func() M) (M, int64, error) {
	m := newMsg()
	rev, err := record.Get(ctx, s.cfg.Store, key, m)
	return m, rev, err
}

// reconcileNode compares the VM records placed on node with what the node
// reports. A node that is missing, NOT_READY or unreachable leaves the
// records' states alone and only annotates them.
func (s *Services) reconcileNode(ctx context.Context, node string, vms []stored[*provisioningv1.VirtualMachine]) error {
	now := s.cfg.Now().UTC().Format(time.RFC3339)
	status := ""
	var reported map[string]*hypervisorv1.VM
	n, err := s.cfg.Pool.GetNode(ctx, node)
	switch {
	case errors.Is(err, apierr.ErrNotFound):
		status = fmt.Sprintf("node %q is not in the pool", node)
	case err != nil:
		return err
	case n.GetState() != poolv1.Node_READY:
		status = fmt.Sprintf("node %q is %s (last heartbeat %s): VM state not verified", node, n.GetState(), n.GetLastHeartbeat().AsTime().UTC().Format(time.RFC3339))
	default:
		list, err := func() (*hypervisorv1.ListVMsResponse, error) {
			c, err := s.dial(ctx, node)
			if err != nil {
				return nil, err
			}
			cctx, cancel := s.callContext(ctx)
			defer cancel()
			l, err := c.ListVMs(cctx, &hypervisorv1.ListVMsRequest{})
			return l, nodeErr(node, "list vms", err)
		}()
		if err != nil {
			status = fmt.Sprintf("node %q unreachable: %v", node, err)
			break
		}
		reported = map[string]*hypervisorv1.VM{}
		for _, v := range list.GetVms() {
			reported[v.GetName()] = v
		}
	}
	if status != "" {
		s.log.Warn("node not verified", "node", node, "status", status, "vms", len(vms))
	}
	var errs []error
	for _, r := range vms {
		vm := proto.CloneOf(r.msg)
		if vm.Annotations == nil {
			vm.Annotations = map[string]string{}
		}
		if status != "" {
			if vm.Annotations[AnnotationNodeStatus] == status {
				continue
			}
			vm.Annotations[AnnotationNodeStatus] = status
		} else {
			delete(vm.Annotations, AnnotationNodeStatus)
			if got, ok := reported[vm.GetName()]; ok {
				vm.State = vmStateFromNode(got.GetState())
				if vm.State == vmUnspecified {
					vm.Annotations[AnnotationStateReason] = fmt.Sprintf("node %q reports %s", node, got.GetState())
				} else {
					delete(vm.Annotations, AnnotationStateReason)
				}
			} else if vm.GetState() != vmShutdown || vm.Annotations[AnnotationStateReason] == "" {
				vm.State = vmShutdown
				vm.Annotations[AnnotationStateReason] = fmt.Sprintf("QEMU is not running on node %q (checked %s)", node, now)
				s.log.Warn("virtual machine not running on its node", "vm", vm.GetName(), "node", node)
			}
		}
		if proto.Equal(vm, r.msg) {
			continue
		}
		if _, err := record.Put(ctx, s.cfg.Store, vmPrefix+vm.GetName(), vm, r.rev); err != nil && !errors.Is(err, store.ErrConflict) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
