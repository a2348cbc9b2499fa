package appliance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	hypervisorv1 "github.com/corralhq/corral/api/hypervisor/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/inventory/pool"
	"github.com/corralhq/corral/store"
)

// Store key prefixes.
const (
	bsPrefix    = store.BlockStoragesPrefix
	vmPrefix    = store.VirtualMachinesPrefix
	imagePrefix = store.ImagesPrefix
)

// Annotation keys. The n0core/ names are n0stack's and keep n0stack `do`
// files working; the corral/ names are Corral's.
const (
	// AnnotationBlockStorageRequestNode places a block storage on a node
	// (optional in Corral: without it the pool schedules).
	AnnotationBlockStorageRequestNode = "n0core/provisioning/block_storage/request_node_name"
	// AnnotationVMRequestNode places a VM's compute on a node.
	AnnotationVMRequestNode = "n0core/provisioning/virtual_machine/request_node_name"
	// AnnotationBlockStorageURL is file://<path> of the volume on its node.
	AnnotationBlockStorageURL = "n0core/provisioning/block_storage/url"
	// AnnotationFetchFrom and AnnotationCopyFrom record provenance.
	AnnotationFetchFrom = "n0core/provisioning/block_storage/fetch_from"
	AnnotationCopyFrom  = "n0core/provisioning/block_storage/copy_from"
	// AnnotationBlockStorageReservedBy and AnnotationVMReservedBy are
	// written on pool reservations (storage; compute and interfaces) and
	// name their owner; the reconciler rolls back from them.
	AnnotationBlockStorageReservedBy = "n0core/provisioning/block_storage/reserved_by"
	AnnotationVMReservedBy           = "n0core/provisioning/virtual_machine/virtual_machine/reserved_by"
	// AnnotationIsGateway on a VM NIC selects the NIC that gets the
	// network's gateway (default: the first NIC).
	AnnotationIsGateway = "n0core/provisioning/virtual_machine/is_gateway"

	// AnnotationPendingOwner, AnnotationPendingOp and
	// AnnotationPendingDeadline (RFC 3339) are set while a record is
	// PENDING; AnnotationPendingPrevState is the state to restore.
	AnnotationPendingOwner     = "corral/pending_owner"
	AnnotationPendingOp        = "corral/pending_op"
	AnnotationPendingDeadline  = "corral/pending_deadline"
	AnnotationPendingPrevState = "corral/pending_prev_state"
	// AnnotationRollbackFailed says why a compensation failed; the record
	// stays PENDING (with an expired deadline) for the reconciler.
	AnnotationRollbackFailed = "corral/rollback_failed"
	// AnnotationExpiresAt (RFC 3339, user-settable) asks the reconciler to
	// decommission the VM or volume after that time.
	AnnotationExpiresAt = "corral/expires_at"
	// AnnotationDecommissioned records why and when the reconciler
	// removed (or tried to remove) the resource.
	AnnotationDecommissioned = "corral/decommissioned"
	// AnnotationDeletedAt (RFC 3339) is when a block storage was
	// soft-deleted.
	AnnotationDeletedAt = "corral/deleted_at"
	// AnnotationStateReason explains a state the reconciler set.
	AnnotationStateReason = "corral/state_reason"
	// AnnotationNodeStatus is set while the VM's node is NOT_READY,
	// missing or unreachable; the record is otherwise left alone.
	AnnotationNodeStatus = "corral/node_status"
	// AnnotationUsedBy on an IN_USE block storage names its VM.
	AnnotationUsedBy = "corral/used_by"
	// AnnotationProtectedBy on a PROTECTED block storage names its image.
	AnnotationProtectedBy = "corral/protected_by"
	// AnnotationProtectedAt (RFC 3339) is when it became PROTECTED.
	AnnotationProtectedAt = "corral/protected_at"
	// AnnotationBackingStorage on a copy-on-write overlay names the block
	// storage whose volume backs it.
	AnnotationBackingStorage = "corral/backing_block_storage"
	// AnnotationBackingForPrefix + overlay name is set on a block storage
	// that backs that overlay: it may not be attached, resized or purged
	// while any such key exists.
	AnnotationBackingForPrefix = "corral/backing_for/"
)

// Pending operations (AnnotationPendingOp values).
const (
	opCreate   = "create"
	opUpdate   = "update"
	opPurge    = "purge"
	opDelete   = "delete"
	opBoot     = "boot"
	opReboot   = "reboot"
	opShutdown = "shutdown"
)

// LevelCritical is the slog level of a failed compensation: something is
// left half-done and a person should look.
const LevelCritical = slog.LevelError + 4

// Defaults.
const (
	DefaultOpTimeout         = 10 * time.Minute
	DefaultReconcileInterval = 30 * time.Second
	DefaultNodeCallTimeout   = time.Minute
)

// NodeDialer reaches a node's HypervisorService. Implementations must be
// safe for concurrent use; the returned client is used for one or a few
// calls and not closed by the caller.
type NodeDialer interface {
	Hypervisor(ctx context.Context, nodeName string) (hypervisorv1.HypervisorServiceClient, error)
}

// NodeGetter finds a node of the pool by name; an unknown name is a
// NotFound class error. MTLSDialer needs nothing more of the pool.
type NodeGetter interface {
	GetNode(ctx context.Context, name string) (*poolv1.Node, error)
}

// Pool is what the services use of the node pool: lookups, scheduling,
// and the compute, storage and network-interface reservations that place
// VMs and volumes on nodes. *inventory/pool.Pool implements it; its
// methods are safe for concurrent use and return errors of the apierr
// classes.
type Pool interface {
	NodeGetter
	ListNodes(ctx context.Context) ([]*poolv1.Node, error)
	GetNetwork(ctx context.Context, name string) (*poolv1.Network, error)
	ScheduleCompute(ctx context.Context, computeName string, c *poolv1.Compute) (*poolv1.Node, error)
	ReserveCompute(ctx context.Context, nodeName, computeName string, c *poolv1.Compute) (*poolv1.Node, error)
	ReleaseCompute(ctx context.Context, nodeName, computeName string) error
	ScheduleStorage(ctx context.Context, storageName string, s *poolv1.Storage) (*poolv1.Node, error)
	ReserveStorage(ctx context.Context, nodeName, storageName string, s *poolv1.Storage) (*poolv1.Node, error)
	ReleaseStorage(ctx context.Context, nodeName, storageName string) error
	ReserveNetworkInterface(ctx context.Context, req *poolv1.ReserveNetworkInterfaceRequest) (*poolv1.Network, error)
	ReleaseNetworkInterface(ctx context.Context, netName, iface string) error
}

var _ Pool = (*pool.Pool)(nil)

// Config configures Services. Store, Pool and Nodes are required; zero
// values of the rest take the documented defaults.
type Config struct {
	Store store.Store
	Pool  Pool
	Nodes NodeDialer
	// Logger (default: discard).
	Logger *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
	// OpTimeout bounds one long operation; it is also the PENDING
	// deadline (default 10 min).
	OpTimeout time.Duration
	// ReconcileInterval is the reconciler period (default 30 s).
	ReconcileInterval time.Duration
	// NodeCallTimeout bounds one short node call (boot, reboot, list...);
	// volume fetches get the rest of OpTimeout (default 1 min).
	NodeCallTimeout time.Duration
	// DeletedRetention, when > 0, makes the reconciler purge block
	// storages that have been DELETED for that long (default 0: a DELETED
	// volume keeps its file and budget until PurgeBlockStorage).
	DeletedRetention time.Duration
	// Owner identifies this process in corral/pending_owner (default:
	// hostname, pid and a random suffix).
	Owner string
}

// Services implements the three services and the reconciler. It is safe
// for concurrent use, also by several processes sharing one store.
type Services struct {
	cfg Config
	log *slog.Logger
}

// New validates cfg, fills defaults and returns the services. It does no
// I/O.
func New(cfg Config) (*Services, error) {
	if cfg.Store == nil || cfg.Pool == nil || cfg.Nodes == nil {
		return nil, apierr.Invalidf("appliance: Config.Store, Config.Pool and Config.Nodes are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = DefaultOpTimeout
	}
	if cfg.ReconcileInterval <= 0 {
		cfg.ReconcileInterval = DefaultReconcileInterval
	}
	if cfg.NodeCallTimeout <= 0 {
		cfg.NodeCallTimeout = DefaultNodeCallTimeout
	}
	if cfg.Owner == "" {
		host, _ := os.Hostname()
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		cfg.Owner = fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b))
	}
	return &Services{cfg: cfg, log: cfg.Logger}, nil
}

// checkName validates a resource name the way the pool does: names become
// store keys, node volume names and QEMU ids.
var checkName = pool.CheckName

// systemKey reports whether an annotation key is written only by Corral.
func systemKey(k string) bool {
	switch k {
	case AnnotationExpiresAt:
		return false
	case AnnotationBlockStorageURL, AnnotationFetchFrom, AnnotationCopyFrom:
		return true
	}
	return strings.HasPrefix(k, "corral/")
}

// checkUserMeta validates user-given annotations and labels: system keys
// are refused, corral/expires_at must parse.
func checkUserMeta(ann, labels map[string]string) error {
	for what, m := range map[string]map[string]string{"annotation": ann, "label": labels} {
		for k, v := range m {
			if k == "" || len(k) > 253 || strings.ContainsAny(k, " \t\n") {
				return apierr.Invalidf("%s key %q is malformed", what, k)
			}
			if len(v) > 4096 {
				return apierr.Invalidf("%s %q value is longer than 4096 bytes", what, k)
			}
		}
	}
	for k, v := range ann {
		if systemKey(k) {
			return apierr.Invalidf("annotation %q is set by the system and cannot be given", k)
		}
		if k == AnnotationExpiresAt {
			if _, err := time.Parse(time.RFC3339, v); err != nil {
				return apierr.Invalidf("annotation %s=%q is not an RFC 3339 time", k, v)
			}
		}
	}
	return nil
}

// userOnly drops system keys from an Update request: a client that read a
// record and sends its annotations back must not fail; system keys are
// kept from the stored record anyway.
func userOnly(ann map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range ann {
		if !systemKey(k) {
			out[k] = v
		}
	}
	return out
}

// mergeUserAnnotations replaces the user part of cur with user, keeping the
// system keys of cur.
func mergeUserAnnotations(cur, user map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range cur {
		if systemKey(k) {
			out[k] = v
		}
	}
	for k, v := range user {
		out[k] = v
	}
	return out
}

// pendInfo is what a PENDING record says about its operation.
type pendInfo struct {
	owner, op, prev string
	deadline        time.Time
}

func pendingOf(ann map[string]string) pendInfo {
	d, _ := time.Parse(time.RFC3339Nano, ann[AnnotationPendingDeadline])
	return pendInfo{owner: ann[AnnotationPendingOwner], op: ann[AnnotationPendingOp], prev: ann[AnnotationPendingPrevState], deadline: d}
}

// setPending writes the PENDING annotations into ann.
func (s *Services) setPending(ann map[string]string, op, prev string) {
	ann[AnnotationPendingOwner] = s.cfg.Owner
	ann[AnnotationPendingOp] = op
	ann[AnnotationPendingDeadline] = s.cfg.Now().Add(s.cfg.OpTimeout).UTC().Format(time.RFC3339Nano)
	if prev != "" {
		ann[AnnotationPendingPrevState] = prev
	} else {
		delete(ann, AnnotationPendingPrevState)
	}
	delete(ann, AnnotationRollbackFailed)
}

func clearPending(ann map[string]string) {
	for _, k := range []string{AnnotationPendingOwner, AnnotationPendingOp, AnnotationPendingDeadline, AnnotationPendingPrevState, AnnotationRollbackFailed} {
		delete(ann, k)
	}
}

// pendingErr is the FailedPrecondition for a call that finds a PENDING
// record.
func (s *Services) pendingErr(kind, name string, ann map[string]string) error {
	p := pendingOf(ann)
	if !s.cfg.Now().Before(p.deadline) {
		return apierr.Preconditionf("%s %q is PENDING (%s by %s) past its deadline %s: the reconciler will resolve it",
			kind, name, p.op, p.owner, p.deadline.Format(time.RFC3339))
	}
	return apierr.Preconditionf("%s %q is PENDING (%s by %s until %s): retry later",
		kind, name, p.op, p.owner, p.deadline.Format(time.RFC3339))
}

// errMine: the record is no longer PENDING under this owner (the
// reconciler took it over or it was removed).
func notMine(kind, name string) error {
	return apierr.Preconditionf("%s %q: this operation lost its PENDING claim (deadline passed, the reconciler took over)", kind, name)
}

// opContext bounds one long operation by OpTimeout.
func (s *Services) opContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.cfg.OpTimeout)
}

// cleanupContext is for compensations: they run even when the caller has
// gone away, within their own bound.
func (s *Services) cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), s.cfg.OpTimeout)
}
