package appliance

import (
	"context"
	"encoding/hex"
	"errors"
	"maps"
	"net/url"
	"sort"
	"strings"
	"time"

	hypervisorv1 "github.com/corralhq/corral/api/hypervisor/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/protobuf/proto"
)

const bsKind = "block storage"

type bsState = provisioningv1.BlockStorage_BlockStorageState

const (
	bsPending   = provisioningv1.BlockStorage_PENDING
	bsAvailable = provisioningv1.BlockStorage_AVAILABLE
	bsInUse     = provisioningv1.BlockStorage_IN_USE
	bsProtected = provisioningv1.BlockStorage_PROTECTED
	bsDeleted   = provisioningv1.BlockStorage_DELETED
)

func newBS() *provisioningv1.BlockStorage { return &provisioningv1.BlockStorage{} }

// GetBlockStorage returns one block storage.
func (s *Services) GetBlockStorage(ctx context.Context, name string) (*provisioningv1.BlockStorage, error) {
	if err := checkName("name", name); err != nil {
		return nil, err
	}
	bs := newBS()
	if _, err := record.Get(ctx, s.cfg.Store, bsPrefix+name, bs); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, apierr.NotFoundf("block storage %q", name)
		}
		return nil, err
	}
	return bs, nil
}

// ListBlockStorages returns every block storage in name order.
func (s *Services) ListBlockStorages(ctx context.Context) ([]*provisioningv1.BlockStorage, error) {
	return record.List(ctx, s.cfg.Store, bsPrefix, newBS)
}

// bsCreate describes one way of making a new volume.
type bsCreate struct {
	op             string
	name           string
	ann, labels    map[string]string
	request, limit uint64
	extraAnn       map[string]string // provenance
	backing        string            // block storage whose volume backs the new one
	volume         func(ctx context.Context, c hypervisorv1.HypervisorServiceClient, node string) (*hypervisorv1.Volume, error)
	fixedNode      string
}

func checkSizes(name string, request, limit uint64) error {
	if request == 0 || limit == 0 {
		return apierr.Invalidf("block storage %q: request_bytes and limit_bytes must be > 0", name)
	}
	if request > limit {
		return apierr.Invalidf("block storage %q: request_bytes %d > limit_bytes %d", name, request, limit)
	}
	return nil
}

// CreateBlockStorage makes an empty qcow2 volume of limit_bytes.
func (s *Services) CreateBlockStorage(ctx context.Context, req *provisioningv1.CreateBlockStorageRequest) (*provisioningv1.BlockStorage, error) {
	return s.createBS(ctx, bsCreate{
		op: opCreate, name: req.GetName(), ann: req.GetAnnotations(), labels: req.GetLabels(),
		request: req.GetRequestBytes(), limit: req.GetLimitBytes(),
		volume: func(ctx context.Context, c hypervisorv1.HypervisorServiceClient, node string) (*hypervisorv1.Volume, error) {
			cctx, cancel := s.callContext(ctx)
			defer cancel()
			v, err := c.CreateVolume(cctx, &hypervisorv1.CreateVolumeRequest{Name: req.GetName(), SizeBytes: req.GetLimitBytes()})
			return v, nodeErr(node, "create volume", err)
		},
	})
}

// FetchBlockStorage downloads source_url into a new volume on the node,
// bounded by limit_bytes and OpTimeout, checked against source_sha256 when
// given.
func (s *Services) FetchBlockStorage(ctx context.Context, req *provisioningv1.FetchBlockStorageRequest) (*provisioningv1.BlockStorage, error) {
	u, err := url.Parse(req.GetSourceUrl())
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, apierr.Invalidf("source_url %q must be an absolute http or https URL", req.GetSourceUrl())
	}
	sum := strings.ToLower(req.GetSourceSha256())
	if sum != "" {
		if b, err := hex.DecodeString(sum); err != nil || len(b) != 32 {
			return nil, apierr.Invalidf("source_sha256 %q is not 64 hexadecimal digits", req.GetSourceSha256())
		}
	}
	return s.createBS(ctx, bsCreate{
		op: "fetch", name: req.GetName(), ann: req.GetAnnotations(), labels: req.GetLabels(),
		request: req.GetRequestBytes(), limit: req.GetLimitBytes(),
		extraAnn: map[string]string{AnnotationFetchFrom: req.GetSourceUrl()},
		volume: func(ctx context.Context, c hypervisorv1.HypervisorServiceClient, node string) (*hypervisorv1.Volume, error) {
			timeout := s.cfg.OpTimeout
			if d, ok := ctx.Deadline(); ok {
				timeout = time.Until(d) - time.Second
			}
			v, err := c.FetchVolume(ctx, &hypervisorv1.FetchVolumeRequest{
				Name: req.GetName(), SizeBytes: req.GetLimitBytes(), SourceUrl: req.GetSourceUrl(),
				Sha256: sum, MaxBytes: req.GetLimitBytes(), TimeoutSeconds: uint32(max(timeout/time.Second, 1)),
			})
			return v, nodeErr(node, "fetch "+req.GetSourceUrl(), err)
		},
	})
}

// CopyBlockStorage makes a copy-on-write overlay of another block storage
// on the same node. The source must be AVAILABLE or PROTECTED; while the
// copy exists the source cannot be attached, resized or purged. A copy
// onto another node is refused (FailedPrecondition).
func (s *Services) CopyBlockStorage(ctx context.Context, req *provisioningv1.CopyBlockStorageRequest) (*provisioningv1.BlockStorage, error) {
	src, err := s.GetBlockStorage(ctx, req.GetSourceBlockStorage())
	if err != nil {
		return nil, err
	}
	return s.createOverlay(ctx, opCreate, req.GetName(), req.GetAnnotations(), req.GetLabels(), req.GetRequestBytes(), req.GetLimitBytes(), src,
		map[string]string{AnnotationCopyFrom: src.GetName()})
}

// createOverlay is Copy and Image.GenerateBlockStorage.
func (s *Services) createOverlay(ctx context.Context, op, name string, ann, labels map[string]string, request, limit uint64,
	src *provisioningv1.BlockStorage, extra map[string]string) (*provisioningv1.BlockStorage, error) {
	if limit == 0 {
		limit = src.GetLimitBytes()
	}
	if request == 0 {
		request = min(src.GetRequestBytes(), limit)
	}
	if limit < src.GetLimitBytes() {
		return nil, apierr.Invalidf("block storage %q: limit_bytes %d is smaller than the source %q (%d)", name, limit, src.GetName(), src.GetLimitBytes())
	}
	if want := ann[AnnotationBlockStorageRequestNode]; want != "" && want != src.GetNodeName() {
		return nil, apierr.Preconditionf("block storage %q: source %q is on node %q but %s asks for node %q: copies across nodes are not supported yet",
			name, src.GetName(), src.GetNodeName(), AnnotationBlockStorageRequestNode, want)
	}
	return s.createBS(ctx, bsCreate{
		op: op, name: name, ann: ann, labels: labels, request: request, limit: limit,
		extraAnn: extra, backing: src.GetName(), fixedNode: src.GetNodeName(),
		volume: func(ctx context.Context, c hypervisorv1.HypervisorServiceClient, node string) (*hypervisorv1.Volume, error) {
			cctx, cancel := s.callContext(ctx)
			defer cancel()
			v, err := c.CreateVolume(cctx, &hypervisorv1.CreateVolumeRequest{Name: name, SizeBytes: limit, BackingVolume: src.GetStorageName()})
			return v, nodeErr(node, "create overlay of "+src.GetStorageName(), err)
		},
	})
}

// createBS is the PENDING-first creation shared by Create, Fetch, Copy and
// Generate: record PENDING → (hold the backing source) → reserve storage →
// make the volume on the node → AVAILABLE. Any failure unwinds.
func (s *Services) createBS(ctx context.Context, c bsCreate) (*provisioningv1.BlockStorage, error) {
	if err := checkName("name", c.name); err != nil {
		return nil, err
	}
	if err := checkUserMeta(c.ann, c.labels); err != nil {
		return nil, err
	}
	if err := checkSizes(c.name, c.request, c.limit); err != nil {
		return nil, err
	}
	ctx, cancel := s.opContext(ctx)
	defer cancel()
	if err := s.purgeTombstone(ctx, c.name); err != nil {
		return nil, err
	}

	ann := make(map[string]string, len(c.ann))
	maps.Copy(ann, c.ann)
	for k, v := range c.extraAnn {
		ann[k] = v
	}
	if c.backing != "" {
		ann[AnnotationBackingStorage] = c.backing
	}
	s.setPending(ann, c.op, "")
	cl := claimOf(ann)
	key := bsPrefix + c.name
	pend := &provisioningv1.BlockStorage{
		Name: c.name, Annotations: ann, Labels: maps.Clone(c.labels),
		RequestBytes: c.request, LimitBytes: c.limit, State: bsPending, StorageName: c.name,
	}
	if _, err := record.Put(ctx, s.cfg.Store, key, pend, 0); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return nil, apierr.Existsf("block storage %q already exists", c.name)
		}
		return nil, err
	}
	tx := s.begin(bsKind, c.name)
	fail := func(err error) (*provisioningv1.BlockStorage, error) {
		return nil, abandonNew(ctx, s, bsKind, key, c.name, newBS, cl, tx, err)
	}

	if c.backing != "" {
		if err := s.holdBacking(ctx, c.backing, c.name, c.fixedNode); err != nil {
			return fail(err)
		}
		tx.push("release backing hold on "+c.backing, func(ctx context.Context) error { return s.releaseBacking(ctx, c.backing, c.name) })
	}

	storage := &poolv1.Storage{
		Annotations:  map[string]string{AnnotationBlockStorageReservedBy: c.name},
		RequestBytes: c.request, LimitBytes: c.limit,
	}
	node := c.fixedNode
	if node == "" {
		node = c.ann[AnnotationBlockStorageRequestNode]
	}
	var err error
	if node != "" {
		_, err = s.cfg.Pool.ReserveStorage(ctx, node, c.name, storage)
	} else {
		var n *poolv1.Node
		n, err = s.cfg.Pool.ScheduleStorage(ctx, c.name, storage)
		node = n.GetName()
	}
	if err != nil {
		return fail(err)
	}
	tx.push("release storage on "+node, func(ctx context.Context) error {
		return ignoreNotFound(s.cfg.Pool.ReleaseStorage(ctx, node, c.name))
	})
	// Journal the node before touching it, so that a rollback finished by
	// the reconciler knows where a volume may exist.
	if _, err := updateClaimed(ctx, s, bsKind, key, c.name, newBS, cl, func(bs *provisioningv1.BlockStorage) (bool, error) {
		bs.NodeName = node
		return false, nil
	}); err != nil {
		return fail(err)
	}

	client, err := s.nodeClient(ctx, node)
	if err != nil {
		return fail(err)
	}
	vol, err := c.volume(ctx, client, node)
	if err != nil {
		return fail(err)
	}
	tx.push("delete volume on "+node, func(ctx context.Context) error {
		return s.deleteVolume(ctx, node, c.name)
	})

	bs, err := updateClaimed(ctx, s, bsKind, key, c.name, newBS, cl, func(bs *provisioningv1.BlockStorage) (bool, error) {
		clearPending(bs.Annotations)
		bs.Annotations[AnnotationBlockStorageURL] = "file://" + vol.GetPath()
		bs.NodeName = node
		bs.StorageName = c.name
		bs.State = bsAvailable
		return false, nil
	})
	if err != nil {
		return fail(err)
	}
	s.log.Info("block storage created", "block_storage", c.name, "node", node, "op", c.op, "path", vol.GetPath())
	return bs, nil
}

// purgeTombstone purges a DELETED block storage of the same name before a
// creation: a soft-deleted volume is a tombstone, and n0stack `do` files
// delete and re-create volumes by name.
func (s *Services) purgeTombstone(ctx context.Context, name string) error {
	// Absent, or not DELETED (the create then reports AlreadyExists):
	// nothing to purge.
	if bs, err := s.GetBlockStorage(ctx, name); err == nil && bs.GetState() == bsDeleted {
		s.log.Info("purging DELETED block storage before re-creating it", "block_storage", name)
		if err := s.PurgeBlockStorage(ctx, name); ignoreNotFound(err) != nil {
			return err
		}
	}
	return nil
}

// deleteVolume removes a volume on a node (NotFound is success).
func (s *Services) deleteVolume(ctx context.Context, node, volume string) error {
	c, err := s.dial(ctx, node)
	if err != nil {
		return err
	}
	cctx, cancel := s.callContext(ctx)
	defer cancel()
	_, err = c.DeleteVolume(cctx, &hypervisorv1.VolumeRequest{Name: volume})
	return ignoreNotFound(nodeErr(node, "delete volume "+volume, err))
}

// holdBacking marks src as the backing of overlay.
func (s *Services) holdBacking(ctx context.Context, src, overlay, node string) error {
	_, err := record.Update(ctx, s.cfg.Store, bsPrefix+src, newBS, func(bs *provisioningv1.BlockStorage, exists bool) (bool, error) {
		if !exists {
			return false, apierr.NotFoundf("source block storage %q", src)
		}
		switch bs.GetState() {
		case bsAvailable, bsProtected:
		case bsPending:
			return false, s.pendingErr(bsKind, src, bs.GetAnnotations())
		default:
			return false, apierr.Preconditionf("source block storage %q is %s: only AVAILABLE or PROTECTED volumes can back a copy", src, bs.GetState())
		}
		if bs.GetNodeName() != node {
			return false, apierr.Preconditionf("source block storage %q moved to node %q", src, bs.GetNodeName())
		}
		if bs.Annotations == nil {
			bs.Annotations = map[string]string{}
		}
		bs.Annotations[AnnotationBackingForPrefix+overlay] = s.cfg.Now().UTC().Format(time.RFC3339)
		return false, nil
	})
	return err
}

// releaseBacking removes the hold of overlay on src (absent is success).
func (s *Services) releaseBacking(ctx context.Context, src, overlay string) error {
	_, err := record.Update(ctx, s.cfg.Store, bsPrefix+src, newBS, func(bs *provisioningv1.BlockStorage, exists bool) (bool, error) {
		if !exists {
			return false, errNoChange
		}
		if _, ok := bs.GetAnnotations()[AnnotationBackingForPrefix+overlay]; !ok {
			return false, errNoChange
		}
		delete(bs.Annotations, AnnotationBackingForPrefix+overlay)
		return false, nil
	})
	if errors.Is(err, errNoChange) {
		return nil
	}
	return err
}

// errNoChange aborts a record.Update that has nothing to write.
var errNoChange = errors.New("no change")

// overlaysOf lists the overlays a block storage backs.
func overlaysOf(bs *provisioningv1.BlockStorage) []string {
	var out []string
	for k := range bs.GetAnnotations() {
		if o, ok := strings.CutPrefix(k, AnnotationBackingForPrefix); ok {
			out = append(out, o)
		}
	}
	sort.Strings(out)
	return out
}

// UpdateBlockStorage replaces labels and user annotations and, for an
// AVAILABLE volume, changes its budget and grows it (limit_bytes; 0 keeps
// the current value). Shrinking and moving to another node are refused.
// The budget is re-reserved and the volume resized on the node; a failure
// restores the old budget.
func (s *Services) UpdateBlockStorage(ctx context.Context, req *provisioningv1.UpdateBlockStorageRequest) (*provisioningv1.BlockStorage, error) {
	name := req.GetName()
	if err := checkName("name", name); err != nil {
		return nil, err
	}
	userAnn := userOnly(req.GetAnnotations())
	if err := checkUserMeta(userAnn, req.GetLabels()); err != nil {
		return nil, err
	}
	cur, err := s.GetBlockStorage(ctx, name)
	if err != nil {
		return nil, err
	}
	request, limit := req.GetRequestBytes(), req.GetLimitBytes()
	if request == 0 {
		request = cur.GetRequestBytes()
	}
	if limit == 0 {
		limit = cur.GetLimitBytes()
	}
	if err := checkSizes(name, request, limit); err != nil {
		return nil, err
	}
	if limit < cur.GetLimitBytes() {
		return nil, apierr.Invalidf("block storage %q: limit_bytes %d < current %d: shrinking a volume is not supported", name, limit, cur.GetLimitBytes())
	}
	if want := req.GetAnnotations()[AnnotationBlockStorageRequestNode]; want != "" && want != cur.GetNodeName() {
		return nil, apierr.Preconditionf("block storage %q is on node %q: moving it to %q is not supported yet", name, cur.GetNodeName(), want)
	}
	key := bsPrefix + name
	resize := request != cur.GetRequestBytes() || limit != cur.GetLimitBytes()
	if !resize {
		return record.Update(ctx, s.cfg.Store, key, newBS, func(bs *provisioningv1.BlockStorage, exists bool) (bool, error) {
			if !exists {
				return false, apierr.NotFoundf("block storage %q", name)
			}
			if bs.GetState() == bsPending {
				return false, s.pendingErr(bsKind, name, bs.GetAnnotations())
			}
			bs.Annotations = mergeUserAnnotations(bs.GetAnnotations(), userAnn)
			bs.Labels = maps.Clone(req.GetLabels())
			return false, nil
		})
	}

	ctx, cancel := s.opContext(ctx)
	defer cancel()
	var old *provisioningv1.BlockStorage
	var cl claim
	if _, err := record.Update(ctx, s.cfg.Store, key, newBS, func(bs *provisioningv1.BlockStorage, exists bool) (bool, error) {
		if !exists {
			return false, apierr.NotFoundf("block storage %q", name)
		}
		switch {
		case bs.GetState() == bsPending:
			return false, s.pendingErr(bsKind, name, bs.GetAnnotations())
		case bs.GetState() != bsAvailable:
			return false, apierr.Preconditionf("block storage %q is %s: only an AVAILABLE volume can be resized", name, bs.GetState())
		case len(overlaysOf(bs)) > 0:
			return false, apierr.Preconditionf("block storage %q backs %s: it cannot be resized", name, strings.Join(overlaysOf(bs), ", "))
		}
		old = proto.CloneOf(bs)
		s.setPending(bs.Annotations, opUpdate, bs.GetState().String())
		cl = claimOf(bs.Annotations)
		bs.State = bsPending
		return false, nil
	}); err != nil {
		return nil, err
	}
	node := old.GetNodeName()
	tx := s.begin(bsKind, name)
	fail := func(err error) (*provisioningv1.BlockStorage, error) {
		cctx, cancel := s.cleanupContext(ctx)
		defer cancel()
		if rb := tx.rollback(cctx, err); rb != nil {
			markRollbackFailed(cctx, s, bsKind, key, name, newBS, cl, rb)
			return nil, errors.Join(err, rb)
		}
		s.unpendBS(cctx, name, cl)
		return nil, err
	}
	oldStorage := &poolv1.Storage{Annotations: map[string]string{AnnotationBlockStorageReservedBy: name}, RequestBytes: old.GetRequestBytes(), LimitBytes: old.GetLimitBytes()}
	newStorage := &poolv1.Storage{Annotations: map[string]string{AnnotationBlockStorageReservedBy: name}, RequestBytes: request, LimitBytes: limit}
	// The pool has no atomic replace: release, then reserve; the inverse
	// re-reserves the old budget.
	if err := s.cfg.Pool.ReleaseStorage(ctx, node, name); ignoreNotFound(err) != nil {
		return fail(err)
	}
	tx.push("re-reserve old storage", func(ctx context.Context) error {
		_, err := s.cfg.Pool.ReserveStorage(ctx, node, name, oldStorage)
		if errors.Is(err, apierr.ErrAlreadyExists) {
			return nil
		}
		return err
	})
	if _, err := s.cfg.Pool.ReserveStorage(ctx, node, name, newStorage); err != nil {
		return fail(err)
	}
	tx.push("release new storage", func(ctx context.Context) error {
		return ignoreNotFound(s.cfg.Pool.ReleaseStorage(ctx, node, name))
	})
	if limit != old.GetLimitBytes() {
		c, err := s.nodeClient(ctx, node)
		if err != nil {
			return fail(err)
		}
		cctx, ccancel := s.callContext(ctx)
		_, err = c.ResizeVolume(cctx, &hypervisorv1.ResizeVolumeRequest{Name: old.GetStorageName(), SizeBytes: limit})
		ccancel()
		if err != nil {
			return fail(nodeErr(node, "resize volume", err))
		}
		// Growing cannot be undone; nothing to push.
	}
	bs, err := updateClaimed(ctx, s, bsKind, key, name, newBS, cl, func(bs *provisioningv1.BlockStorage) (bool, error) {
		clearPending(bs.Annotations)
		bs.Annotations = mergeUserAnnotations(bs.Annotations, userAnn)
		bs.Labels = maps.Clone(req.GetLabels())
		bs.RequestBytes, bs.LimitBytes = request, limit
		bs.State = bsAvailable
		return false, nil
	})
	if err != nil {
		return fail(err)
	}
	return bs, nil
}

// unpendBS restores the state a PENDING operation saved.
func (s *Services) unpendBS(ctx context.Context, name string, cl claim) {
	_, err := updateClaimed(ctx, s, bsKind, bsPrefix+name, name, newBS, cl, func(bs *provisioningv1.BlockStorage) (bool, error) {
		restoreBSState(bs)
		return false, nil
	})
	if err != nil {
		s.log.Warn("could not restore block storage after a failed operation; the reconciler will", "block_storage", name, "err", err.Error())
	}
}

func restoreBSState(bs *provisioningv1.BlockStorage) {
	prev := pendingOf(bs.GetAnnotations()).prev
	st := provisioningv1.BlockStorage_BlockStorageState(provisioningv1.BlockStorage_BlockStorageState_value[prev])
	if st == bsPending || st == provisioningv1.BlockStorage_UNSPECIFIED {
		st = bsAvailable
	}
	bs.State = st
	clearPending(bs.Annotations)
}

// changeBSState is a PENDING-free state change by CAS.
func (s *Services) changeBSState(ctx context.Context, name string, from []bsState, to bsState, verb string) (*provisioningv1.BlockStorage, error) {
	if err := checkName("name", name); err != nil {
		return nil, err
	}
	return record.Update(ctx, s.cfg.Store, bsPrefix+name, newBS, func(bs *provisioningv1.BlockStorage, exists bool) (bool, error) {
		if !exists {
			return false, apierr.NotFoundf("block storage %q", name)
		}
		if bs.GetState() == bsPending {
			return false, s.pendingErr(bsKind, name, bs.GetAnnotations())
		}
		for _, f := range from {
			if bs.GetState() == f {
				bs.State = to
				if bs.Annotations == nil {
					bs.Annotations = map[string]string{}
				}
				if to == bsDeleted {
					bs.Annotations[AnnotationDeletedAt] = s.cfg.Now().UTC().Format(time.RFC3339)
				} else {
					delete(bs.Annotations, AnnotationDeletedAt)
				}
				return false, nil
			}
		}
		why := ""
		switch {
		case bs.GetState() == bsInUse:
			why = " (used by virtual machine " + bs.GetAnnotations()[AnnotationUsedBy] + ")"
		case bs.GetState() == bsProtected:
			why = " (registered in image " + bs.GetAnnotations()[AnnotationProtectedBy] + ")"
		}
		return false, apierr.Preconditionf("block storage %q is %s%s: cannot %s it", name, bs.GetState(), why, verb)
	})
}

// DeleteBlockStorage is a soft delete: AVAILABLE → DELETED; the volume and
// budget stay until Purge.
func (s *Services) DeleteBlockStorage(ctx context.Context, name string) (*provisioningv1.BlockStorage, error) {
	return s.changeBSState(ctx, name, []bsState{bsAvailable}, bsDeleted, "delete")
}

// UndeleteBlockStorage is DELETED → AVAILABLE.
func (s *Services) UndeleteBlockStorage(ctx context.Context, name string) (*provisioningv1.BlockStorage, error) {
	return s.changeBSState(ctx, name, []bsState{bsDeleted}, bsAvailable, "undelete")
}

// PurgeBlockStorage removes a DELETED volume: the node deletes the file,
// the budget is released, the record removed. A volume that backs a copy
// is refused. Once the node has deleted the file the purge is rolled
// forward (by the reconciler if this call fails).
func (s *Services) PurgeBlockStorage(ctx context.Context, name string) error {
	if err := checkName("name", name); err != nil {
		return err
	}
	ctx, cancel := s.opContext(ctx)
	defer cancel()
	var bs *provisioningv1.BlockStorage
	var cl claim
	if _, err := record.Update(ctx, s.cfg.Store, bsPrefix+name, newBS, func(m *provisioningv1.BlockStorage, exists bool) (bool, error) {
		if !exists {
			return false, apierr.NotFoundf("block storage %q", name)
		}
		switch {
		case m.GetState() == bsPending:
			return false, s.pendingErr(bsKind, name, m.GetAnnotations())
		case m.GetState() != bsDeleted:
			return false, apierr.Preconditionf("block storage %q is %s: only a DELETED volume can be purged (delete it first)", name, m.GetState())
		case len(overlaysOf(m)) > 0:
			return false, apierr.Preconditionf("block storage %q backs %s: purge those first", name, strings.Join(overlaysOf(m), ", "))
		}
		s.setPending(m.Annotations, opPurge, m.GetState().String())
		cl = claimOf(m.Annotations)
		m.State = bsPending
		bs = proto.CloneOf(m)
		return false, nil
	}); err != nil {
		return err
	}
	if bs.GetNodeName() != "" {
		if err := s.deleteVolume(ctx, bs.GetNodeName(), bs.GetStorageName()); err != nil {
			cctx, ccancel := s.cleanupContext(ctx)
			defer ccancel()
			s.unpendBS(cctx, name, cl)
			return err
		}
	}
	cctx, ccancel := s.cleanupContext(ctx)
	defer ccancel()
	if err := s.finishPurge(cctx, bs, cl); err != nil {
		markRollbackFailed(cctx, s, bsKind, bsPrefix+name, name, newBS, cl, err)
		return err
	}
	return nil
}

// finishPurge is everything after the node deleted the volume; every step
// is idempotent.
func (s *Services) finishPurge(ctx context.Context, bs *provisioningv1.BlockStorage, cl claim) error {
	name := bs.GetName()
	if bs.GetNodeName() != "" {
		if err := ignoreNotFound(s.cfg.Pool.ReleaseStorage(ctx, bs.GetNodeName(), name)); err != nil {
			return err
		}
	}
	if src := bs.GetAnnotations()[AnnotationBackingStorage]; src != "" {
		if err := s.releaseBacking(ctx, src, name); err != nil {
			return err
		}
	}
	if _, err := updateClaimed(ctx, s, bsKind, bsPrefix+name, name, newBS, cl, func(*provisioningv1.BlockStorage) (bool, error) { return true, nil }); err != nil {
		return err
	}
	s.log.Info("block storage purged", "block_storage", name, "node", bs.GetNodeName())
	return nil
}

// DownloadBlockStorage is not supported yet: nodes serve no files.
func (s *Services) DownloadBlockStorage(ctx context.Context, name string) (string, error) {
	if _, err := s.GetBlockStorage(ctx, name); err != nil {
		return "", err
	}
	return "", apierr.Preconditionf("block storage %q: download is not supported yet (nodes serve no volume files)", name)
}

// attachDisk is AVAILABLE → IN_USE for a VM.
func (s *Services) attachDisk(ctx context.Context, name, vm string) (*provisioningv1.BlockStorage, error) {
	return record.Update(ctx, s.cfg.Store, bsPrefix+name, newBS, func(bs *provisioningv1.BlockStorage, exists bool) (bool, error) {
		if !exists {
			return false, apierr.NotFoundf("block storage %q does not exist", name)
		}
		switch bs.GetState() {
		case bsAvailable:
		case bsPending:
			return false, s.pendingErr(bsKind, name, bs.GetAnnotations())
		case bsInUse:
			return false, apierr.Preconditionf("block storage %q is already IN_USE by virtual machine %q", name, bs.GetAnnotations()[AnnotationUsedBy])
		case bsProtected:
			return false, apierr.Preconditionf("block storage %q is PROTECTED (registered in image %q): generate a volume from the image instead", name, bs.GetAnnotations()[AnnotationProtectedBy])
		default:
			return false, apierr.Preconditionf("block storage %q is %s, not AVAILABLE", name, bs.GetState())
		}
		if o := overlaysOf(bs); len(o) > 0 {
			return false, apierr.Preconditionf("block storage %q backs %s: writing it would corrupt them", name, strings.Join(o, ", "))
		}
		bs.State = bsInUse
		if bs.Annotations == nil {
			bs.Annotations = map[string]string{}
		}
		bs.Annotations[AnnotationUsedBy] = vm
		return false, nil
	})
}

// detachDisk is IN_USE (by vm) → AVAILABLE; anything else is left alone.
func (s *Services) detachDisk(ctx context.Context, name, vm string) error {
	_, err := record.Update(ctx, s.cfg.Store, bsPrefix+name, newBS, func(bs *provisioningv1.BlockStorage, exists bool) (bool, error) {
		if !exists || bs.GetState() != bsInUse || bs.GetAnnotations()[AnnotationUsedBy] != vm {
			return false, errNoChange
		}
		bs.State = bsAvailable
		delete(bs.Annotations, AnnotationUsedBy)
		return false, nil
	})
	if errors.Is(err, errNoChange) {
		return nil
	}
	return err
}
