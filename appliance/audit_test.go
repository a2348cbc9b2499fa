package appliance

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/testsupport/storecheck"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	auditv1 "github.com/corralhq/corral/api/audit/v1"
	authv1 "github.com/corralhq/corral/api/auth/v1"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/appliance/audit"
	"github.com/corralhq/corral/testsupport/redfishtest"
)

// TestAuditRulesCoverEveryRPC: every method corrald serves is classified
// in the audit's table (package audit checks each rule of the table:
// reads named like reads, no mutation a viewer may call).
func TestAuditRulesCoverEveryRPC(t *testing.T) {
	srv, _ := startServer(t, t.TempDir())
	n := 0
	for svc, info := range srv.grpc.GetServiceInfo() {
		for _, m := range info.Methods {
			method := "/" + svc + "/" + m.Name
			if !audit.Classified(method) && strings.HasPrefix(method, "/grpc.") {
				continue
			}
			n++
			if !audit.Classified(method) {
				t.Errorf("%s is not in audit's rules: classify it (mutating, read or machine traffic)", method)
			}
		}
	}
	if n < 40 {
		t.Errorf("only %d methods checked: are the services registered?", n)
	}
}

// auditView is what the tests compare of an event.
type auditView struct {
	Who, Method, Object, Machine, Code, TokenID, Description string
	Role                                                     authv1.Role
}

func viewOf(evs []*auditv1.AuditEvent) []auditView {
	var out []auditView
	for _, e := range evs {
		out = append(out, auditView{Who: e.GetWho(), Method: strings.TrimPrefix(e.GetMethod(), "/corral."), Object: e.GetObject(), Machine: e.GetMachine(),
			Code: e.GetCode(), TokenID: e.GetTokenId(), Description: e.GetTokenDescription(), Role: e.GetRole()})
	}
	return out
}

// TestAuditRecordsCalls drives a real appliance over gRPC: mutating calls
// are recorded with who, what and the outcome, refused calls too, reads
// not; the power call is on the machine's timeline; no secret is stored.
func TestAuditRecordsCalls(t *testing.T) {
	const bmcPass = "bmc-Pa55word-audit-test"
	rf := redfishtest.Start(t, "root", bmcPass, &redfishtest.MemMachine{})
	srv, cc := startServer(t, t.TempDir())
	ctx := context.Background()
	admin := dial(t, cc, "")
	opTok, err := srv.Tokens().Create(ctx, authv1.Role_ROLE_OPERATOR, "ops-team", 0)
	if err != nil {
		t.Fatal(err)
	}
	viewTok := newToken(t, srv, authv1.Role_ROLE_VIEWER)
	op, viewer := dial(t, cc, opTok), dial(t, cc, viewTok)
	anon := dial(t, cc, "")
	ids := map[string]string{}
	for name, tok := range map[string]string{"admin": cc.Token, "op": opTok, "viewer": viewTok} {
		p, err := srv.Tokens().Authenticate(ctx, tok)
		if err != nil {
			t.Fatal(err)
		}
		ids[name] = p.ID
	}

	mc := inventoryv1.NewMachineServiceClient(op)
	if _, err := mc.EnrollMachine(ctx, &inventoryv1.EnrollMachineRequest{Name: "m-01", BmcAddress: rf.Host, BmcPort: uint32(rf.Port),
		BmcProtocol: inventoryv1.BmcProtocol_BMC_PROTOCOL_REDFISH, BmcUsername: "root", BmcPassword: bmcPass,
		BmcTlsSha256: rf.Fingerprint(), BootMac: "52:54:00:aa:bb:01"}); err != nil {
		t.Fatalf("enroll: %v", err)
	}
	if _, err := mc.SetPower(ctx, &inventoryv1.SetPowerRequest{Name: "m-01", Action: inventoryv1.PowerAction_POWER_ACTION_OFF}); err != nil {
		t.Fatalf("power off: %v", err)
	}
	// Reads: not recorded.
	if _, err := inventoryv1.NewMachineServiceClient(viewer).ListMachines(ctx, &inventoryv1.ListMachinesRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := inventoryv1.NewMachineServiceClient(viewer).GetPower(ctx, &inventoryv1.GetPowerRequest{Name: "m-01"}); err != nil {
		t.Fatal(err)
	}
	// Refused: recorded.
	_, err = inventoryv1.NewMachineServiceClient(viewer).SetPower(ctx, &inventoryv1.SetPowerRequest{Name: "m-01", Action: inventoryv1.PowerAction_POWER_ACTION_ON})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("viewer power on: %v", err)
	}
	_, err = poolv1.NewNodeServiceClient(anon).DeleteNode(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer nonsense"), &poolv1.DeleteNodeRequest{Name: "n-9"})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("anonymous delete: %v", err)
	}
	// A failed call: recorded with its code.
	_, err = inventoryv1.NewMachineServiceClient(op).AcceptMachine(ctx, &inventoryv1.AcceptMachineRequest{Name: "nope"})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("accept of an unknown machine: %v", err)
	}
	created, err := authv1.NewTokenServiceClient(admin).CreateToken(ctx, &authv1.CreateTokenRequest{Role: authv1.Role_ROLE_VIEWER, Description: "dashboard"})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.audit.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	resp, err := auditv1.NewAuditServiceClient(op).ListEvents(ctx, &auditv1.ListEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want := []auditView{
		{Who: "token:" + ids["op"] + " (ops-team)", Method: "inventory.v1.MachineService/EnrollMachine", Object: "machine/m-01", Machine: "m-01", Code: "OK", TokenID: ids["op"], Description: "ops-team", Role: authv1.Role_ROLE_OPERATOR},
		{Who: "token:" + ids["op"] + " (ops-team)", Method: "inventory.v1.MachineService/SetPower", Object: "machine/m-01", Machine: "m-01", Code: "OK", TokenID: ids["op"], Description: "ops-team", Role: authv1.Role_ROLE_OPERATOR},
		{Who: "token:" + ids["viewer"] + " (test)", Method: "inventory.v1.MachineService/SetPower", Object: "machine/m-01", Machine: "m-01", Code: "PermissionDenied", TokenID: ids["viewer"], Description: "test", Role: authv1.Role_ROLE_VIEWER},
		{Who: "unauthenticated", Method: "pool.v1.NodeService/DeleteNode", Object: "node/n-9", Code: "Unauthenticated"},
		{Who: "token:" + ids["op"] + " (ops-team)", Method: "inventory.v1.MachineService/AcceptMachine", Object: "machine/nope", Machine: "nope", Code: "NotFound", TokenID: ids["op"], Description: "ops-team", Role: authv1.Role_ROLE_OPERATOR},
		{Who: "token:" + ids["admin"] + " (first admin (admin.conf))", Method: "auth.v1.TokenService/CreateToken", Object: "token/" + created.GetInfo().GetId(), Code: "OK", TokenID: ids["admin"], Description: "first admin (admin.conf)", Role: authv1.Role_ROLE_ADMIN},
	}
	if diff := cmp.Diff(want, viewOf(resp.GetEvents())); diff != "" {
		t.Errorf("audit events (-want +got):\n%s", diff)
	}
	for _, e := range resp.GetEvents() {
		if e.GetAppliance() != srv.cfg.Fleet.Name || e.GetPeer() == "" || e.GetAt() == nil || e.GetId() == "" {
			t.Errorf("event %s: appliance %q (want %q), peer %q, at %v", e.GetId(), e.GetAppliance(), srv.cfg.Fleet.Name, e.GetPeer(), e.GetAt())
		}
		if e.GetCode() != "OK" && e.GetMessage() == "" {
			t.Errorf("event %s: %s without a message", e.GetId(), e.GetCode())
		}
	}

	// The power call is on the machine's timeline, saying who.
	wantEntry := "power off by token:" + ids["op"] + " (ops-team)"
	var entries []*inventoryv1.TimelineEntry
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		tl, err := inventoryv1.NewMachineServiceClient(viewer).Timeline(ctx, &inventoryv1.TimelineRequest{Name: "m-01"})
		if err != nil {
			t.Fatal(err)
		}
		entries = tl.GetEntries()
		if slices.ContainsFunc(entries, func(e *inventoryv1.TimelineEntry) bool {
			return e.GetSource() == "api" && e.GetEvent() == wantEntry && e.GetDetail() == "OK"
		}) || time.Now().After(deadline) {
			break
		}
	}
	if !slices.ContainsFunc(entries, func(e *inventoryv1.TimelineEntry) bool { return e.GetEvent() == wantEntry }) {
		t.Errorf("timeline has no %q entry: %v", wantEntry, entries)
	}
	for _, e := range entries {
		if e.GetSource() == "api" && strings.Contains(e.GetEvent(), ids["viewer"]) {
			t.Errorf("a refused call is on the timeline: %v", e)
		}
	}

	// A deleted machine's call goes on the timeline of its MAC (read
	// before the delete).
	if _, err := mc.DeleteMachine(ctx, &inventoryv1.DeleteMachineRequest{Name: "m-01"}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	wantDelete := "delete by token:" + ids["op"] + " (ops-team)"
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		tl, err := inventoryv1.NewMachineServiceClient(viewer).Timeline(ctx, &inventoryv1.TimelineRequest{Mac: "52:54:00:aa:bb:01"})
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(tl.GetEntries(), func(e *inventoryv1.TimelineEntry) bool { return e.GetEvent() == wantDelete }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the MAC's timeline has no %q: %v", wantDelete, tl.GetEntries())
		}
	}

	// Secrets: the BMC password, the new token and the tokens used are
	// nowhere in the store nor in the list.
	secrets := map[string]string{"bmc password": bmcPass, "created token": created.GetToken(), "operator token": opTok, "admin token": cc.Token}
	storecheck.NoSecrets(t, srv.store, secrets, resp)
}

// TestAuditWatch: a watcher from revision 0 gets the recent events, SYNCED,
// then new events live; one resuming from a revision gets only later ones.
func TestAuditWatch(t *testing.T) {
	srv, cc := startServer(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := dial(t, cc, "")
	nc := poolv1.NewNetworkServiceClient(admin)
	if _, err := nc.ApplyNetwork(ctx, &poolv1.ApplyNetworkRequest{Name: "before", Ipv4Cidr: "10.9.0.0/24"}); err != nil {
		t.Fatal(err)
	}
	if err := srv.audit.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	ac := auditv1.NewAuditServiceClient(admin)
	w, err := ac.WatchEvents(ctx, &auditv1.WatchEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	next := func(w auditv1.AuditService_WatchEventsClient) (string, string, int64) {
		t.Helper()
		ev, err := w.Recv()
		if err != nil {
			t.Fatalf("watch: %v", err)
		}
		return ev.GetType().String(), ev.GetEvent().GetObject(), ev.GetRevision()
	}
	if typ, obj, _ := next(w); typ != "ADDED" || obj != "network/before" {
		t.Fatalf("first event %s %s; want ADDED network/before", typ, obj)
	}
	typ, _, synced := next(w)
	if typ != "SYNCED" {
		t.Fatalf("second event %s; want SYNCED", typ)
	}
	if _, err := nc.ApplyNetwork(ctx, &poolv1.ApplyNetworkRequest{Name: "after", Ipv4Cidr: "10.9.1.0/24"}); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.ListNetworks(ctx, &poolv1.ListNetworksRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.DeleteNetwork(ctx, &poolv1.DeleteNetworkRequest{Name: "nope"}); status.Code(err) != codes.NotFound {
		t.Fatalf("delete of an unknown network: %v", err)
	}
	var got []string
	for range 2 {
		typ, obj, _ := next(w)
		got = append(got, typ+" "+obj)
	}
	if diff := cmp.Diff([]string{"ADDED network/after", "ADDED network/nope"}, got); diff != "" {
		t.Errorf("live events (-want +got):\n%s", diff)
	}
	// Resumed after SYNCED: the live events only.
	r, err := ac.WatchEvents(ctx, &auditv1.WatchEventsRequest{FromRevision: synced})
	if err != nil {
		t.Fatal(err)
	}
	if typ, obj, _ := next(r); typ != "ADDED" || obj != "network/after" {
		t.Errorf("resumed watch: %s %s; want ADDED network/after", typ, obj)
	}
}
