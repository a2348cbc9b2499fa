package inventory

import (
	"fmt"
	"slices"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/store/record"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
)

// addPlain creates machines name0000..., without facts, with the given
// serial for each (so a test chooses its ties).
func addPlain(t *testing.T, inv *Inventory, serials []string) []string {
	t.Helper()
	var names []string
	for i, s := range serials {
		m, err := inv.CreateMachine(t.Context(), &inventoryv1.Machine{Name: fmt.Sprintf("m%05d", i), Serial: s, BootMac: fmt.Sprintf("02:00:00:00:%02x:%02x", i>>8, i&0xff)})
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, m.GetName())
	}
	return names
}

// TestListMachinesSortedEdges: in an order other than name, machines with
// the same value come by name (ascending, in either direction), the last
// page carries no token (also when it is exactly full), and an order over
// more machines than one store read (scanBatch) is whole.
func TestListMachinesSortedEdges(t *testing.T) {
	inv := newInv(t, Config{})
	srv := &MachineServer{Inv: inv}
	// 26 machines, serials in three runs of ties: A×10, B×6, C×10,
	// created in an order that is not the serial order.
	var serials []string
	for i := range 26 {
		serials = append(serials, string(rune('A'+[]int{0, 2, 1}[i%3])))
	}
	names := addPlain(t, inv, serials)
	byValue := func(desc bool) []string {
		out := slices.Clone(names)
		slices.SortStableFunc(out, func(a, b string) int {
			sa, sb := serials[slices.Index(names, a)], serials[slices.Index(names, b)]
			if sa != sb {
				if (sa < sb) != desc {
					return -1
				}
				return 1
			}
			if a < b {
				return -1
			}
			return 1
		})
		return out
	}
	for name, tc := range map[string]struct {
		order     string
		size      int32
		want      []string
		wantPages int
	}{
		"ties, pages of 4":             {"serial", 4, byValue(false), 7},
		"ties desc, pages of 4":        {"serial desc", 4, byValue(true), 7},
		"ties, pages of 13 (exact)":    {"serial", 13, byValue(false), 2},
		"ties, one page of 26":         {"serial", 26, byValue(false), 1},
		"ties, a page beyond the end":  {"serial desc", 100, byValue(true), 1},
		"all tied (state), pages of 5": {"state", 5, names, 6},
	} {
		t.Run(name, func(t *testing.T) {
			got, _, n := pages(t, srv, &inventoryv1.ListMachinesRequest{OrderBy: tc.order, PageSize: tc.size, View: inventoryv1.MachineView_MACHINE_VIEW_SUMMARY})
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if n != tc.wantPages {
				t.Errorf("%d pages, want %d (the last one without a token)", n, tc.wantPages)
			}
		})
	}
}

// TestListMachinesSortedChangesBetweenPages: a machine deleted between
// two pages (the one the token names among them) is not listed after,
// the others are listed once each in order, and a machine created
// between pages is listed when it sorts after the token's position and
// not when it sorts before.
func TestListMachinesSortedChangesBetweenPages(t *testing.T) {
	ctx := t.Context()
	inv := newInv(t, Config{})
	var serials []string
	for i := range 20 {
		serials = append(serials, fmt.Sprintf("S%02d", 19-i)) // m00000 has S19: serial order is reverse name order
	}
	addPlain(t, inv, serials)
	req := &inventoryv1.ListMachinesRequest{OrderBy: "serial", PageSize: 5}
	first, tok, err := inv.ListMachinesPage(ctx, req)
	if err != nil || tok == "" {
		t.Fatalf("first page: %v, token %q", err, tok)
	}
	var got []string
	for _, m := range first {
		got = append(got, m.GetSerial())
	}
	// The page's last machine (the token's position), one on the next
	// page and one further on go; one sorting before the position and one
	// after it come.
	for _, name := range []string{"m00015" /* S04 */, "m00014" /* S05 */, "m00002" /* S17 */} {
		if err := inv.DeleteMachine(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range []*inventoryv1.Machine{
		{Name: "late-before", Serial: "S00a", BootMac: "02:00:00:01:00:01"},
		{Name: "late-after", Serial: "S10a", BootMac: "02:00:00:01:00:02"},
	} {
		if _, err := inv.CreateMachine(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	for tok != "" {
		req.PageToken = tok
		var ms []*inventoryv1.Machine
		if ms, tok, err = inv.ListMachinesPage(ctx, req); err != nil {
			t.Fatal(err)
		}
		if len(ms) > 5 {
			t.Errorf("a page of %d, want at most 5", len(ms))
		}
		for _, m := range ms {
			got = append(got, m.GetSerial())
		}
	}
	want := []string{"S00", "S01", "S02", "S03", "S04", // the first page, read before the changes
		"S06", "S07", "S08", "S09", "S10", "S10a", "S11", "S12", "S13", "S14", "S15", "S16", "S18", "S19"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("serials listed (-want +got):\n%s", diff)
	}
}

// TestListMachinesSortedManyBatches: a sorted list over more machines than
// one store read returns every machine once, in order, and its pages are
// at most their size.
func TestListMachinesSortedManyBatches(t *testing.T) {
	inv := newInv(t, Config{})
	srv := &MachineServer{Inv: inv}
	n := scanBatch + scanBatch/2
	var serials []string
	for i := range n {
		serials = append(serials, fmt.Sprintf("S%05d", (i*7919)%n)) // a permutation
	}
	addPlain(t, inv, serials)
	want := slices.Sorted(slices.Values(serials))
	slices.Reverse(want)
	_, ms, pagesRead := pages(t, srv, &inventoryv1.ListMachinesRequest{OrderBy: "serial desc", PageSize: 1000, View: inventoryv1.MachineView_MACHINE_VIEW_SUMMARY})
	var gotSerials []string
	for _, m := range ms {
		gotSerials = append(gotSerials, m.GetSerial())
	}
	if !slices.Equal(want, gotSerials) {
		t.Errorf("%d machines listed, want %d in serial order, descending", len(gotSerials), len(want))
	}
	if pagesRead != 2 {
		t.Errorf("%d pages, want 2", pagesRead)
	}
}

// TestMachineHead: the head of a stored machine is the machine without
// its facts and fact history; what is not a machine record has none.
func TestMachineHead(t *testing.T) {
	inv := newInv(t, Config{})
	addMachines(t, inv, 0, 3)
	kvs, err := inv.cfg.Store.List(t.Context(), machinePrefix)
	if err != nil || len(kvs) != 3 {
		t.Fatalf("%d records, %v", len(kvs), err)
	}
	for _, kv := range kvs {
		whole, err := decodeMachine(kv)
		if err != nil {
			t.Fatal(err)
		}
		if whole.GetFacts() == nil || len(whole.GetFactHistory()) == 0 {
			t.Fatal("the test machine has no facts or fact history")
		}
		whole.Facts, whole.FactHistory = nil, nil
		if diff := cmp.Diff(whole, machineHead(kv.Value), protocmp.Transform()); diff != "" {
			t.Errorf("%s (-whole without facts +head):\n%s", kv.Key, diff)
		}
	}
	node, err := record.Marshal(&poolv1.Node{Name: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"garbage": []byte("\xff\xff"), "empty": nil, "a node": node} {
		if m := machineHead(b); m != nil {
			t.Errorf("%s: %v, want nil", name, m)
		}
	}
}
