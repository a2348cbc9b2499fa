package appliance

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/api/clientconfig"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
)

// TestStandbyPoolWired: StandbyPoolService is served with its roles, the
// leader's controller takes an INVENTORIED machine of the pool to READY,
// the pool's status and gauges say so, and EraseLevel reads the pool.
func TestStandbyPoolWired(t *testing.T) {
	dir := t.TempDir()
	srv, err := New(Config{DataDir: dir, APIListen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler),
		Metrics: MetricsConfig{Listen: "127.0.0.1:0"}, Lifecycle: LifecycleConfig{StandbyInterval: 20 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	cc, err := clientconfig.Load(dir + "/" + AdminConfigFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Inventory().CreateMachine(ctx, &inventoryv1.Machine{Name: "m1", State: inventoryv1.Machine_INVENTORIED, Pool: "ci", BootMac: "52:54:00:00:00:01"}); err != nil {
		t.Fatal(err)
	}
	c := inventoryv1.NewStandbyPoolServiceClient(dial(t, cc, ""))
	viewer := inventoryv1.NewStandbyPoolServiceClient(dial(t, cc, newToken(t, srv, authv1.Role_ROLE_VIEWER)))
	spec := &inventoryv1.StandbyPool{Name: "ci", MinReady: 1, Readiness: inventoryv1.Readiness_READINESS_POWERED_OFF, AutoAccept: true,
		Erase: inventoryv1.EraseLevel_ERASE_LEVEL_QUICK}
	if _, err := viewer.ApplyStandbyPool(ctx, &inventoryv1.ApplyStandbyPoolRequest{Pool: spec}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("viewer apply: %v, want PermissionDenied", err)
	}
	if _, err := c.ApplyStandbyPool(ctx, &inventoryv1.ApplyStandbyPoolRequest{Pool: spec}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := viewer.GetStandbyPool(ctx, &inventoryv1.GetStandbyPoolRequest{Name: "ci"})
		if err != nil {
			t.Fatal(err)
		}
		if s := resp.GetPool().GetStatus(); s.GetReady() == 1 && s.GetDeficit() == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool status %v: want ready 1, deficit 0", resp.GetPool().GetStatus())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if m, err := srv.Inventory().GetMachine(ctx, "m1"); err != nil || m.GetState() != inventoryv1.Machine_READY {
		t.Fatalf("m1: %v, %v; want READY", m.GetState(), err)
	}
	if l, err := viewer.ListStandbyPools(ctx, &inventoryv1.ListStandbyPoolsRequest{}); err != nil || len(l.GetPools()) != 1 {
		t.Errorf("viewer list: %v, %v", l, err)
	}
	if got := srv.StandbyPools().EraseLevel("ci"); got != inventoryv1.EraseLevel_ERASE_LEVEL_QUICK {
		t.Errorf("EraseLevel(ci) = %v, want QUICK", got)
	}
	_, body := httpGet(t, "http://"+srv.MetricsAddr().String()+"/metrics")
	for _, want := range []string{`corral_standby_pool_ready{pool="ci"} 1`, `corral_standby_pool_target{pool="ci"} 1`, `corral_standby_pool_deficit{pool="ci"} 0`} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if _, err := c.DeleteStandbyPool(ctx, &inventoryv1.DeleteStandbyPoolRequest{Name: "ci"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetStandbyPool(ctx, &inventoryv1.GetStandbyPoolRequest{Name: "ci"}); status.Code(err) != codes.NotFound {
		t.Errorf("get after delete: %v, want NotFound", err)
	}
}
