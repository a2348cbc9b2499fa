package inventory

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/internal/paging"
	"github.com/corralhq/corral/testsupport/machinefacts"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// addMachines creates machines srv-0000000 ... with realistic facts and a
// fact history, every third one INVENTORIED.
func addMachines(t testing.TB, inv *Inventory, from, n int) []string {
	t.Helper()
	var names []string
	for i := from; i < from+n; i++ {
		m, err := inv.CreateMachine(context.Background(), &inventoryv1.Machine{
			Name: fmt.Sprintf("srv-%07d", i), Serial: fmt.Sprintf("SRV-%07d", i), BootMac: machinefacts.ServerMAC(i, 0),
			Facts:       machinefacts.Server(i),
			FactHistory: []*inventoryv1.FactChange{{At: timestamppb.Now(), Path: "memory.total_bytes", Before: "256Gi", After: "512Gi"}},
		})
		if err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 {
			if _, err := inv.UpdateMachine(context.Background(), m.GetName(), func(m *inventoryv1.Machine) error {
				m.State = inventoryv1.Machine_INVENTORIED
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		names = append(names, m.GetName())
	}
	return names
}

// pages reads every page of req through the gRPC edge.
func pages(t *testing.T, srv *MachineServer, req *inventoryv1.ListMachinesRequest) (names []string, ms []*inventoryv1.Machine, n int) {
	t.Helper()
	err := paging.All(t.Context(), 0, func(ctx context.Context, tok string) ([]*inventoryv1.Machine, string, error) {
		req.PageToken = tok
		resp, err := srv.ListMachines(ctx, req)
		n++
		return resp.GetMachines(), resp.GetNextPageToken(), err
	}, func(m *inventoryv1.Machine) error {
		names = append(names, m.GetName())
		ms = append(ms, m)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names, ms, n
}

func TestListMachinesPages(t *testing.T) {
	inv := newInv(t, Config{})
	srv := &MachineServer{Inv: inv}
	all := addMachines(t, inv, 0, 250)
	for name, tc := range map[string]struct {
		req       *inventoryv1.ListMachinesRequest
		want      []string
		wantPages int
	}{
		"default size":   {&inventoryv1.ListMachinesRequest{}, all, 3},
		"size 1":         {&inventoryv1.ListMachinesRequest{PageSize: 1}, all, 250},
		"size 7 summary": {&inventoryv1.ListMachinesRequest{PageSize: 7, View: inventoryv1.MachineView_MACHINE_VIEW_SUMMARY}, all, 36},
		"exact fit":      {&inventoryv1.ListMachinesRequest{PageSize: 1000, View: inventoryv1.MachineView_MACHINE_VIEW_SUMMARY}, all, 1},
		"full clamped":   {&inventoryv1.ListMachinesRequest{PageSize: 1000, View: inventoryv1.MachineView_MACHINE_VIEW_FULL}, all, 3},
		"state filter": {&inventoryv1.ListMachinesRequest{PageSize: 10, State: inventoryv1.Machine_INVENTORIED},
			everyThird(all), 9},
		"selector": {&inventoryv1.ListMachinesRequest{PageSize: 10, Selectors: []string{"serial=SRV-0000042"}}, []string{"srv-0000042"}, 1},
		"name desc": {&inventoryv1.ListMachinesRequest{PageSize: 30, OrderBy: "name desc"},
			reversed(all), 9},
	} {
		t.Run(name, func(t *testing.T) {
			got, _, n := pages(t, srv, tc.req)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("machines (-want +got):\n%s", diff)
			}
			if n != tc.wantPages {
				t.Errorf("%d pages, want %d", n, tc.wantPages)
			}
		})
	}
}

func reversed(s []string) []string {
	out := slices.Clone(s)
	slices.Reverse(out)
	return out
}

func everyThird(s []string) []string {
	var out []string
	for i := 0; i < len(s); i += 3 {
		out = append(out, s[i])
	}
	return out
}

func TestListMachinesViews(t *testing.T) {
	inv := newInv(t, Config{})
	srv := &MachineServer{Inv: inv}
	addMachines(t, inv, 0, 3)
	_, full, _ := pages(t, srv, &inventoryv1.ListMachinesRequest{})
	_, sum, _ := pages(t, srv, &inventoryv1.ListMachinesRequest{View: inventoryv1.MachineView_MACHINE_VIEW_SUMMARY})
	for k, m := range full {
		if len(m.GetFactHistory()) != 1 || len(m.GetFacts().GetMemory().GetDimms()) != 16 || len(m.GetFacts().GetNics()) != 4 {
			t.Errorf("FULL %s lacks facts: %d history, %d DIMMs", m.GetName(), len(m.GetFactHistory()), len(m.GetFacts().GetMemory().GetDimms()))
		}
		s := sum[k]
		f := s.GetFacts()
		if len(s.GetFactHistory()) != 0 || len(f.GetMemory().GetDimms()) != 0 || len(f.GetPciDevices()) != 0 || f.GetBaseboard() != nil {
			t.Errorf("SUMMARY %s keeps more than the table's facts: %v", s.GetName(), f)
		}
		if f.GetSystem().GetProduct() != "PowerEdge R760" || f.GetCpu().GetThreads() != 128 || f.GetMemory().GetTotalBytes() != 512<<30 ||
			len(f.GetDisks()) != 4 || f.GetDisks()[0].GetSizeBytes() != 3840<<30 || f.GetDisks()[0].GetSerial() != "" ||
			len(f.GetNics()) != 4 || f.GetNics()[0].GetMac() == "" || !f.GetNics()[0].GetLink() || f.GetNics()[0].GetDriver() != "" {
			t.Errorf("SUMMARY %s lacks the table's facts: %v", s.GetName(), f)
		}
		if s.GetSerial() != m.GetSerial() || s.GetState() != m.GetState() || s.GetBootMac() != m.GetBootMac() {
			t.Errorf("SUMMARY %s differs outside facts", s.GetName())
		}
	}
	// Selectors match the full facts, whatever the view.
	got, _, _ := pages(t, srv, &inventoryv1.ListMachinesRequest{View: inventoryv1.MachineView_MACHINE_VIEW_SUMMARY, Selectors: []string{"baseboard.serial=BB-SRV-0000001"}})
	if !slices.Equal(got, []string{"srv-0000001"}) {
		t.Errorf("selector on a fact the summary leaves out: %v", got)
	}
}

func TestListMachinesOrder(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	var tick time.Duration
	var mu sync.Mutex
	inv := newInv(t, Config{Now: func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		tick += time.Second
		return now.Add(-tick) // each machine older than the one before
	}})
	srv := &MachineServer{Inv: inv}
	addMachines(t, inv, 0, 40)
	_, all, _ := pages(t, srv, &inventoryv1.ListMachinesRequest{PageSize: 100})
	for _, order := range []string{"state", "state desc", "created_at", "updated_at desc", "serial desc", "name", "name asc"} {
		o, err := parseOrder(order)
		if err != nil {
			t.Fatal(err)
		}
		want := slices.Clone(all)
		sort.SliceStable(want, func(a, b int) bool {
			if o.field == "" {
				return want[a].GetName() < want[b].GetName()
			}
			ka := sortKey{o.value(want[a]), want[a].GetName()}
			return ka.less(sortKey{o.value(want[b]), want[b].GetName()}, o.desc)
		})
		var wantNames []string
		for _, m := range want {
			wantNames = append(wantNames, m.GetName())
		}
		for _, size := range []int32{1, 6, 40, 100} {
			got, _, _ := pages(t, srv, &inventoryv1.ListMachinesRequest{OrderBy: order, PageSize: size, View: inventoryv1.MachineView_MACHINE_VIEW_SUMMARY})
			if diff := cmp.Diff(wantNames, got); diff != "" {
				t.Errorf("order %q, pages of %d (-want +got):\n%s", order, size, diff)
			}
		}
	}
	if _, err := srv.ListMachines(t.Context(), &inventoryv1.ListMachinesRequest{OrderBy: "facts.memory"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("an unknown order: %v, want InvalidArgument", err)
	}
}

func TestListMachinesTokenRefused(t *testing.T) {
	inv := newInv(t, Config{})
	srv := &MachineServer{Inv: inv}
	addMachines(t, inv, 0, 5)
	ctx := t.Context()
	first, err := srv.ListMachines(ctx, &inventoryv1.ListMachinesRequest{PageSize: 2, State: inventoryv1.Machine_DISCOVERED})
	if err != nil || first.GetNextPageToken() == "" {
		t.Fatalf("first page: %v, token %q", err, first.GetNextPageToken())
	}
	tok := first.GetNextPageToken()
	for name, req := range map[string]*inventoryv1.ListMachinesRequest{
		"garbled":        {PageToken: "garbage", State: inventoryv1.Machine_DISCOVERED},
		"truncated":      {PageToken: tok[:len(tok)-4], State: inventoryv1.Machine_DISCOVERED},
		"other state":    {PageToken: tok, State: inventoryv1.Machine_INVENTORIED},
		"no filter":      {PageToken: tok},
		"other view":     {PageToken: tok, State: inventoryv1.Machine_DISCOVERED, View: inventoryv1.MachineView_MACHINE_VIEW_SUMMARY},
		"other order":    {PageToken: tok, State: inventoryv1.Machine_DISCOVERED, OrderBy: "serial"},
		"other selector": {PageToken: tok, State: inventoryv1.Machine_DISCOVERED, Selectors: []string{"disks>=1"}},
		"another store":  {PageToken: paging.Encode(paging.Token{After: "srv-0000001", Rev: 1 << 40, Filter: mustQuery(t, &inventoryv1.ListMachinesRequest{}).filter})},
	} {
		_, err := srv.ListMachines(ctx, req)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	// The same filter with another page size is the same list.
	if _, err := srv.ListMachines(ctx, &inventoryv1.ListMachinesRequest{PageToken: tok, PageSize: 50, State: inventoryv1.Machine_DISCOVERED}); err != nil {
		t.Errorf("the token with another page size: %v", err)
	}
	if _, _, err := inv.ListMachinesPage(ctx, &inventoryv1.ListMachinesRequest{PageToken: "x"}); !errors.Is(err, apierr.ErrInvalid) {
		t.Errorf("Inventory: %v, want ErrInvalid", err)
	}
}

func mustQuery(t *testing.T, req *inventoryv1.ListMachinesRequest) *machineQuery {
	q, err := parseMachineQuery(req)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// TestListMachinesPagesConcurrent: while machines are created and deleted
// between and during page reads, every machine present throughout is
// listed exactly once and none twice.
func TestListMachinesPagesConcurrent(t *testing.T) {
	inv := newInv(t, Config{})
	srv := &MachineServer{Inv: inv}
	stable := addMachines(t, inv, 0, 300)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ctx.Err() == nil; n++ {
				// Names interleave with the stable ones (srv-0000000a).
				i := 1000 + w*100000 + n
				name := fmt.Sprintf("srv-%07d%c", (n*7)%300, 'a'+w)
				if _, err := inv.CreateMachine(ctx, &inventoryv1.Machine{Name: name, BootMac: machinefacts.ServerMAC(i, 0), Facts: machinefacts.Server(i)}); err != nil {
					continue
				}
				if err := inv.DeleteMachine(ctx, name); err != nil && ctx.Err() == nil {
					t.Error(err)
				}
			}
		}()
	}
	for _, size := range []int32{3, 17, 100} {
		got, _, _ := pages(t, srv, &inventoryv1.ListMachinesRequest{PageSize: size, View: inventoryv1.MachineView_MACHINE_VIEW_SUMMARY})
		seen := map[string]int{}
		for _, n := range got {
			seen[n]++
			if seen[n] == 2 {
				t.Errorf("pages of %d: %s listed twice", size, n)
			}
		}
		for _, n := range stable {
			if seen[n] != 1 {
				t.Errorf("pages of %d: %s listed %d times", size, n, seen[n])
			}
		}
	}
	cancel()
	wg.Wait()
}
