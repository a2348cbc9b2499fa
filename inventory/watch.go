package inventory

import (
	"slices"
	"strings"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/internal/watchstream"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
)

// DefaultWatchTimelineLimit is how many timeline entries WatchTimeline
// sends first when the request names no limit.
const DefaultWatchTimelineLimit = 50

// WatchMachines streams machines as the corral.watch.v1 contract says
// (internal/watchstream): the objects are the records ListMachines and
// GetMachine return, a state filter sends machines leaving it as DELETED.
func (s *MachineServer) WatchMachines(req *inventoryv1.WatchMachinesRequest, stream inventoryv1.MachineService_WatchMachinesServer) error {
	prefix := machinePrefix
	if name := req.GetName(); name != "" {
		if err := CheckName(name); err != nil {
			return apierr.ToStatus(err)
		}
		prefix += name
	}
	var match func(*inventoryv1.Machine) bool
	if st := req.GetState(); st != inventoryv1.Machine_UNSPECIFIED {
		match = func(m *inventoryv1.Machine) bool { return m.GetState() == st }
	}
	if who := s.caller(stream.Context()); !who.Operator {
		// Another caller's machines are not this caller's to see: one that
		// another caller allocates arrives as DELETED.
		byState := match
		match = func(m *inventoryv1.Machine) bool { return who.Sees(m) && (byState == nil || byState(m)) }
	}
	exact := req.GetName() != ""
	summary := req.GetView() == inventoryv1.MachineView_MACHINE_VIEW_SUMMARY
	err := watchstream.Run(stream.Context(), watchstream.Config[*inventoryv1.Machine]{
		Name:         "machines",
		Store:        s.Inv.cfg.Store,
		Prefix:       prefix,
		FromRevision: req.GetFromRevision(),
		Limiter:      s.Watchers,
		Logger:       s.Inv.log,
		Decode: func(kv store.KV) (*inventoryv1.Machine, bool, error) {
			if exact && kv.Key != prefix {
				return nil, false, nil // another machine whose name extends this one
			}
			m := newMachine()
			if err := record.Unmarshal(kv.Value, m); err != nil {
				return nil, false, err
			}
			if summary {
				// Cut before the first list holds every machine: the
				// filters read only what SUMMARY keeps (state, owner).
				Summarize(m)
			}
			return m, true, nil
		},
		Deleted: func(key string) (*inventoryv1.Machine, bool) {
			if exact && key != prefix {
				return nil, false
			}
			return &inventoryv1.Machine{Name: strings.TrimPrefix(key, machinePrefix)}, true
		},
		Match: match,
	}, func(ev watchstream.Event[*inventoryv1.Machine]) error {
		return stream.Send(&inventoryv1.MachineEvent{Type: ev.Type, Revision: ev.Revision, Machine: ev.Object})
	})
	return apierr.ToStatus(err)
}

// WatchTimeline follows the boot timeline of one MAC, or of every MAC a
// named machine has when the watch starts: the newest limit entries
// (default 50, oldest first) and SYNCED, then each new entry as ADDED.
// Entries trimmed away by the timeline's bounds are not reported.
func (s *MachineServer) WatchTimeline(req *inventoryv1.WatchTimelineRequest, stream inventoryv1.MachineService_WatchTimelineServer) error {
	var macs []string
	switch {
	case req.GetMac() != "":
		mac, err := NormalizeMAC(req.GetMac())
		if err == nil {
			err = s.checkSees(stream.Context(), "", mac)
		}
		if err != nil {
			return apierr.ToStatus(err)
		}
		macs = []string{mac}
	case req.GetName() != "":
		m, err := s.Inv.GetMachine(stream.Context(), req.GetName())
		if err == nil && !s.caller(stream.Context()).Sees(m) {
			err = hidden(req.GetName())
		}
		if err != nil {
			return apierr.ToStatus(err)
		}
		macs = m.GetMacs()
		if len(macs) == 0 && m.GetBootMac() != "" {
			macs = []string{m.GetBootMac()}
		}
	default:
		return apierr.ToStatus(apierr.Invalidf("watch timeline: a machine name or a MAC is required"))
	}
	prefix := timelinePrefix
	if len(macs) == 1 {
		prefix += macs[0] + "/"
	}
	limit := int(req.GetLimit())
	if limit <= 0 {
		limit = DefaultWatchTimelineLimit
	}
	err := watchstream.Run(stream.Context(), watchstream.Config[*inventoryv1.TimelineEntry]{
		Name:         "timeline",
		Store:        s.Inv.cfg.Store,
		Prefix:       prefix,
		FromRevision: req.GetFromRevision(),
		Limiter:      s.Watchers,
		Logger:       s.Inv.log,
		Decode: func(kv store.KV) (*inventoryv1.TimelineEntry, bool, error) {
			mac, _, ok := strings.Cut(strings.TrimPrefix(kv.Key, timelinePrefix), "/")
			if !ok || !slices.Contains(macs, mac) {
				return nil, false, nil
			}
			e := &inventoryv1.TimelineEntry{}
			if err := record.Unmarshal(kv.Value, e); err != nil {
				return nil, false, err
			}
			return e, true, nil
		},
		WriteOnce: true,
		// Entries are deleted only by the timeline's own trimming.
		Deleted: func(string) (*inventoryv1.TimelineEntry, bool) { return nil, false },
		Initial: func(es []*inventoryv1.TimelineEntry) []*inventoryv1.TimelineEntry {
			slices.SortStableFunc(es, func(a, b *inventoryv1.TimelineEntry) int {
				return a.GetAt().AsTime().Compare(b.GetAt().AsTime())
			})
			if len(es) > limit {
				es = es[len(es)-limit:]
			}
			return es
		},
	}, func(ev watchstream.Event[*inventoryv1.TimelineEntry]) error {
		return stream.Send(&inventoryv1.TimelineEvent{Type: ev.Type, Revision: ev.Revision, Entry: ev.Object})
	})
	return apierr.ToStatus(err)
}
