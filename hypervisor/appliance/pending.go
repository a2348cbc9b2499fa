package appliance

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/protobuf/proto"
)

// annotated is a record with an annotation map (BlockStorage,
// VirtualMachine).
type annotated interface {
	proto.Message
	GetAnnotations() map[string]string
}

// claim identifies one PENDING operation: its owner and the deadline it
// wrote. Only the holder of the claim may finish or abandon the operation.
type claim struct {
	owner, deadline string
}

func claimOf(ann map[string]string) claim {
	return claim{owner: ann[AnnotationPendingOwner], deadline: ann[AnnotationPendingDeadline]}
}

// updateClaimed is record.Update restricted to the holder of cl.
func updateClaimed[M annotated](ctx context.Context, s *Services, kind, key, name string, newMsg func() M, cl claim,
	mutate func(m M) (del bool, err error)) (M, error) {
	return record.Update(ctx, s.cfg.Store, key, newMsg, func(m M, exists bool) (bool, error) {
		if !exists || claimOf(m.GetAnnotations()) != cl {
			return false, notMine(kind, name)
		}
		return mutate(m)
	})
}

// abandonNew unwinds tx for an operation that created its PENDING record
// and then removes the record. When a compensation fails, the record stays
// PENDING with AnnotationRollbackFailed and an expired deadline, so that
// the reconciler retries the rollback from what the record and the pool
// say. It returns cause (annotated with the rollback failure, if any).
func abandonNew[M annotated](ctx context.Context, s *Services, kind, key, name string, newMsg func() M, cl claim, tx *txn, cause error) error {
	cctx, cancel := s.cleanupContext(ctx)
	defer cancel()
	rbErr := tx.rollback(cctx, cause)
	if rbErr == nil {
		if _, err := updateClaimed(cctx, s, kind, key, name, newMsg, cl, func(M) (bool, error) { return true, nil }); err != nil && !errors.Is(err, store.ErrNotFound) {
			s.log.Warn("could not remove PENDING record after rollback; the reconciler will", "kind", kind, "name", name, "err", err.Error())
		}
		return cause
	}
	markRollbackFailed(cctx, s, kind, key, name, newMsg, cl, rbErr)
	return fmt.Errorf("%w; %s", cause, rbErr.Error())
}

// markRollbackFailed records a failed compensation on a PENDING record and
// expires its deadline so that the reconciler picks it up.
func markRollbackFailed[M annotated](ctx context.Context, s *Services, kind, key, name string, newMsg func() M, cl claim, rbErr error) {
	_, err := updateClaimed(ctx, s, kind, key, name, newMsg, cl, func(m M) (bool, error) {
		ann := m.GetAnnotations()
		msg := rbErr.Error()
		if len(msg) > 4000 {
			msg = msg[:4000]
		}
		ann[AnnotationRollbackFailed] = msg
		ann[AnnotationPendingDeadline] = s.cfg.Now().UTC().Format(time.RFC3339Nano)
		return false, nil
	})
	if err != nil {
		s.log.Log(ctx, LevelCritical, "could not annotate failed rollback", "kind", kind, "name", name, "err", err.Error())
	}
}
