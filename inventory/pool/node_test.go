package pool

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store/mem"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func TestApplyNodeCreates(t *testing.T) {
	e := newEnv(t)
	req := &poolv1.ApplyNodeRequest{
		Name:             "hv1",
		Annotations:      map[string]string{"corral/owner": "ops"},
		Labels:           map[string]string{"tier": "gold"},
		Address:          "10.1.0.11",
		IpmiAddress:      "bmc-hv1.lab:623",
		Serial:           "SN123",
		CpuMilliCores:    32000,
		MemoryBytes:      128 * gib,
		StorageBytes:     2 * tib,
		Datacenter:       "dc1",
		AvailabilityZone: "az1",
		Cell:             "c1",
		Rack:             "r7",
		Unit:             12,
		HypervisorPort:   20181,
	}
	want := &poolv1.Node{
		Name:             "hv1",
		Annotations:      map[string]string{"corral/owner": "ops"},
		Labels:           map[string]string{"tier": "gold"},
		Address:          "10.1.0.11",
		IpmiAddress:      "bmc-hv1.lab:623",
		Serial:           "SN123",
		CpuMilliCores:    32000,
		MemoryBytes:      128 * gib,
		StorageBytes:     2 * tib,
		Datacenter:       "dc1",
		AvailabilityZone: "az1",
		Cell:             "c1",
		Rack:             "r7",
		Unit:             12,
		HypervisorPort:   20181,
		State:            poolv1.Node_READY,
		LastHeartbeat:    timestamppb.New(t0),
	}
	got := e.applyNode(t, req)
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Errorf("ApplyNode returned (-want +got):\n%s", diff)
	}
	stored, err := e.p.GetNode(context.Background(), "hv1")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, stored, protocmp.Transform()); diff != "" {
		t.Errorf("GetNode (-want +got):\n%s", diff)
	}
	// The request is not aliased by the stored node.
	req.Labels["tier"] = "changed"
	if stored.GetLabels()["tier"] != "gold" {
		t.Error("stored labels alias the request map")
	}
}

func TestApplyNodeKeepsReservations(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.applyNode(t, nodeReq("hv1", 8000, 16*gib, tib))
	e.reserveCompute(t, "hv1", "vm1", compute(2000, 4*gib))
	if _, err := e.p.ReserveStorage(ctx, "hv1", "vol1", &poolv1.Storage{RequestBytes: 10 * gib, LimitBytes: 20 * gib}); err != nil {
		t.Fatal(err)
	}
	// A node that went NOT_READY comes back READY when re-applied.
	e.setNodeState(t, "hv1", poolv1.Node_NOT_READY)
	t1 := t0.Add(time.Minute)
	e.clock.Set(t1)

	req := nodeReq("hv1", 16000, 32*gib, 2*tib)
	req.Labels = map[string]string{"new": "label"}
	got := e.applyNode(t, req)
	want := &poolv1.Node{
		Name:             "hv1",
		Labels:           map[string]string{"new": "label"},
		CpuMilliCores:    16000,
		MemoryBytes:      32 * gib,
		StorageBytes:     2 * tib,
		State:            poolv1.Node_READY,
		LastHeartbeat:    timestamppb.New(t1),
		ReservedComputes: map[string]*poolv1.Compute{"vm1": compute(2000, 4*gib)},
		ReservedStorages: map[string]*poolv1.Storage{"vol1": {RequestBytes: 10 * gib, LimitBytes: 20 * gib}},
	}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Errorf("re-applied node (-want +got):\n%s", diff)
	}
}

func TestApplyNodeShrink(t *testing.T) {
	tests := map[string]struct {
		req     *poolv1.ApplyNodeRequest
		wantErr error
	}{
		"cpu below requests":           {req: nodeReq("hv1", 3999, 16*gib, 100*gib), wantErr: apierr.ErrPrecondition},
		"memory below requests":        {req: nodeReq("hv1", 8000, 8*gib-1, 100*gib), wantErr: apierr.ErrPrecondition},
		"storage below requests":       {req: nodeReq("hv1", 8000, 16*gib, 10*gib-1), wantErr: apierr.ErrPrecondition},
		"storage to zero":              {req: nodeReq("hv1", 8000, 16*gib, 0), wantErr: apierr.ErrPrecondition},
		"cpu limits above ratio":       {req: nodeReq("hv1", 4000, 16*gib, 100*gib), wantErr: apierr.ErrPrecondition}, // limits 20000 > 4 x 4000
		"memory limits above ratio":    {req: nodeReq("hv1", 8000, 9*gib, 100*gib), wantErr: apierr.ErrPrecondition},  // limits 10 GiB > 1 x 9 GiB
		"storage limits above ratio":   {req: nodeReq("hv1", 8000, 16*gib, 15*gib), wantErr: apierr.ErrPrecondition},  // limits 20 GiB > 1 x 15 GiB
		"shrink to exactly the limits": {req: nodeReq("hv1", 5000, 10*gib, 20*gib)},
		"grow":                         {req: nodeReq("hv1", 64000, 256*gib, tib)},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			e := newEnv(t)
			e.applyNode(t, nodeReq("hv1", 8000, 16*gib, 100*gib))
			e.reserveCompute(t, "hv1", "vm1", &poolv1.Compute{RequestCpuMilliCore: 4000, LimitCpuMilliCore: 20000, RequestMemoryBytes: 8 * gib, LimitMemoryBytes: 10 * gib})
			if _, err := e.p.ReserveStorage(ctx, "hv1", "vol1", &poolv1.Storage{RequestBytes: 10 * gib, LimitBytes: 20 * gib}); err != nil {
				t.Fatal(err)
			}
			before := e.snapshot(t)
			_, err := e.p.ApplyNode(ctx, tc.req)
			wantErr(t, err, tc.wantErr)
			if err != nil {
				e.assertUnchanged(t, before)
				return
			}
			got, _ := e.p.GetNode(ctx, "hv1")
			if got.GetCpuMilliCores() != tc.req.GetCpuMilliCores() || len(got.GetReservedComputes()) != 1 || len(got.GetReservedStorages()) != 1 {
				t.Errorf("node after apply = %v", got)
			}
		})
	}
}

// TestApplyNodeAfterRatioLowered: a node whose reservations were made under
// a higher limit ratio can still be re-applied (heartbeat) unchanged or
// grown, but not shrunk further.
func TestApplyNodeAfterRatioLowered(t *testing.T) {
	ctx := context.Background()
	s := mem.New()
	t.Cleanup(func() { s.Close() })
	e := newEnvOn(t, s)
	e.applyNode(t, nodeReq("hv1", 4000, 8*gib, 0))
	e.reserveCompute(t, "hv1", "vm1", &poolv1.Compute{RequestCpuMilliCore: 1000, LimitCpuMilliCore: 16000, RequestMemoryBytes: gib, LimitMemoryBytes: gib})
	lowered := newEnvOn(t, s, func(c *Config) { c.CPULimitRatio = 2 })
	if _, err := lowered.p.ApplyNode(ctx, nodeReq("hv1", 4000, 8*gib, 0)); err != nil {
		t.Errorf("unchanged re-apply: %v", err)
	}
	if _, err := lowered.p.ApplyNode(ctx, nodeReq("hv1", 4000, 4*gib, 0)); err != nil {
		t.Errorf("re-apply shrinking only memory: %v", err)
	}
	_, err := lowered.p.ApplyNode(ctx, nodeReq("hv1", 3999, 8*gib, 0))
	wantErr(t, err, apierr.ErrPrecondition)
	wantContains(t, err, "cpu capacity 3999", "limits 16000")
}

func TestListNodes(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	got, err := e.p.ListNodes(ctx)
	if err != nil {
		t.Fatalf("ListNodes on an empty pool: %v", err)
	}
	if got == nil || len(got) != 0 {
		t.Fatalf("ListNodes on an empty pool = %#v, want an empty non-nil slice", got)
	}
	for _, n := range []string{"c", "a", "b"} {
		e.applyNode(t, nodeReq(n, 1000, gib, 0))
	}
	got, err = e.p.ListNodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, n := range got {
		names = append(names, n.GetName())
	}
	if diff := cmp.Diff([]string{"a", "b", "c"}, names); diff != "" {
		t.Errorf("ListNodes names (-want +got):\n%s", diff)
	}
	// The node index does not leak networks or the network index.
	e.applyNetwork(t, &poolv1.ApplyNetworkRequest{Name: "a", Ipv4Cidr: "10.0.0.0/24"})
	if got, _ := e.p.ListNodes(ctx); len(got) != 3 {
		t.Errorf("ListNodes after ApplyNetwork has %d nodes", len(got))
	}
}

func TestGetDeleteMissingNode(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.applyNode(t, nodeReq("other", 1000, gib, 0))
	before := e.snapshot(t)
	_, err := e.p.GetNode(ctx, "missing")
	wantErr(t, err, apierr.ErrNotFound)
	wantErr(t, e.p.DeleteNode(ctx, "missing"), apierr.ErrNotFound)
	wantErr(t, e.p.ReleaseCompute(ctx, "missing", "vm"), apierr.ErrNotFound)
	wantErr(t, e.p.ReleaseStorage(ctx, "missing", "vol"), apierr.ErrNotFound)
	_, err = e.p.ReserveCompute(ctx, "missing", "vm", compute(1, 1))
	wantErr(t, err, apierr.ErrNotFound)
	_, err = e.p.ReserveStorage(ctx, "missing", "vol", &poolv1.Storage{RequestBytes: 1, LimitBytes: 1})
	wantErr(t, err, apierr.ErrNotFound)
	e.assertUnchanged(t, before)
}

func TestDeleteNode(t *testing.T) {
	lock := map[string]string{AnnotationNodeDisableDeletionLock: "true"}
	// Even an empty value counts: the key's presence is the lock.
	lockEmpty := map[string]string{AnnotationNodeDisableDeletionLock: ""}
	tests := map[string]struct {
		computes map[string]map[string]string // name -> annotations
		storages map[string]map[string]string
		wantErr  error
		wantMsg  []string
	}{
		"no reservations":   {},
		"locking compute":   {computes: map[string]map[string]string{"vm1": nil}, wantErr: apierr.ErrPrecondition, wantMsg: []string{"compute/vm1"}},
		"locking storage":   {storages: map[string]map[string]string{"vol1": {"other": "x"}}, wantErr: apierr.ErrPrecondition, wantMsg: []string{"storage/vol1"}},
		"only unlocked":     {computes: map[string]map[string]string{"vm1": lock, "vm2": lockEmpty}, storages: map[string]map[string]string{"vol1": lock}},
		"one locked of two": {computes: map[string]map[string]string{"vm1": lock, "vm2": nil}, storages: map[string]map[string]string{"vol1": lock}, wantErr: apierr.ErrPrecondition, wantMsg: []string{"1 reservation", "compute/vm2"}},
		"network annotation does not unlock": {
			computes: map[string]map[string]string{"vm1": {AnnotationNetworkDisableDeletionLock: "true"}},
			wantErr:  apierr.ErrPrecondition,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			e := newEnv(t)
			e.applyNode(t, nodeReq("hv1", 8000, 16*gib, tib))
			for c, ann := range tc.computes {
				cc := compute(100, gib)
				cc.Annotations = ann
				e.reserveCompute(t, "hv1", c, cc)
			}
			for s, ann := range tc.storages {
				if _, err := e.p.ReserveStorage(ctx, "hv1", s, &poolv1.Storage{Annotations: ann, RequestBytes: gib, LimitBytes: gib}); err != nil {
					t.Fatal(err)
				}
			}
			before := e.snapshot(t)
			err := e.p.DeleteNode(ctx, "hv1")
			wantErr(t, err, tc.wantErr)
			if err != nil {
				wantContains(t, err, tc.wantMsg...)
				e.assertUnchanged(t, before)
				return
			}
			_, err = e.p.GetNode(ctx, "hv1")
			wantErr(t, err, apierr.ErrNotFound)
			wantErr(t, e.p.DeleteNode(ctx, "hv1"), apierr.ErrNotFound)
		})
	}
}

func TestApplyNodeBadInput(t *testing.T) {
	ok := func(mod func(r *poolv1.ApplyNodeRequest)) *poolv1.ApplyNodeRequest {
		r := nodeReq("hv2", 4000, 8*gib, tib)
		mod(r)
		return r
	}
	tests := map[string]struct {
		req     *poolv1.ApplyNodeRequest
		wantErr error
	}{
		"zero cpu":                  {req: ok(func(r *poolv1.ApplyNodeRequest) { r.CpuMilliCores = 0 }), wantErr: apierr.ErrInvalid},
		"zero memory":               {req: ok(func(r *poolv1.ApplyNodeRequest) { r.MemoryBytes = 0 }), wantErr: apierr.ErrInvalid},
		"address with space":        {req: ok(func(r *poolv1.ApplyNodeRequest) { r.Address = "not a host" }), wantErr: apierr.ErrInvalid},
		"address with slash":        {req: ok(func(r *poolv1.ApplyNodeRequest) { r.Address = "10.0.0.1/24" }), wantErr: apierr.ErrInvalid},
		"address label dash":        {req: ok(func(r *poolv1.ApplyNodeRequest) { r.Address = "-bad.example" }), wantErr: apierr.ErrInvalid},
		"address empty label":       {req: ok(func(r *poolv1.ApplyNodeRequest) { r.Address = "a..b" }), wantErr: apierr.ErrInvalid},
		"address bad ip":            {req: ok(func(r *poolv1.ApplyNodeRequest) { r.Address = "300.1.1.1" }), wantErr: apierr.ErrInvalid},
		"address short ip":          {req: ok(func(r *poolv1.ApplyNodeRequest) { r.Address = "10.1.1" }), wantErr: apierr.ErrInvalid},
		"address port not a number": {req: ok(func(r *poolv1.ApplyNodeRequest) { r.Address = "hv2.lab:http" }), wantErr: apierr.ErrInvalid},
		"address port too big":      {req: ok(func(r *poolv1.ApplyNodeRequest) { r.Address = "hv2.lab:70000" }), wantErr: apierr.ErrInvalid},
		"address empty port":        {req: ok(func(r *poolv1.ApplyNodeRequest) { r.Address = "hv2.lab:" }), wantErr: apierr.ErrInvalid},
		"address ipv6 unbracketed port": {
			req: ok(func(r *poolv1.ApplyNodeRequest) { r.Address = "[fd00::1]:99999" }), wantErr: apierr.ErrInvalid,
		},
		"address unicode":      {req: ok(func(r *poolv1.ApplyNodeRequest) { r.Address = "hÿ.lab" }), wantErr: apierr.ErrInvalid},
		"ipmi address bad":     {req: ok(func(r *poolv1.ApplyNodeRequest) { r.IpmiAddress = "bmc!" }), wantErr: apierr.ErrInvalid},
		"hypervisor port big":  {req: ok(func(r *poolv1.ApplyNodeRequest) { r.HypervisorPort = 65536 }), wantErr: apierr.ErrInvalid},
		"annotation key empty": {req: ok(func(r *poolv1.ApplyNodeRequest) { r.Annotations = map[string]string{"": "v"} }), wantErr: apierr.ErrInvalid},
		"label key with space": {req: ok(func(r *poolv1.ApplyNodeRequest) { r.Labels = map[string]string{"a b": "v"} }), wantErr: apierr.ErrInvalid},
		"label value too long": {req: ok(func(r *poolv1.ApplyNodeRequest) { r.Labels = map[string]string{"k": strings.Repeat("v", 4097)} }), wantErr: apierr.ErrInvalid},
		// Accepted spellings, for contrast.
		"address ipv4":           {req: ok(func(r *poolv1.ApplyNodeRequest) { r.Address = "10.0.0.1" })},
		"address ipv4 port":      {req: ok(func(r *poolv1.ApplyNodeRequest) { r.Address = "10.0.0.1:20181" })},
		"address ipv6":           {req: ok(func(r *poolv1.ApplyNodeRequest) { r.Address = "fd00::1" })},
		"address ipv6 port":      {req: ok(func(r *poolv1.ApplyNodeRequest) { r.Address = "[fd00::1]:20181" })},
		"address host":           {req: ok(func(r *poolv1.ApplyNodeRequest) { r.Address = "hv2.lab.example" })},
		"address host port":      {req: ok(func(r *poolv1.ApplyNodeRequest) { r.Address = "hv2.lab.example:20181" })},
		"address digit label":    {req: ok(func(r *poolv1.ApplyNodeRequest) { r.Address = "1hv.lab" })},
		"storage zero":           {req: ok(func(r *poolv1.ApplyNodeRequest) { r.StorageBytes = 0 })},
		"hypervisor port max":    {req: ok(func(r *poolv1.ApplyNodeRequest) { r.HypervisorPort = 65535 })},
		"label value at 4096":    {req: ok(func(r *poolv1.ApplyNodeRequest) { r.Labels = map[string]string{"k": strings.Repeat("v", 4096)} })},
		"max capacity":           {req: ok(func(r *poolv1.ApplyNodeRequest) { r.CpuMilliCores, r.MemoryBytes = math.MaxUint32, math.MaxUint64 })},
		"ipmi address host only": {req: ok(func(r *poolv1.ApplyNodeRequest) { r.IpmiAddress = "bmc-hv2" })},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			e.applyNode(t, nodeReq("hv1", 4000, 8*gib, tib))
			before := e.snapshot(t)
			_, err := e.p.ApplyNode(context.Background(), tc.req)
			wantErr(t, err, tc.wantErr)
			if err != nil {
				e.assertUnchanged(t, before)
			}
		})
	}
}

func TestReserveBadInput(t *testing.T) {
	type call func(ctx context.Context, p *Pool) error
	rc := func(c *poolv1.Compute) call {
		return func(ctx context.Context, p *Pool) error {
			_, err := p.ReserveCompute(ctx, "hv1", "vm-new", c)
			return err
		}
	}
	sc := func(c *poolv1.Compute) call {
		return func(ctx context.Context, p *Pool) error { _, err := p.ScheduleCompute(ctx, "vm-new", c); return err }
	}
	rs := func(s *poolv1.Storage) call {
		return func(ctx context.Context, p *Pool) error {
			_, err := p.ReserveStorage(ctx, "hv1", "vol-new", s)
			return err
		}
	}
	ss := func(s *poolv1.Storage) call {
		return func(ctx context.Context, p *Pool) error { _, err := p.ScheduleStorage(ctx, "vol-new", s); return err }
	}
	c := func(rcpu, lcpu uint32, rmem, lmem uint64) *poolv1.Compute {
		return &poolv1.Compute{RequestCpuMilliCore: rcpu, LimitCpuMilliCore: lcpu, RequestMemoryBytes: rmem, LimitMemoryBytes: lmem}
	}
	tests := map[string]struct {
		call    call
		wantErr error
	}{
		"compute zero cpu request":    {call: rc(c(0, 1000, gib, gib)), wantErr: apierr.ErrInvalid},
		"compute zero cpu limit":      {call: rc(c(1000, 0, gib, gib)), wantErr: apierr.ErrInvalid},
		"compute inverted cpu":        {call: rc(c(2000, 1000, gib, gib)), wantErr: apierr.ErrInvalid},
		"compute zero memory request": {call: rc(c(1000, 1000, 0, gib)), wantErr: apierr.ErrInvalid},
		"compute zero memory limit":   {call: rc(c(1000, 1000, gib, 0)), wantErr: apierr.ErrInvalid},
		"compute inverted memory":     {call: rc(c(1000, 1000, 2*gib, gib)), wantErr: apierr.ErrInvalid},
		"compute nil":                 {call: rc(nil), wantErr: apierr.ErrInvalid},
		"compute bad annotation":      {call: rc(&poolv1.Compute{Annotations: map[string]string{"a b": ""}, RequestCpuMilliCore: 1, LimitCpuMilliCore: 1, RequestMemoryBytes: 1, LimitMemoryBytes: 1}), wantErr: apierr.ErrInvalid},
		"schedule zero cpu request":   {call: sc(c(0, 1000, gib, gib)), wantErr: apierr.ErrInvalid},
		"schedule zero memory limit":  {call: sc(c(1000, 1000, gib, 0)), wantErr: apierr.ErrInvalid},
		"schedule inverted cpu":       {call: sc(c(2000, 1000, gib, gib)), wantErr: apierr.ErrInvalid},
		"schedule inverted memory":    {call: sc(c(1000, 1000, 2*gib, gib)), wantErr: apierr.ErrInvalid},
		"storage zero request":        {call: rs(&poolv1.Storage{RequestBytes: 0, LimitBytes: gib}), wantErr: apierr.ErrInvalid},
		"storage zero limit":          {call: rs(&poolv1.Storage{RequestBytes: gib, LimitBytes: 0}), wantErr: apierr.ErrInvalid},
		"storage inverted":            {call: rs(&poolv1.Storage{RequestBytes: 2 * gib, LimitBytes: gib}), wantErr: apierr.ErrInvalid},
		"storage nil":                 {call: rs(nil), wantErr: apierr.ErrInvalid},
		"schedule storage zero":       {call: ss(&poolv1.Storage{}), wantErr: apierr.ErrInvalid},
		"schedule storage inverted":   {call: ss(&poolv1.Storage{RequestBytes: 2, LimitBytes: 1}), wantErr: apierr.ErrInvalid},
		"compute duplicate name": {call: func(ctx context.Context, p *Pool) error {
			_, err := p.ReserveCompute(ctx, "hv1", "vm1", compute(1, 1))
			return err
		}, wantErr: apierr.ErrAlreadyExists},
		"storage duplicate name": {call: func(ctx context.Context, p *Pool) error {
			_, err := p.ReserveStorage(ctx, "hv1", "vol1", &poolv1.Storage{RequestBytes: 1, LimitBytes: 1})
			return err
		}, wantErr: apierr.ErrAlreadyExists},
		"release missing compute":      {call: func(ctx context.Context, p *Pool) error { return p.ReleaseCompute(ctx, "hv1", "vm-none") }, wantErr: apierr.ErrNotFound},
		"release missing storage":      {call: func(ctx context.Context, p *Pool) error { return p.ReleaseStorage(ctx, "hv1", "vol-none") }, wantErr: apierr.ErrNotFound},
		"release storage as compute":   {call: func(ctx context.Context, p *Pool) error { return p.ReleaseCompute(ctx, "hv1", "vol1") }, wantErr: apierr.ErrNotFound},
		"compute over cpu capacity":    {call: rc(compute(7001, gib)), wantErr: apierr.ErrExhausted},
		"compute over memory capacity": {call: rc(compute(1000, 14*gib+1)), wantErr: apierr.ErrExhausted},
		"storage over capacity":        {call: rs(&poolv1.Storage{RequestBytes: 90*gib + 1, LimitBytes: 90*gib + 1}), wantErr: apierr.ErrExhausted},
		"schedule over every node":     {call: sc(compute(7001, gib)), wantErr: apierr.ErrExhausted},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			e := newEnv(t)
			e.applyNode(t, nodeReq("hv1", 8000, 16*gib, 100*gib))
			e.reserveCompute(t, "hv1", "vm1", compute(1000, 2*gib))
			if _, err := e.p.ReserveStorage(ctx, "hv1", "vol1", &poolv1.Storage{RequestBytes: 10 * gib, LimitBytes: 10 * gib}); err != nil {
				t.Fatal(err)
			}
			before := e.snapshot(t)
			wantErr(t, tc.call(ctx, e.p), tc.wantErr)
			e.assertUnchanged(t, before)
		})
	}
}

func TestReserveReleaseCompute(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.applyNode(t, nodeReq("hv1", 4000, 8*gib, 0))
	c := &poolv1.Compute{
		Annotations:         map[string]string{"n0core/provisioning/virtual_machine/virtual_machine/reserved_by": "vm1"},
		RequestCpuMilliCore: 1000, LimitCpuMilliCore: 2000,
		RequestMemoryBytes: gib, LimitMemoryBytes: 2 * gib,
	}
	got := e.reserveCompute(t, "hv1", "vm1", c)
	if diff := cmp.Diff(map[string]*poolv1.Compute{"vm1": c}, got.GetReservedComputes(), protocmp.Transform()); diff != "" {
		t.Errorf("reserved computes (-want +got):\n%s", diff)
	}
	// The stored entry does not alias the caller's message.
	c.RequestCpuMilliCore = 1
	c.Annotations["x"] = "y"
	stored, _ := e.p.GetNode(ctx, "hv1")
	if r := stored.GetReservedComputes()["vm1"]; r.GetRequestCpuMilliCore() != 1000 || len(r.GetAnnotations()) != 1 {
		t.Errorf("stored reservation aliases the request: %v", r)
	}
	if err := e.p.ReleaseCompute(ctx, "hv1", "vm1"); err != nil {
		t.Fatal(err)
	}
	wantErr(t, e.p.ReleaseCompute(ctx, "hv1", "vm1"), apierr.ErrNotFound)
	stored, _ = e.p.GetNode(ctx, "hv1")
	if len(stored.GetReservedComputes()) != 0 {
		t.Errorf("reservations after release: %v", stored.GetReservedComputes())
	}
	// The whole node is free again.
	e.reserveCompute(t, "hv1", "big", compute(4000, 8*gib))
}

func TestReserveReleaseStorage(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.applyNode(t, nodeReq("hv1", 4000, 8*gib, 100*gib))
	s := &poolv1.Storage{Annotations: map[string]string{"k": "v"}, RequestBytes: 10 * gib, LimitBytes: 50 * gib}
	got, err := e.p.ReserveStorage(ctx, "hv1", "vol1", s)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]*poolv1.Storage{"vol1": s}, got.GetReservedStorages(), protocmp.Transform()); diff != "" {
		t.Errorf("reserved storages (-want +got):\n%s", diff)
	}
	if err := e.p.ReleaseStorage(ctx, "hv1", "vol1"); err != nil {
		t.Fatal(err)
	}
	wantErr(t, e.p.ReleaseStorage(ctx, "hv1", "vol1"), apierr.ErrNotFound)
	if _, err := e.p.ReserveStorage(ctx, "hv1", "vol2", &poolv1.Storage{RequestBytes: 100 * gib, LimitBytes: 100 * gib}); err != nil {
		t.Fatal(err)
	}
}

// TestCapacityAndRatios checks requests against capacity and limits against
// ratio x capacity, with the numbers in the ResourceExhausted message.
func TestCapacityAndRatios(t *testing.T) {
	type res struct {
		name    string
		c       *poolv1.Compute
		s       *poolv1.Storage
		wantErr error
		wantMsg []string
	}
	lim := func(rcpu, lcpu uint32, rmem, lmem uint64) *poolv1.Compute {
		return &poolv1.Compute{RequestCpuMilliCore: rcpu, LimitCpuMilliCore: lcpu, RequestMemoryBytes: rmem, LimitMemoryBytes: lmem}
	}
	tests := map[string]struct {
		mods []func(*Config)
		seq  []res
	}{
		"cpu requests fill capacity": {seq: []res{
			{name: "a", c: compute(3000, gib)},
			{name: "b", c: compute(1000, gib)},
			{name: "c", c: compute(1, gib), wantErr: apierr.ErrExhausted, wantMsg: []string{"cpu request 1", "reserved 4000", "capacity 4000"}},
		}},
		"memory requests fill capacity": {seq: []res{
			{name: "a", c: compute(100, 6*gib)},
			{name: "b", c: compute(100, 2*gib+1), wantErr: apierr.ErrExhausted, wantMsg: []string{fmt.Sprint(2*gib + 1), fmt.Sprint(6 * gib), fmt.Sprint(8 * gib)}},
			{name: "c", c: compute(100, 2*gib)},
		}},
		"cpu limits reach 4x capacity": {seq: []res{
			{name: "a", c: lim(1000, 16000, gib, gib)},
			{name: "b", c: lim(1, 1, gib, gib), wantErr: apierr.ErrExhausted, wantMsg: []string{"cpu limit 1", "reserved limits 16000", "4 x capacity 4000"}},
		}},
		"cpu limits just over 4x": {seq: []res{
			{name: "a", c: lim(1000, 16001, gib, gib), wantErr: apierr.ErrExhausted, wantMsg: []string{"cpu limit 16001", "4 x capacity 4000"}},
		}},
		"memory limits 1x capacity": {seq: []res{
			{name: "a", c: lim(100, 100, gib, 8*gib)},
			{name: "b", c: lim(100, 100, 1, 1), wantErr: apierr.ErrExhausted, wantMsg: []string{"memory limit 1", fmt.Sprint(8 * gib), "1 x capacity"}},
		}},
		"memory ratio raised": {mods: []func(*Config){func(c *Config) { c.MemoryLimitRatio = 2 }}, seq: []res{
			{name: "a", c: lim(100, 100, gib, 16*gib)},
			{name: "b", c: lim(100, 100, 1, 1), wantErr: apierr.ErrExhausted, wantMsg: []string{"2 x capacity"}},
		}},
		"cpu ratio lowered": {mods: []func(*Config){func(c *Config) { c.CPULimitRatio = 1 }}, seq: []res{
			{name: "a", c: lim(1000, 4001, gib, gib), wantErr: apierr.ErrExhausted, wantMsg: []string{"1 x capacity 4000"}},
			{name: "b", c: lim(1000, 4000, gib, gib)},
		}},
		"storage requests and limits": {seq: []res{
			{name: "v1", s: &poolv1.Storage{RequestBytes: 50 * gib, LimitBytes: 60 * gib}},
			{name: "v2", s: &poolv1.Storage{RequestBytes: 40 * gib, LimitBytes: 40*gib + 1}, wantErr: apierr.ErrExhausted, wantMsg: []string{"storage limit", fmt.Sprint(60 * gib), "1 x capacity"}},
			{name: "v3", s: &poolv1.Storage{RequestBytes: 50*gib + 1, LimitBytes: 50*gib + 1}, wantErr: apierr.ErrExhausted, wantMsg: []string{"storage request", fmt.Sprint(50 * gib)}},
			{name: "v4", s: &poolv1.Storage{RequestBytes: 40 * gib, LimitBytes: 40 * gib}},
		}},
		"storage thin provisioning": {mods: []func(*Config){func(c *Config) { c.StorageLimitRatio = 10 }}, seq: []res{
			{name: "v1", s: &poolv1.Storage{RequestBytes: gib, LimitBytes: 1000 * gib}},
			{name: "v2", s: &poolv1.Storage{RequestBytes: gib, LimitBytes: 1}, wantErr: apierr.ErrInvalid},
			{name: "v3", s: &poolv1.Storage{RequestBytes: 1, LimitBytes: 1}, wantErr: apierr.ErrExhausted},
		}},
		"requests near the uint64 limit do not wrap": {seq: []res{
			{name: "a", c: compute(1, 1<<63)},
			{name: "b", c: compute(1, 1<<63), wantErr: apierr.ErrExhausted},
		}},
		"limits near the uint64 limit do not wrap": {seq: []res{
			{name: "a", c: lim(1, 1, 1, math.MaxUint64)},
			{name: "b", c: lim(1, 1, 1, 2), wantErr: apierr.ErrExhausted},
		}},
		"infinite ratio caps at uint64": {mods: []func(*Config){func(c *Config) { c.MemoryLimitRatio = math.Inf(1) }}, seq: []res{
			{name: "a", c: lim(1, 1, 1, math.MaxUint64)},
			{name: "b", c: lim(1, 1, 1, 1), wantErr: apierr.ErrExhausted},
		}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			e := newEnv(t, tc.mods...)
			memCap := 8 * gib
			if strings.Contains(name, "uint64") {
				memCap = math.MaxUint64
			}
			e.applyNode(t, nodeReq("hv1", 4000, memCap, 100*gib))
			for _, r := range tc.seq {
				before := e.snapshot(t)
				var err error
				if r.c != nil {
					_, err = e.p.ReserveCompute(ctx, "hv1", r.name, r.c)
				} else {
					_, err = e.p.ReserveStorage(ctx, "hv1", r.name, r.s)
				}
				if r.wantErr == nil && err != nil {
					t.Fatalf("reserve %s: %v", r.name, err)
				}
				if r.wantErr != nil {
					wantErr(t, err, r.wantErr)
					wantContains(t, err, r.wantMsg...)
					e.assertUnchanged(t, before)
				}
			}
		})
	}
}

func TestNotReadyNodeRefusesReservations(t *testing.T) {
	ctx := context.Background()
	for _, st := range []poolv1.Node_NodeState{poolv1.Node_NOT_READY, poolv1.Node_NODE_UNSPECIFIED} {
		t.Run(st.String(), func(t *testing.T) {
			e := newEnv(t)
			e.applyNode(t, nodeReq("hv1", 4000, 8*gib, 100*gib))
			e.reserveCompute(t, "hv1", "old", compute(1000, gib))
			e.setNodeState(t, "hv1", st)
			before := e.snapshot(t)
			_, err := e.p.ReserveCompute(ctx, "hv1", "vm", compute(1000, gib))
			wantErr(t, err, apierr.ErrPrecondition)
			wantContains(t, err, "not READY")
			_, err = e.p.ReserveStorage(ctx, "hv1", "vol", &poolv1.Storage{RequestBytes: 1, LimitBytes: 1})
			wantErr(t, err, apierr.ErrPrecondition)
			_, err = e.p.ScheduleCompute(ctx, "vm", compute(1000, gib))
			wantErr(t, err, apierr.ErrExhausted)
			wantContains(t, err, "hv1: "+st.String())
			_, err = e.p.ScheduleStorage(ctx, "vol", &poolv1.Storage{RequestBytes: 1, LimitBytes: 1})
			wantErr(t, err, apierr.ErrExhausted)
			e.assertUnchanged(t, before)
			// Releasing still works on a node that is not READY.
			if err := e.p.ReleaseCompute(ctx, "hv1", "old"); err != nil {
				t.Fatal(err)
			}
			// Deleting too, once it holds nothing.
			if err := e.p.DeleteNode(ctx, "hv1"); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestScheduleCompute(t *testing.T) {
	type node struct {
		name     string
		milli    uint32
		mem      uint64
		rack     string
		reserved *poolv1.Compute
		state    poolv1.Node_NodeState // 0: READY
	}
	tests := map[string]struct {
		nodes    []node
		c        *poolv1.Compute
		want     string
		wantErr  error
		wantMsgs []string
	}{
		"empty pool": {c: compute(1000, gib), wantErr: apierr.ErrExhausted, wantMsgs: []string{"empty"}},
		"least allocated": {
			nodes: []node{
				{name: "a", milli: 4000, mem: 8 * gib, reserved: compute(2000, 4*gib)},
				{name: "b", milli: 4000, mem: 8 * gib, reserved: compute(1000, gib)},
				{name: "c", milli: 4000, mem: 8 * gib, reserved: compute(3000, gib)},
			},
			c: compute(500, gib), want: "b",
		},
		"bigger node is less allocated": {
			nodes: []node{
				{name: "small", milli: 4000, mem: 8 * gib},
				{name: "big", milli: 64000, mem: 256 * gib},
			},
			c: compute(2000, 4*gib), want: "big",
		},
		"mean of cpu and memory": {
			nodes: []node{
				// After placing 1000m/1GiB: a = (0.5 + 0.875)/2, b = (0.75 + 0.5)/2.
				{name: "a", milli: 4000, mem: 8 * gib, reserved: compute(1000, 1)},
				{name: "b", milli: 4000, mem: 8 * gib, reserved: compute(1, 3*gib)},
			},
			c: compute(1000, gib), want: "a",
		},
		"skips NOT_READY": {
			nodes: []node{
				{name: "idle", milli: 64000, mem: 256 * gib, state: poolv1.Node_NOT_READY},
				{name: "busy", milli: 4000, mem: 8 * gib, reserved: compute(3000, 6*gib)},
			},
			c: compute(500, gib), want: "busy",
		},
		"skips full": {
			nodes: []node{
				{name: "cpu-full", milli: 4000, mem: tib, reserved: compute(4000, gib)},
				{name: "mem-full", milli: 64000, mem: 8 * gib, reserved: compute(1000, 8*gib)},
				{name: "room", milli: 4000, mem: 8 * gib, reserved: compute(3000, 6*gib)},
			},
			c: compute(500, gib), want: "room",
		},
		"all full": {
			nodes: []node{
				{name: "a", milli: 4000, mem: 8 * gib, reserved: compute(4000, gib)},
				{name: "b", milli: 4000, mem: 8 * gib, state: poolv1.Node_NOT_READY},
			},
			c: compute(500, gib), wantErr: apierr.ErrExhausted, wantMsgs: []string{`node "a": cpu request 500`, "b: NOT_READY"},
		},
		"limits are a filter too": {
			nodes: []node{
				{name: "roomy", milli: 64000, mem: 256 * gib, reserved: &poolv1.Compute{RequestCpuMilliCore: 1, LimitCpuMilliCore: 256000, RequestMemoryBytes: 1, LimitMemoryBytes: 1}},
				{name: "tight", milli: 4000, mem: 8 * gib, reserved: compute(3000, 6*gib)},
			},
			c: compute(500, gib), want: "tight",
		},
		"tie broken by name": {
			nodes: []node{{name: "b", milli: 4000, mem: 8 * gib}, {name: "a", milli: 4000, mem: 8 * gib}},
			c:     compute(500, gib), want: "a",
		},
		"tie goes to the emptier rack": {
			nodes: []node{
				{name: "a", milli: 4000, mem: 8 * gib, rack: "r1"},
				{name: "b", milli: 4000, mem: 8 * gib, rack: "r1"},
				{name: "c", milli: 4000, mem: 8 * gib, rack: "r2"},
				{name: "full", milli: 4000, mem: 8 * gib, rack: "r1", reserved: compute(4000, 8*gib)},
			},
			c: compute(500, gib), want: "c", // r1 already holds one compute (on full).
		},
		"rack load counts nodes that are not READY": {
			nodes: []node{
				{name: "a", milli: 4000, mem: 8 * gib, rack: "r1"},
				{name: "c", milli: 4000, mem: 8 * gib, rack: "r2"},
				{name: "d", milli: 4000, mem: 8 * gib, rack: "r2", reserved: compute(1, 1), state: poolv1.Node_NOT_READY},
				{name: "e", milli: 4000, mem: 8 * gib, rack: "r1", reserved: compute(4000, 8*gib)},
			},
			c: compute(500, gib), want: "a", // r1 and r2 hold one compute each: tie, then name.
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			e := newEnv(t)
			for _, n := range tc.nodes {
				r := nodeReq(n.name, n.milli, n.mem, 0)
				r.Rack = n.rack
				e.applyNode(t, r)
				if n.reserved != nil {
					e.reserveCompute(t, n.name, "pre-"+n.name, n.reserved)
				}
				if n.state != 0 {
					e.setNodeState(t, n.name, n.state)
				}
			}
			before := e.snapshot(t)
			got, err := e.p.ScheduleCompute(ctx, "vm", tc.c)
			wantErr(t, err, tc.wantErr)
			if err != nil {
				wantContains(t, err, tc.wantMsgs...)
				e.assertUnchanged(t, before)
				return
			}
			if got.GetName() != tc.want {
				t.Fatalf("scheduled on %q, want %q", got.GetName(), tc.want)
			}
			if diff := cmp.Diff(tc.c, got.GetReservedComputes()["vm"], protocmp.Transform()); diff != "" {
				t.Errorf("reservation (-want +got):\n%s", diff)
			}
			stored, _ := e.p.GetNode(ctx, tc.want)
			if diff := cmp.Diff(got, stored, protocmp.Transform()); diff != "" {
				t.Errorf("returned node differs from stored (-ret +stored):\n%s", diff)
			}
		})
	}
}

// TestScheduleSpreadsRacks places onto four identical nodes in racks
// r1, r1, r2, r2 and checks successive placements alternate racks.
func TestScheduleSpreadsRacks(t *testing.T) {
	for _, kind := range []string{"compute", "storage"} {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			e := newEnv(t)
			racks := map[string]string{"a": "r1", "b": "r1", "c": "r2", "d": "r2"}
			for n, r := range racks {
				req := nodeReq(n, 8000, 16*gib, 16*gib)
				req.Rack = r
				e.applyNode(t, req)
			}
			var gotRacks []string
			perNode := map[string]int{}
			for i := range 8 {
				name := fmt.Sprintf("x%d", i)
				var n *poolv1.Node
				var err error
				if kind == "compute" {
					n, err = e.p.ScheduleCompute(ctx, name, compute(1000, 2*gib))
				} else {
					n, err = e.p.ScheduleStorage(ctx, name, &poolv1.Storage{RequestBytes: 2 * gib, LimitBytes: 2 * gib})
				}
				if err != nil {
					t.Fatalf("placement %d: %v", i, err)
				}
				gotRacks = append(gotRacks, n.GetRack())
				perNode[n.GetName()]++
			}
			want := []string{"r1", "r2", "r1", "r2", "r1", "r2", "r1", "r2"}
			if diff := cmp.Diff(want, gotRacks); diff != "" {
				t.Errorf("racks of successive placements (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(map[string]int{"a": 2, "b": 2, "c": 2, "d": 2}, perNode); diff != "" {
				t.Errorf("placements per node (-want +got):\n%s", diff)
			}
		})
	}
}

func TestScheduleStorage(t *testing.T) {
	type node struct {
		name     string
		storage  uint64
		reserved uint64
		state    poolv1.Node_NodeState
	}
	tests := map[string]struct {
		nodes   []node
		s       *poolv1.Storage
		want    string
		wantErr error
	}{
		"empty pool": {s: &poolv1.Storage{RequestBytes: 1, LimitBytes: 1}, wantErr: apierr.ErrExhausted},
		"least allocated": {
			nodes: []node{{name: "a", storage: 100 * gib, reserved: 50 * gib}, {name: "b", storage: 100 * gib, reserved: 10 * gib}, {name: "c", storage: 100 * gib, reserved: 80 * gib}},
			s:     &poolv1.Storage{RequestBytes: 10 * gib, LimitBytes: 10 * gib}, want: "b",
		},
		"skips NOT_READY": {
			nodes: []node{{name: "a", storage: tib, state: poolv1.Node_NOT_READY}, {name: "b", storage: 100 * gib, reserved: 80 * gib}},
			s:     &poolv1.Storage{RequestBytes: 10 * gib, LimitBytes: 10 * gib}, want: "b",
		},
		"skips full and storage-less": {
			nodes: []node{{name: "a", storage: 0}, {name: "b", storage: 100 * gib, reserved: 95 * gib}, {name: "c", storage: 20 * gib, reserved: 5 * gib}},
			s:     &poolv1.Storage{RequestBytes: 10 * gib, LimitBytes: 10 * gib}, want: "c",
		},
		"nothing fits": {
			nodes: []node{{name: "a", storage: 0}, {name: "b", storage: 100 * gib, reserved: 95 * gib}},
			s:     &poolv1.Storage{RequestBytes: 10 * gib, LimitBytes: 10 * gib}, wantErr: apierr.ErrExhausted,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			e := newEnv(t)
			for _, n := range tc.nodes {
				e.applyNode(t, nodeReq(n.name, 1000, gib, n.storage))
				if n.reserved > 0 {
					if _, err := e.p.ReserveStorage(ctx, n.name, "pre-"+n.name, &poolv1.Storage{RequestBytes: n.reserved, LimitBytes: n.reserved}); err != nil {
						t.Fatal(err)
					}
				}
				if n.state != 0 {
					e.setNodeState(t, n.name, n.state)
				}
			}
			before := e.snapshot(t)
			got, err := e.p.ScheduleStorage(ctx, "vol", tc.s)
			wantErr(t, err, tc.wantErr)
			if err != nil {
				e.assertUnchanged(t, before)
				return
			}
			if got.GetName() != tc.want {
				t.Fatalf("scheduled on %q, want %q", got.GetName(), tc.want)
			}
			if diff := cmp.Diff(tc.s, got.GetReservedStorages()["vol"], protocmp.Transform()); diff != "" {
				t.Errorf("reservation (-want +got):\n%s", diff)
			}
		})
	}
}

func TestScheduleNameTaken(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.applyNode(t, nodeReq("a", 8000, 16*gib, 100*gib))
	e.applyNode(t, nodeReq("b", 8000, 16*gib, 100*gib))
	e.reserveCompute(t, "b", "vm", compute(7000, 15*gib))
	if _, err := e.p.ReserveStorage(ctx, "b", "vol", &poolv1.Storage{RequestBytes: 90 * gib, LimitBytes: 90 * gib}); err != nil {
		t.Fatal(err)
	}
	// Even on a node that is no longer READY, the name counts as taken.
	e.setNodeState(t, "b", poolv1.Node_NOT_READY)
	before := e.snapshot(t)
	_, err := e.p.ScheduleCompute(ctx, "vm", compute(1000, gib))
	wantErr(t, err, apierr.ErrAlreadyExists)
	wantContains(t, err, `"b"`)
	_, err = e.p.ScheduleStorage(ctx, "vol", &poolv1.Storage{RequestBytes: 1, LimitBytes: 1})
	wantErr(t, err, apierr.ErrAlreadyExists)
	e.assertUnchanged(t, before)
	// Compute and storage names are separate namespaces.
	if _, err := e.p.ScheduleStorage(ctx, "vm", &poolv1.Storage{RequestBytes: 1, LimitBytes: 1}); err != nil {
		t.Fatal(err)
	}
}

// TestScheduleComputeConcurrent: 40 goroutines schedule onto 4 nodes that
// each have room for exactly 10; every one succeeds and each node ends with
// exactly 10.
func TestScheduleComputeConcurrent(t *testing.T) {
	for storeName, mk := range map[string]func(testing.TB, ...func(*Config)) *env{"mem": newEnv, "bolt": newBoltEnv} {
		t.Run(storeName, func(t *testing.T) {
			ctx := context.Background()
			e := mk(t)
			for i := range 4 {
				r := nodeReq(fmt.Sprintf("n%d", i), 10000, 10*gib, 0)
				r.Rack = fmt.Sprintf("r%d", i%2)
				e.applyNode(t, r)
			}
			const n = 40
			var wg sync.WaitGroup
			errs := make([]error, n)
			placed := make([]string, n)
			for i := range n {
				wg.Go(func() {
					node, err := e.p.ScheduleCompute(ctx, fmt.Sprintf("vm%02d", i), compute(1000, gib))
					errs[i] = err
					placed[i] = node.GetName()
				})
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Errorf("vm%02d: %v", i, err)
				}
			}
			nodes, err := e.p.ListNodes(ctx)
			if err != nil {
				t.Fatal(err)
			}
			total := 0
			for _, nd := range nodes {
				if got := len(nd.GetReservedComputes()); got != 10 {
					t.Errorf("node %s holds %d computes, want 10", nd.GetName(), got)
				}
				for vm := range nd.GetReservedComputes() {
					var i int
					fmt.Sscanf(vm, "vm%d", &i)
					if placed[i] != nd.GetName() {
						t.Errorf("%s is on %s but ScheduleCompute returned %s", vm, nd.GetName(), placed[i])
					}
				}
				total += len(nd.GetReservedComputes())
			}
			if total != n {
				t.Errorf("%d computes placed, want %d", total, n)
			}
			// The pool is now full.
			_, err = e.p.ScheduleCompute(ctx, "one-more", compute(1000, gib))
			wantErr(t, err, apierr.ErrExhausted)
		})
	}
}
