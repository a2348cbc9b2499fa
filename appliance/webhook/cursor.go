package webhook

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	webhookv1 "github.com/corralhq/corral/api/webhook/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
)

// DefaultCursorInterval is how often the leader writes the receivers'
// delivery cursors (Config.CursorInterval).
const DefaultCursorInterval = 2 * time.Second

// Cursor is a receiver's delivery cursor as stored under
// store.WebhookCursorsPrefix: every event of a store revision <= Revision
// was delivered to the receiver, refused by it, or given up on. A new
// leader resumes the receiver after it.
type Cursor struct {
	Revision int64
}

func cursorKey(name string) string { return store.WebhookCursorsPrefix + name }

// ReadCursor returns name's stored cursor; ok is false when none is
// stored (the receiver never delivered on any leader).
func ReadCursor(ctx context.Context, st store.Store, name string) (c Cursor, ok bool, err error) {
	s := &webhookv1.DeliveryCursor{}
	if _, err := record.Get(ctx, st, cursorKey(name), s); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return Cursor{}, false, nil
		}
		return Cursor{}, false, err
	}
	return Cursor{Revision: s.GetRevision()}, true, nil
}

// AdvanceCursor moves name's stored cursor to rev by compare-and-swap,
// never backwards: an old leader still flushing cannot undo a newer
// leader's progress (and what it flushes it did deliver). It returns the
// stored revision.
func AdvanceCursor(ctx context.Context, st store.Store, name string, rev int64) (int64, error) {
	var stored int64
	_, err := record.Update(ctx, st, cursorKey(name), func() *webhookv1.DeliveryCursor { return &webhookv1.DeliveryCursor{} },
		func(c *webhookv1.DeliveryCursor, _ bool) (bool, error) {
			if cur := c.GetRevision(); cur >= rev {
				stored = cur
				return false, errUnchanged
			}
			stored = rev
			c.Revision, c.UpdatedAt = rev, timestamppb.Now()
			return false, nil
		})
	if errors.Is(err, errUnchanged) {
		err = nil
	}
	return stored, err
}

var errUnchanged = errors.New("cursor already there")

// oldestRE reads the oldest revision a store can resume from out of its
// ErrCompacted text (store/etcd and store/internal/watch word it alike).
var oldestRE = regexp.MustCompile(`oldest revision this store can resume from is (\d+)`)

// oldestAvailable is the revision a watch may resume after once afterRev
// is compacted: the one err names, else the store's current revision.
func (d *Dispatcher) oldestAvailable(ctx context.Context, err error) (int64, error) {
	if m := oldestRE.FindStringSubmatch(err.Error()); m != nil {
		if n, perr := strconv.ParseInt(m[1], 10, 64); perr == nil {
			return n, nil
		}
	}
	return d.hw.Revision(ctx)
}

// historyLost records that the events of revisions (from, to] were
// compacted before name got them: counted, logged, and marked on the
// receiver's record (its cut_reason, with cut_at unset: the receiver is not
// cut off) so `corral webhook list` shows it.
func (d *Dispatcher) historyLost(name string, from, to int64) {
	d.metrics.lost.WithLabelValues(name).Inc()
	d.log.Warn("webhook: store history compacted past the receiver's cursor; events in between are lost, continuing from the oldest revision kept",
		"webhook", name, "cursor", from, "resumed_after", to)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := record.Update(ctx, d.cfg.Store, store.WebhooksPrefix+name, func() *webhookv1.Receiver { return &webhookv1.Receiver{} },
			func(r *webhookv1.Receiver, exists bool) (bool, error) {
				if !exists {
					return false, errGone
				}
				if r.CutAt != nil {
					return false, errUnchanged
				}
				r.CutReason = fmt.Sprintf("%s revisions %d-%d compacted before delivery (at %s)", HistoryLostMark, from+1, to,
					timestamppb.Now().AsTime().UTC().Format(time.RFC3339))
				return false, nil
			})
		if err != nil && !errors.Is(err, errGone) && !errors.Is(err, errUnchanged) {
			d.log.Warn("webhook: record the history gap", "webhook", name, "err", err)
		}
	}()
}

// HistoryLostMark starts the cut_reason of a receiver that is not cut off
// but missed events because the store's history no longer reached back to
// its cursor.
const HistoryLostMark = "history lost:"

// advance moves t's in-memory cursor forward to rev.
func (t *target) advance(rev int64) {
	for {
		cur := t.done.Load()
		if rev <= cur || t.done.CompareAndSwap(cur, rev) {
			return
		}
	}
}

// settle advances t's cursor to the revision the follower has handed out
// when nothing of t's is queued or in flight. seen is read before pending:
// every event at or below seen was counted in pending before seen moved.
func (d *Dispatcher) settle(t *target) {
	seen := d.seen.Load()
	if t.pending.Load() == 0 {
		t.advance(seen)
	}
}

// flushCursors writes every serving receiver's cursor that moved since
// its last write: one compare-and-swap per receiver per interval, not one
// per event.
func (d *Dispatcher) flushCursors(ctx context.Context) {
	d.mu.Lock()
	ts := make([]*target, 0, len(d.targets))
	for _, t := range d.targets {
		if !t.cut.Load() {
			d.settle(t)
			ts = append(ts, t)
		}
	}
	d.mu.Unlock()
	for _, t := range ts {
		rev := t.done.Load()
		if rev <= t.flushed.Load() {
			continue
		}
		stored, err := AdvanceCursor(ctx, d.cfg.Store, t.name, rev)
		if err != nil {
			if ctx.Err() == nil {
				d.log.Warn("webhook: write the delivery cursor", "webhook", t.name, "err", err)
			}
			continue
		}
		t.flushed.Store(stored)
		d.metrics.cursor.WithLabelValues(t.name).Set(float64(stored))
	}
}
