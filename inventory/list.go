package inventory

import (
	"container/heap"
	"context"
	"fmt"
	"strings"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	storev1 "github.com/corralhq/corral/api/store/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/internal/paging"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Page sizes of ListMachines (docs/architecture.md "Paged lists"). A
// machine with realistic facts and its fact history is 3-10 KB encoded,
// one reporting at the caps up to a few hundred KB: 100 full machines or
// 1000 summaries stay well under gRPC's 4 MiB default.
const (
	DefaultMachinePage = 100
	MaxFullMachinePage = 100
	MaxSummaryPage     = 1000
)

// scanBatch is how many records one store read takes while a scan reads
// every machine (a sort, EachMachine): the memory a scan holds at once
// beyond the page it answers (about 5 MB of realistic records). A page in
// name order reads a page and one more at a time instead.
const scanBatch = 1024

// machineQuery is a parsed ListMachinesRequest.
type machineQuery struct {
	req     *inventoryv1.ListMachinesRequest
	sels    Selectors
	mac     string
	summary bool
	order   machineOrder
	filter  uint64 // the page token's fingerprint of all of the above
}

// machineOrder is a parsed order_by.
type machineOrder struct {
	field string // "" for name order
	desc  bool
	value func(*inventoryv1.Machine) string
}

// orderFields are the order_by fields other than name; each renders a
// value that sorts as strings do.
var orderFields = map[string]func(*inventoryv1.Machine) string{
	"state":  func(m *inventoryv1.Machine) string { return fmt.Sprintf("%03d", m.GetState()) },
	"serial": func(m *inventoryv1.Machine) string { return m.GetSerial() },
	"created_at": func(m *inventoryv1.Machine) string {
		return fmt.Sprintf("%020d", max(0, m.GetCreatedAt().AsTime().UnixNano()))
	},
	"updated_at": func(m *inventoryv1.Machine) string {
		return fmt.Sprintf("%020d", max(0, m.GetUpdatedAt().AsTime().UnixNano()))
	},
}

func parseOrder(s string) (machineOrder, error) {
	f := strings.Fields(strings.ToLower(s))
	var o machineOrder
	if len(f) == 2 && f[1] == "desc" {
		o.desc, f = true, f[:1]
	} else if len(f) == 2 && f[1] == "asc" {
		f = f[:1]
	}
	switch {
	case len(f) == 0 || (len(f) == 1 && f[0] == "name" && !o.desc):
		return machineOrder{}, nil
	case len(f) != 1:
		return o, apierr.Invalidf("order_by %q: want a field, optionally followed by desc (name, state, serial, created_at, updated_at)", s)
	case f[0] == "name":
		o.field = "name"
		o.value = func(m *inventoryv1.Machine) string { return m.GetName() }
		return o, nil
	}
	v, ok := orderFields[f[0]]
	if !ok {
		return o, apierr.Invalidf("order_by %q: unknown field %q (name, state, serial, created_at, updated_at)", s, f[0])
	}
	o.field, o.value = f[0], v
	return o, nil
}

func parseMachineQuery(req *inventoryv1.ListMachinesRequest) (*machineQuery, error) {
	q := &machineQuery{req: req, summary: req.GetView() == inventoryv1.MachineView_MACHINE_VIEW_SUMMARY}
	var err error
	if q.sels, err = ParseSelectors(req.GetSelectors()); err != nil {
		return nil, err
	}
	if req.GetMac() != "" {
		if q.mac, err = NormalizeMAC(req.GetMac()); err != nil {
			return nil, err
		}
	}
	if q.order, err = parseOrder(req.GetOrderBy()); err != nil {
		return nil, err
	}
	parts := []string{req.GetState().String(), req.GetSerial(), q.mac, fmt.Sprint(q.summary), q.order.field, fmt.Sprint(q.order.desc), "owner=" + req.GetOwner()}
	q.filter = paging.Fingerprint(append(parts, req.GetSelectors()...)...)
	return q, nil
}

// match reports whether m passes the query's filters.
func (q *machineQuery) match(m *inventoryv1.Machine) bool {
	switch {
	case q.req.GetState() != inventoryv1.Machine_UNSPECIFIED && m.GetState() != q.req.GetState():
		return false
	case q.req.GetSerial() != "" && m.GetSerial() != q.req.GetSerial():
		return false
	case q.mac != "" && !hasMAC(m, q.mac):
		return false
	case q.req.GetOwner() != "" && m.GetAllocation().GetOwner() != q.req.GetOwner():
		return false
	}
	return q.sels.Match(m)
}

// view returns m as the query's view shows it (m itself, changed in place).
func (q *machineQuery) view(m *inventoryv1.Machine) *inventoryv1.Machine {
	if q.summary {
		Summarize(m)
	}
	return m
}

// Summarize cuts m to the SUMMARY view in place: no fact history, a
// commissioning's status and error without its tests, and of
// the facts only system vendor and product, the CPU, total memory, each
// disk's name and size and each NIC's name, MAC and link.
func Summarize(m *inventoryv1.Machine) {
	m.FactHistory = nil
	if c := m.GetCommission(); c != nil {
		// Its status, profile, error and times (the reconciler delivers
		// and bounds it by them): not every test's output.
		m.Commission = &inventoryv1.Commission{CommissionId: c.GetCommissionId(), Profile: c.GetProfile(), Status: c.GetStatus(),
			Error: c.GetError(), Cleared: c.GetCleared(), FinishedAt: c.GetFinishedAt(),
			RequestedAt: c.GetRequestedAt(), SentAt: c.GetSentAt(), UpdatedAt: c.GetUpdatedAt()}
	}
	f := m.GetFacts()
	if f == nil {
		return
	}
	s := &inventoryv1.Facts{Cpu: f.GetCpu()}
	if sys := f.GetSystem(); sys != nil {
		s.System = &inventoryv1.Facts_System{Vendor: sys.GetVendor(), Product: sys.GetProduct()}
	}
	if mem := f.GetMemory(); mem != nil {
		s.Memory = &inventoryv1.Facts_Memory{TotalBytes: mem.GetTotalBytes()}
	}
	for _, d := range f.GetDisks() {
		s.Disks = append(s.Disks, &inventoryv1.Facts_Disk{Name: d.GetName(), SizeBytes: d.GetSizeBytes()})
	}
	for _, n := range f.GetNics() {
		// The web page's table counts NICs and links up, and its search
		// looks at every MAC.
		s.Nics = append(s.Nics, &inventoryv1.Facts_Nic{Name: n.GetName(), Mac: n.GetMac(), Link: n.GetLink()})
	}
	m.Facts = s
}

// ListMachinesPage answers one page of ListMachines: the machines the
// request's filters select, in its order, at most its page size, and the
// token of the next page ("" after the last). In name order it reads the
// store a bounded range at a time (store.Pager) from the token's
// position; in another order it reads every machine, keeping only the
// page's worth. A garbled token, or one of a request with other filters,
// view or order, is apierr.ErrInvalid.
func (i *Inventory) ListMachinesPage(ctx context.Context, req *inventoryv1.ListMachinesRequest) ([]*inventoryv1.Machine, string, error) {
	q, err := parseMachineQuery(req)
	if err != nil {
		return nil, "", err
	}
	tok, err := paging.Decode(req.GetPageToken(), q.filter)
	if err != nil {
		return nil, "", err
	}
	maxSize := MaxFullMachinePage
	if q.summary {
		maxSize = MaxSummaryPage
	}
	size := paging.Size(req.GetPageSize(), DefaultMachinePage, maxSize)
	if q.order.field == "" {
		return i.pageByName(ctx, q, tok, size)
	}
	return i.pageSorted(ctx, q, tok, size)
}

// pageByName serves a page in key (name) order: read batches after the
// token's key until the page is full or the machines end.
func (i *Inventory) pageByName(ctx context.Context, q *machineQuery, tok paging.Token, size int) ([]*inventoryv1.Machine, string, error) {
	after := ""
	if tok.After != "" {
		after = machinePrefix + tok.After
	}
	var out []*inventoryv1.Machine
	var rev int64
	batch := min(size+1, scanBatch)
	for {
		kvs, r, err := store.ListPageOf(ctx, i.cfg.Store, machinePrefix, after, batch)
		if err != nil {
			return nil, "", err
		}
		if rev == 0 {
			rev = r
			if tok.Rev > rev && rev > 0 {
				return nil, "", apierr.Invalidf("page_token was made by another store (revision %d, this one is at %d): start again without a page_token", tok.Rev, rev)
			}
		}
		for k, kv := range kvs {
			m := newMachine()
			if err := record.Unmarshal(kv.Value, m); err != nil {
				return nil, "", fmt.Errorf("%s: %w", kv.Key, err)
			}
			if !q.match(m) {
				continue
			}
			out = append(out, q.view(m))
			if len(out) == size {
				// A token only when some machine is left to look at.
				more := k < len(kvs)-1 || len(kvs) == batch
				if !more {
					rest, _, err := store.ListPageOf(ctx, i.cfg.Store, machinePrefix, kv.Key, 1)
					if err != nil {
						return nil, "", err
					}
					more = len(rest) > 0
				}
				if !more {
					return out, "", nil
				}
				return out, paging.Encode(paging.Token{After: m.GetName(), Rev: rev, Filter: q.filter}), nil
			}
		}
		if len(kvs) < batch {
			return out, "", nil
		}
		after = kvs[len(kvs)-1].Key
	}
}

// sortKey is a machine's position in a sorted list: its order value, then
// its name.
type sortKey struct{ value, name string }

func (a sortKey) less(b sortKey, desc bool) bool {
	if a.value != b.value {
		return (a.value < b.value) != desc
	}
	return a.name < b.name
}

// pageHeap keeps the page's machines (their stored records) with the
// greatest in the sort order on top, so that a better one replaces it.
type pageHeap struct {
	keys []sortKey
	kvs  []store.KV
	desc bool
}

func (h *pageHeap) Len() int           { return len(h.keys) }
func (h *pageHeap) Less(a, b int) bool { return h.keys[b].less(h.keys[a], h.desc) }
func (h *pageHeap) Swap(a, b int) {
	h.keys[a], h.keys[b] = h.keys[b], h.keys[a]
	h.kvs[a], h.kvs[b] = h.kvs[b], h.kvs[a]
}
func (h *pageHeap) Push(x any) {
	e := x.(heapEntry)
	h.keys, h.kvs = append(h.keys, e.key), append(h.kvs, e.kv)
}
func (h *pageHeap) Pop() any {
	n := len(h.keys) - 1
	e := heapEntry{h.keys[n], h.kvs[n]}
	h.keys, h.kvs = h.keys[:n], h.kvs[:n]
	return e
}

type heapEntry struct {
	key sortKey
	kv  store.KV
}

// pageSorted serves a page in another order than name: one pass over
// every machine, a store read of scanBatch records at a time, keeping the
// stored records of the size first after the token's position in a heap,
// so that a page holds O(size + scanBatch) records whatever the number of
// machines; the page's records are decoded whole at the end. Without
// selectors a machine is read without its facts and fact history
// (machineHead: the order and the other filters read neither).
func (i *Inventory) pageSorted(ctx context.Context, q *machineQuery, tok paging.Token, size int) ([]*inventoryv1.Machine, string, error) {
	var from *sortKey
	if tok.After != "" {
		from = &sortKey{tok.Sort, tok.After}
	}
	headOnly := len(q.sels) == 0
	h := &pageHeap{desc: q.order.desc}
	after, beyond := "", 0 // beyond: matches after the position
	var rev int64
	for {
		kvs, r, err := store.ListPageOf(ctx, i.cfg.Store, machinePrefix, after, scanBatch)
		if err != nil {
			return nil, "", err
		}
		if rev == 0 {
			rev = r
		}
		for _, kv := range kvs {
			var m *inventoryv1.Machine
			if headOnly {
				m = machineHead(kv.Value)
			}
			if m == nil {
				if m, err = decodeMachine(kv); err != nil {
					return nil, "", err
				}
			}
			if !q.match(m) {
				continue
			}
			k := sortKey{q.order.value(m), m.GetName()}
			if from != nil && !from.less(k, q.order.desc) {
				continue
			}
			beyond++
			if h.Len() < size {
				heap.Push(h, heapEntry{k, kv})
			} else if k.less(h.keys[0], q.order.desc) {
				h.keys[0], h.kvs[0] = k, kv
				heap.Fix(h, 0)
			}
		}
		if len(kvs) < scanBatch {
			break
		}
		after = kvs[len(kvs)-1].Key
	}
	n := h.Len()
	out := make([]*inventoryv1.Machine, n)
	var last sortKey
	for j := n - 1; j >= 0; j-- {
		e := heap.Pop(h).(heapEntry)
		m, err := decodeMachine(e.kv)
		if err != nil {
			return nil, "", err
		}
		out[j] = q.view(m)
		if j == n-1 {
			last = e.key
		}
	}
	if beyond <= size || n == 0 {
		return out, "", nil
	}
	return out, paging.Encode(paging.Token{After: last.name, Sort: last.value, Rev: rev, Filter: q.filter}), nil
}

// decodeMachine decodes a stored machine whole.
func decodeMachine(kv store.KV) (*inventoryv1.Machine, error) {
	m := newMachine()
	if err := record.Unmarshal(kv.Value, m); err != nil {
		return nil, fmt.Errorf("%s: %w", kv.Key, err)
	}
	return m, nil
}

// Fields of a stored machine that machineHead leaves out.
const (
	machineFactsField       protowire.Number = 16 // facts
	machineFactHistoryField protowire.Number = 56 // fact_history
)

// machineHead decodes a stored machine without its facts and fact history,
// which are most of its bytes and of its decoding: what an order and the
// state, serial and MAC filters read. It returns nil when b is not a
// record of a machine that this build reads; the caller then decodes it
// whole (record.Unmarshal), which says what is wrong.
func machineHead(b []byte) *inventoryv1.Machine {
	var r storev1.Record
	if proto.Unmarshal(b, &r) != nil || r.GetSchemaVersion() == 0 || r.GetSchemaVersion() > record.SchemaVersion ||
		!r.GetValue().MessageIs((*inventoryv1.Machine)(nil)) {
		return nil
	}
	in := r.GetValue().GetValue()
	head := make([]byte, 0, 512)
	for len(in) > 0 {
		num, typ, n := protowire.ConsumeTag(in)
		if n < 0 {
			return nil
		}
		v := protowire.ConsumeFieldValue(num, typ, in[n:])
		if v < 0 {
			return nil
		}
		if num != machineFactsField && num != machineFactHistoryField {
			head = append(head, in[:n+v]...)
		}
		in = in[n+v:]
	}
	m := newMachine()
	if proto.Unmarshal(head, m) != nil {
		return nil
	}
	return m
}

// EachMachine calls fn with every machine the request's filters select,
// in name order and the request's view, reading the store a bounded range
// at a time, so a scan over 50,000 machines holds one batch and not every
// record (the appliance's periodic scans). Its page fields and order are
// ignored. It stops at fn's first error and returns it.
func (i *Inventory) EachMachine(ctx context.Context, req *inventoryv1.ListMachinesRequest, fn func(*inventoryv1.Machine) error) error {
	q, err := parseMachineQuery(&inventoryv1.ListMachinesRequest{
		State: req.GetState(), Serial: req.GetSerial(), Mac: req.GetMac(), Selectors: req.GetSelectors(), View: req.GetView(),
		Owner: req.GetOwner(),
	})
	if err != nil {
		return err
	}
	after := ""
	for {
		kvs, _, err := store.ListPageOf(ctx, i.cfg.Store, machinePrefix, after, scanBatch)
		if err != nil {
			return err
		}
		for _, kv := range kvs {
			m := newMachine()
			if err := record.Unmarshal(kv.Value, m); err != nil {
				return fmt.Errorf("%s: %w", kv.Key, err)
			}
			if !q.match(m) {
				continue
			}
			if err := fn(q.view(m)); err != nil {
				return err
			}
		}
		if len(kvs) < scanBatch {
			return nil
		}
		after = kvs[len(kvs)-1].Key
	}
}
