package main

import (
	"context"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/api/clientconfig"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	watchv1 "github.com/corralhq/corral/api/watch/v1"
	"github.com/corralhq/corral/testsupport/redfishtest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestE2EWatchMachines: against the built corrald over TLS, a viewer's
// WatchMachines stream sees an enrolment and a maintenance change live;
// after a restart (bbolt keeps no history) resuming from a revision before
// it is refused with OUT_OF_RANGE telling the client to re-list, and a
// re-list works.
func TestE2EWatchMachines(t *testing.T) {
	needE2E(t)
	rf := redfishtest.Start(t, "root", "e2e-watch-pass", &redfishtest.MemMachine{})
	dataDir, addr := t.TempDir(), freePort(t)
	d := startCorrald(t, dataDir, addr)
	cc, err := clientconfig.Load(filepath.Join(dataDir, "admin.conf"))
	if err != nil {
		t.Fatal(err)
	}
	dial := func(tok string) *grpc.ClientConn {
		conn, err := clientconfig.Dial(&clientconfig.Config{Endpoint: addr, CACert: cc.CACert, Token: tok})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	admin := dial(cc.Token)
	viewerTok, err := authv1.NewTokenServiceClient(admin).CreateToken(ctx, &authv1.CreateTokenRequest{Role: authv1.Role_ROLE_VIEWER, Description: "watch e2e"})
	if err != nil {
		t.Fatal(err)
	}
	viewer := inventoryv1.NewMachineServiceClient(dial(viewerTok.GetToken()))
	w, err := viewer.WatchMachines(ctx, &inventoryv1.WatchMachinesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := w.Recv()
	if err != nil || ev.GetType() != watchv1.EventType_SYNCED {
		t.Fatalf("first event on an empty appliance: %v, %v; want SYNCED", ev, err)
	}
	synced := ev.GetRevision()

	mc := inventoryv1.NewMachineServiceClient(admin)
	if _, err := mc.EnrollMachine(ctx, &inventoryv1.EnrollMachineRequest{Name: "rack1-u09", BmcAddress: rf.Host, BmcPort: uint32(rf.Port),
		BmcProtocol: inventoryv1.BmcProtocol_BMC_PROTOCOL_REDFISH, BmcUsername: "root", BmcPassword: "e2e-watch-pass",
		BmcTlsSha256: rf.Fingerprint(), BootMac: "52:54:00:e2:e0:09"}); err != nil {
		t.Fatalf("enroll: %v", err)
	}
	if _, err := mc.SetMaintenance(ctx, &inventoryv1.SetMaintenanceRequest{Name: "rack1-u09", On: true, Reason: "watch e2e"}); err != nil {
		t.Fatalf("maintenance: %v", err)
	}
	// The enrolment arrives as ADDED, then changes until MAINTENANCE.
	first := true
	for {
		ev, err := w.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if ev.GetMachine().GetName() != "rack1-u09" || ev.GetRevision() <= synced {
			t.Fatalf("unexpected event %v", ev)
		}
		if first && ev.GetType() != watchv1.EventType_ADDED {
			t.Fatalf("first event %v, want ADDED", ev.GetType())
		}
		first = false
		if ev.GetMachine().GetState() == inventoryv1.Machine_MAINTENANCE {
			if ev.GetType() != watchv1.EventType_MODIFIED {
				t.Fatalf("maintenance arrived as %v", ev.GetType())
			}
			break
		}
	}

	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-d.exited
	startCorrald(t, dataDir, addr)
	viewer = inventoryv1.NewMachineServiceClient(dial(viewerTok.GetToken()))
	old, err := viewer.WatchMachines(ctx, &inventoryv1.WatchMachinesRequest{FromRevision: synced})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := old.Recv(); status.Code(err) != codes.OutOfRange || !strings.Contains(status.Convert(err).Message(), "re-list with from_revision 0") {
		t.Fatalf("resume from before the restart: %v, %v; want OUT_OF_RANGE saying to re-list", ev, err)
	}
	relist, err := viewer.WatchMachines(ctx, &inventoryv1.WatchMachinesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	ev, err = relist.Recv()
	if err != nil || ev.GetType() != watchv1.EventType_ADDED || ev.GetMachine().GetState() != inventoryv1.Machine_MAINTENANCE {
		t.Fatalf("re-list: %v, %v; want the machine in MAINTENANCE", ev, err)
	}
}
