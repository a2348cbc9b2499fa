package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	auditv1 "github.com/corralhq/corral/api/audit/v1"
	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/api/clientconfig"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/testsupport/redfishtest"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// TestE2EAudit: the built corrald records who did what. An operator token
// made through TokenService and the admin token call it over TLS; the
// audit list names both callers correctly, the machine's timeline shows
// the power call, and neither the BMC password nor a token is in the list
// or anywhere in the store file.
func TestE2EAudit(t *testing.T) {
	needE2E(t)
	const bmcPass = "e2e-bmc-Pa55-audit"
	rf := redfishtest.Start(t, "root", bmcPass, &redfishtest.MemMachine{})
	dataDir, addr := t.TempDir(), freePort(t)
	d := startCorrald(t, dataDir, addr)
	cc, err := clientconfig.Load(filepath.Join(dataDir, "admin.conf"))
	if err != nil {
		t.Fatal(err)
	}
	dialTok := func(tok string) *grpc.ClientConn {
		conn, err := clientconfig.Dial(&clientconfig.Config{Endpoint: addr, CACert: cc.CACert, Token: tok})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin := dialTok(cc.Token)
	created, err := authv1.NewTokenServiceClient(admin).CreateToken(ctx, &authv1.CreateTokenRequest{Role: authv1.Role_ROLE_OPERATOR, Description: "night shift"})
	if err != nil {
		t.Fatal(err)
	}
	opID := created.GetInfo().GetId()
	op := dialTok(created.GetToken())
	mc := inventoryv1.NewMachineServiceClient(op)
	if _, err := mc.EnrollMachine(ctx, &inventoryv1.EnrollMachineRequest{Name: "rack1-u07", BmcAddress: rf.Host, BmcPort: uint32(rf.Port),
		BmcProtocol: inventoryv1.BmcProtocol_BMC_PROTOCOL_REDFISH, BmcUsername: "root", BmcPassword: bmcPass,
		BmcTlsSha256: rf.Fingerprint(), BootMac: "52:54:00:e2:e0:07"}); err != nil {
		t.Fatalf("enroll: %v", err)
	}
	if _, err := mc.SetPower(ctx, &inventoryv1.SetPowerRequest{Name: "rack1-u07", Action: inventoryv1.PowerAction_POWER_ACTION_OFF}); err != nil {
		t.Fatalf("power off: %v", err)
	}
	// The operator may not make tokens: refused, and recorded.
	if _, err := authv1.NewTokenServiceClient(op).CreateToken(ctx, &authv1.CreateTokenRequest{Role: authv1.Role_ROLE_ADMIN, Description: "me"}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("operator CreateToken: %v", err)
	}

	// The writer is asynchronous: wait for the four events.
	ac := auditv1.NewAuditServiceClient(admin)
	var evs []*auditv1.AuditEvent
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := ac.ListEvents(ctx, &auditv1.ListEventsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if evs = resp.GetEvents(); len(evs) >= 4 || time.Now().After(deadline) {
			break
		}
	}
	type row struct{ Who, Role, Method, Object, Code string }
	var got []row
	for _, e := range evs {
		got = append(got, row{e.GetWho(), e.GetRole().String(), strings.TrimPrefix(e.GetMethod(), "/corral."), e.GetObject(), e.GetCode()})
	}
	adminID := strings.TrimPrefix(strings.Split(evs[0].GetWho(), " ")[0], "token:")
	want := []row{
		{"token:" + adminID + " (first admin (admin.conf))", "ROLE_ADMIN", "auth.v1.TokenService/CreateToken", "token/" + opID, "OK"},
		{"token:" + opID + " (night shift)", "ROLE_OPERATOR", "inventory.v1.MachineService/EnrollMachine", "machine/rack1-u07", "OK"},
		{"token:" + opID + " (night shift)", "ROLE_OPERATOR", "inventory.v1.MachineService/SetPower", "machine/rack1-u07", "OK"},
		{"token:" + opID + " (night shift)", "ROLE_OPERATOR", "auth.v1.TokenService/CreateToken", "token", "PermissionDenied"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("audit events (-want +got):\n%s", diff)
	}
	if adminID == opID || len(adminID) != 16 {
		t.Errorf("admin token id %q", adminID)
	}
	// Filters: the machine's events.
	resp, err := ac.ListEvents(ctx, &auditv1.ListEventsRequest{Machine: "rack1-u07"})
	if err != nil || len(resp.GetEvents()) != 2 {
		t.Errorf("events of rack1-u07: %v, %v", resp.GetEvents(), err)
	}

	// The machine's timeline has the power call and who made it.
	wantEntry := "power off by token:" + opID + " (night shift)"
	var entries []*inventoryv1.TimelineEntry
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		tl, err := inventoryv1.NewMachineServiceClient(admin).Timeline(ctx, &inventoryv1.TimelineRequest{Name: "rack1-u07"})
		if err != nil {
			t.Fatal(err)
		}
		entries = tl.GetEntries()
		found := false
		for _, e := range entries {
			found = found || e.GetSource() == "api" && e.GetEvent() == wantEntry && e.GetDetail() == "OK"
		}
		if found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("timeline of rack1-u07 has no %q: %v", wantEntry, entries)
		}
	}

	// No secret in the list, nor in the store file once corrald stopped.
	listed, _ := protojson.Marshal(&auditv1.ListEventsResponse{Events: evs})
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := <-d.exited; err != nil {
		t.Fatalf("corrald exit: %v", err)
	}
	db, err := os.ReadFile(filepath.Join(dataDir, "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(db, []byte("rack1-u07")) || !bytes.Contains(db, []byte("/audit/")) {
		t.Fatal("the store file does not hold the machine and the audit events: not the store the test thinks")
	}
	for what, secret := range map[string]string{"BMC password": bmcPass, "operator token": created.GetToken(), "admin token": cc.Token} {
		if bytes.Contains(db, []byte(secret)) || bytes.Contains(listed, []byte(secret)) {
			t.Errorf("the %s is in the store file or the audit list", what)
		}
	}
}
