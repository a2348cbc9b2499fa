package lifecycle

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/inventory"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/testing/protocmp"
)

// The agent edge's bindings, tested through a second AgentServer on the
// harness's lifecycle whose Caller comes from request metadata: a
// hand-written stand-in for the auth interceptor (appliance wires
// the real one; cmd/corrald's attack tests run it end to end).

// callerCreds sends a Caller as metadata on every call.
type callerCreds Caller

func (c callerCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"x-role": map[CallerRole]string{CallerAdmin: "admin", CallerAgent: "agent", CallerNode: "node"}[c.Role],
		"x-id": c.ID, "x-mac": c.MAC, "x-machine": c.Machine, "x-node": c.Node}, nil
}

func (callerCreds) RequireTransportSecurity() bool { return false }

func mdCaller(ctx context.Context) (Caller, bool) {
	md, _ := metadata.FromIncomingContext(ctx)
	get := func(k string) string {
		if v := md.Get(k); len(v) == 1 {
			return v[0]
		}
		return ""
	}
	role := map[string]CallerRole{"admin": CallerAdmin, "agent": CallerAgent, "node": CallerNode}[get("x-role")]
	if role == 0 {
		return Caller{}, false
	}
	return Caller{Role: role, ID: get("x-id"), MAC: get("x-mac"), Machine: get("x-machine"), Node: get("x-node")}, true
}

// authed is the harness's lifecycle behind an AgentServer with callers.
type authed struct {
	*harness
	lis *bufconn.Listener
}

func newAuthed(t *testing.T, o harnessOpt, lim AgentLimits) *authed {
	t.Helper()
	h := newHarness(t, nil, o)
	h.lc.sess = newSessions(lim, nil)
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer()
	RegisterAgent(gs, &AgentServer{Lifecycle: h.lc, Caller: mdCaller})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = gs.Serve(lis) }()
	t.Cleanup(func() { gs.Stop(); wg.Wait() })
	return &authed{harness: h, lis: lis}
}

func (a *authed) client(c Caller) nodev1.AgentServiceClient {
	a.t.Helper()
	cc, err := grpc.NewClient("passthrough:///bufnet", grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
		return a.lis.DialContext(ctx)
	}), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(callerCreds(c)))
	if err != nil {
		a.t.Fatal(err)
	}
	a.t.Cleanup(func() { cc.Close() })
	return nodev1.NewAgentServiceClient(cc)
}

// session opens a Session with id and returns the stream once the
// appliance answered (wait), or the error it ended with.
func openSession(t *testing.T, c nodev1.AgentServiceClient, id string) (nodev1.AgentService_SessionClient, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := c.Session(ctx)
	if err != nil {
		return nil, err
	}
	if err := stream.Send(&nodev1.AgentMessage{Msg: &nodev1.AgentMessage_Heartbeat{Heartbeat: &nodev1.Heartbeat{SessionId: id}}}); err != nil {
		return nil, err
	}
	m, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	if m.GetWait() == nil {
		t.Fatalf("first message %v, want wait", m)
	}
	return stream, nil
}

// entries are a MAC's timeline entries named event.
func (a *authed) entries(mac, event string) []*inventoryv1.TimelineEntry {
	a.t.Helper()
	return macEntries(a.harness, mac, event)
}

func macEntries(a *harness, mac, event string) []*inventoryv1.TimelineEntry {
	a.t.Helper()
	ctx := context.Background()
	if err := a.inv.FlushTimeline(ctx); err != nil {
		a.t.Fatal(err)
	}
	es, err := a.inv.Timeline(ctx, "", mac, 0)
	if err != nil {
		a.t.Fatal(err)
	}
	var out []*inventoryv1.TimelineEntry
	for _, e := range es {
		if e.GetEvent() == event {
			out = append(out, e)
		}
	}
	return out
}

const (
	victimMAC = "52:54:00:00:0a:01"
	agentMAC  = "52:54:00:00:0a:02"
)

// TestRegisterBootTokenBinding: a per-boot token registers its own MAC and
// machine only.
func TestRegisterBootTokenBinding(t *testing.T) {
	tests := map[string]struct {
		// setup registers machines as an admin and returns the caller.
		caller  func(a *authed) Caller
		boot    string
		f       *inventoryv1.Facts
		refused string // "" = admitted
		want    string // the machine it lands on, when admitted
		parked  bool   // refused by parking the report in CONFLICT
	}{
		"another boot_mac": {
			caller: func(*authed) Caller { return Caller{Role: CallerAgent, ID: "t1", MAC: agentMAC, Machine: "m-agent"} },
			boot:   victimMAC, f: facts("SN-VICTIM", "", victimMAC),
			refused: "issued for boot MAC " + agentMAC,
		},
		"own boot_mac in another notation": {
			caller: func(*authed) Caller {
				return Caller{Role: CallerAgent, ID: "t1", MAC: agentMAC, Machine: "m-525400000a02"}
			},
			boot: "52-54-00-00-0A-02", f: facts("SN-AGENT", "", agentMAC), want: "m-525400000a02",
		},
		"own mac, victim's serial": {
			caller: func(a *authed) Caller {
				// The token's machine is a registered machine of its own:
				// the report cannot name another one.
				m, err := a.lc.Register(context.Background(), agentMAC, facts("", "", agentMAC))
				if err != nil {
					t.Fatal(err)
				}
				return Caller{Role: CallerAgent, ID: "t1", MAC: agentMAC, Machine: m.GetName()}
			},
			boot: agentMAC, f: facts("SN-VICTIM", "", agentMAC), refused: "its serial names machine m-525400000a01, but it comes from machine m-525400000a02's boot MAC", parked: true,
		},
		"the victim's serial from a new NIC is parked": {
			caller: func(a *authed) Caller {
				p, _, err := a.inv.EnsureMachineForMAC(context.Background(), agentMAC)
				if err != nil {
					t.Fatal(err)
				}
				return Caller{Role: CallerAgent, ID: "t1", MAC: agentMAC, Machine: p.GetName()}
			},
			boot: agentMAC, f: facts("SN-VICTIM", "", agentMAC), refused: "which neither boots from", parked: true,
		},
		"stale binding: the MAC moved": {
			caller: func(a *authed) Caller {
				return Caller{Role: CallerAgent, ID: "t1", MAC: victimMAC, Machine: "m-old"}
			},
			boot: victimMAC, f: facts("SN-VICTIM", "", victimMAC), refused: "now belongs to machine m-525400000a01",
		},
		"unbound agent token": {
			caller: func(*authed) Caller { return Caller{Role: CallerAgent, ID: "hand-made"} },
			boot:   agentMAC, f: facts("SN-AGENT", "", agentMAC), want: "m-525400000a02",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			a := newAuthed(t, harnessOpt{}, AgentLimits{})
			ctx := context.Background()
			victim, err := a.lc.Register(ctx, victimMAC, facts("SN-VICTIM", "", victimMAC))
			if err != nil {
				t.Fatal(err)
			}
			c := tc.caller(a)
			before := a.machine(victim.GetName())
			resp, err := a.client(c).Register(ctx, &nodev1.RegisterRequest{BootMac: tc.boot, Facts: tc.f})
			if tc.refused == "" {
				if err != nil || resp.GetMachineName() != tc.want {
					t.Fatalf("Register = %v, %v; want machine %s", resp, err, tc.want)
				}
				return
			}
			if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), tc.refused) {
				t.Fatalf("Register = %v, %v; want PermissionDenied %q", resp, err, tc.refused)
			}
			if diff := cmp.Diff(before, a.machine(victim.GetName()), protocmp.Transform()); diff != "" {
				t.Errorf("victim changed (-before +after):\n%s", diff)
			}
			if tc.parked {
				if es := a.entries(tc.boot, "register-conflict"); len(es) == 0 || es[0].GetAttributes()["claimed"] != victim.GetName() {
					t.Errorf("timeline of %s: register-conflict entries %v; want one naming %s", tc.boot, es, victim.GetName())
				}
				return
			}
			for _, mac := range []string{c.MAC, tc.boot} {
				es := a.entries(mac, "register-refused")
				if len(es) == 0 || es[0].GetAttributes()["token_id"] != "t1" || es[0].GetAttributes()["peer"] == "" {
					t.Errorf("timeline of %s: register-refused entries %v; want one with token_id and peer", mac, es)
				}
			}
		})
	}
}

// TestSessionBoundToRegistrant: a session id serves only the caller it
// was issued to; a stranger neither uses nor burns it.
func TestSessionBoundToRegistrant(t *testing.T) {
	a := newAuthed(t, harnessOpt{}, AgentLimits{})
	ctx := context.Background()
	owner := Caller{Role: CallerAgent, ID: "t1", MAC: victimMAC, Machine: "m-525400000a01"}
	resp, err := a.client(owner).Register(ctx, &nodev1.RegisterRequest{BootMac: victimMAC, Facts: facts("SN-V", "", victimMAC)})
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]Caller{
		"another boot token":            {Role: CallerAgent, ID: "t2", MAC: agentMAC, Machine: "m-525400000a02"},
		"a node certificate":            {Role: CallerNode, Node: resp.GetMachineName()},
		"an admin":                      {Role: CallerAdmin, ID: "admin"},
		"the same id, another role key": {Role: CallerNode, Node: "t1"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := openSession(t, a.client(c), resp.GetSessionId())
			if status.Code(err) != codes.PermissionDenied {
				t.Fatalf("Session = %v; want PermissionDenied", err)
			}
		})
	}
	if n := len(a.entries(victimMAC, "session-refused")); n != 4 {
		t.Errorf("%d session-refused entries; want 4", n)
	}
	if _, err := openSession(t, a.client(owner), resp.GetSessionId()); err != nil {
		t.Fatalf("the owner's Session after strangers tried its id: %v", err)
	}
	// Used once.
	if _, err := openSession(t, a.client(owner), resp.GetSessionId()); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a used id again: %v; want FailedPrecondition", err)
	}
}

// TestSecondSessionRefusedWhileAlive: the live session keeps the machine;
// a second one is refused until the first is dead.
func TestSecondSessionRefusedWhileAlive(t *testing.T) {
	a := newAuthed(t, harnessOpt{}, AgentLimits{HeartbeatTimeout: 30 * time.Second})
	ctx := context.Background()
	c := Caller{Role: CallerAgent, ID: "t1", MAC: victimMAC, Machine: "m-525400000a01"}
	f := facts("SN-V", "", victimMAC)
	register := func() string {
		resp, err := a.client(c).Register(ctx, &nodev1.RegisterRequest{BootMac: victimMAC, Facts: f})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetSessionId()
	}
	first, err := openSession(t, a.client(c), register())
	if err != nil {
		t.Fatal(err)
	}
	a.clk.Advance(29 * time.Second)
	if _, err := openSession(t, a.client(c), register()); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "already has a live agent session") {
		t.Fatalf("second session while alive: %v; want FailedPrecondition", err)
	}
	if n := len(a.entries(victimMAC, "session-refused")); n != 1 {
		t.Errorf("%d session-refused entries; want 1", n)
	}
	// The first session still gets the plan.
	if _, err := a.lc.Accept(ctx, "m-525400000a01", "", false); err != nil {
		t.Fatal(err)
	}
	if m, err := first.Recv(); err != nil || m.GetInstall() == nil {
		t.Fatalf("first session after accept: %v %v; want the plan", m, err)
	}
	// A heartbeat keeps it alive.
	if err := first.Send(&nodev1.AgentMessage{Msg: &nodev1.AgentMessage_Heartbeat{Heartbeat: &nodev1.Heartbeat{}}}); err != nil {
		t.Fatal(err)
	}
	// Wait until the heartbeat is handled.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		a.lc.sess.mu.Lock()
		st := a.lc.sess.streams["m-525400000a01"]
		beat := st != nil && st.beat.Equal(a.clk.Now())
		a.lc.sess.mu.Unlock()
		if beat {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("heartbeat not handled")
		}
	}
	a.clk.Advance(20 * time.Second)
	if _, err := openSession(t, a.client(c), register()); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("second session 20 s after a heartbeat: %v; want FailedPrecondition", err)
	}
	// Silent past the timeout: dead, replaced, and the old stream closed.
	a.clk.Advance(31 * time.Second)
	second, err := openSession(t, a.client(c), register())
	if err != nil {
		t.Fatalf("session after the first went silent: %v", err)
	}
	if m := recvInstall(t, second); m == nil {
		t.Fatal("the new session did not get the plan")
	}
	for {
		if _, err := first.Recv(); err != nil {
			if status.Code(err) != codes.Aborted {
				t.Errorf("old stream ended with %v; want Aborted", err)
			}
			break
		}
	}
}

func recvInstall(t *testing.T, s nodev1.AgentService_SessionClient) *nodev1.InstallPlan {
	t.Helper()
	for {
		m, err := s.Recv()
		if err != nil {
			t.Fatalf("session ended: %v", err)
		}
		if m.GetInstall() != nil {
			return m.GetInstall()
		}
	}
}

// TestSessionIDsExpireAndAreBounded: unused ids expire, registering again
// replaces the machine's id, and the table is bounded.
func TestSessionIDsExpireAndAreBounded(t *testing.T) {
	a := newAuthed(t, harnessOpt{}, AgentLimits{SessionIDTTL: 10 * time.Minute, MaxPendingSessions: 3})
	ctx := context.Background()
	admin := a.client(Caller{Role: CallerAdmin, ID: "admin"})
	reg := func(mac string) string {
		t.Helper()
		resp, err := admin.Register(ctx, &nodev1.RegisterRequest{BootMac: mac, Facts: facts("SN-"+mac, "", mac)})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetSessionId()
	}
	old := reg(victimMAC)
	fresh := reg(victimMAC)
	if _, err := openSession(t, admin, old); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("id replaced by a new Register: %v; want FailedPrecondition", err)
	}
	a.clk.Advance(11 * time.Minute)
	if _, err := openSession(t, admin, fresh); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("id unused for 11 minutes: %v; want FailedPrecondition", err)
	}
	for _, mac := range []string{"52:54:00:00:0b:01", "52:54:00:00:0b:02", "52:54:00:00:0b:03", "52:54:00:00:0b:04", "52:54:00:00:0b:05"} {
		reg(mac)
	}
	if n := a.lc.sess.pendingCount(); n != 3 {
		t.Errorf("%d pending session ids; want the bound, 3", n)
	}
}

// TestProgressCapped: step, detail and error are cut to the limit before
// they reach the timeline or the store.
func TestProgressCapped(t *testing.T) {
	a := newAuthed(t, harnessOpt{}, AgentLimits{MaxProgressBytes: 4096})
	ctx := context.Background()
	c := Caller{Role: CallerAdmin, ID: "admin"}
	resp, err := a.client(c).Register(ctx, &nodev1.RegisterRequest{BootMac: victimMAC, Facts: facts("SN-V", "", victimMAC)})
	if err != nil {
		t.Fatal(err)
	}
	s, err := openSession(t, a.client(c), resp.GetSessionId())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.lc.Accept(ctx, resp.GetMachineName(), "", false); err != nil {
		t.Fatal(err)
	}
	plan := recvInstall(t, s)
	huge := strings.Repeat("é", 50000) // 100 KB, two bytes a rune
	if err := s.Send(&nodev1.AgentMessage{Msg: &nodev1.AgentMessage_Progress{Progress: &nodev1.Progress{
		InstallId: plan.GetInstallId(), Step: "disk", Detail: huge}}}); err != nil {
		t.Fatal(err)
	}
	m := a.eventually(resp.GetMachineName(), "at disk", func(m *inventoryv1.Machine) bool { return m.GetInstall().GetStep() == "disk" })
	if d := m.GetInstall().GetDetail(); len(d) > 4096 || !strings.Contains(d, "[truncated 100000 bytes]") {
		t.Errorf("stored detail: %d bytes, ends %q", len(d), d[max(0, len(d)-40):])
	}
	es := a.entries(victimMAC, "progress: disk")
	if len(es) != 1 || len(es[0].GetDetail()) > 4096 {
		t.Fatalf("timeline progress entries %d (detail %d bytes)", len(es), len(es[0].GetDetail()))
	}
}

// TestProgressEscaped: control characters in a progress message are
// escaped before the store and the timeline; the install goes on.
func TestProgressEscaped(t *testing.T) {
	a := newAuthed(t, harnessOpt{}, AgentLimits{MaxProgressBytes: 4096})
	ctx := context.Background()
	c := Caller{Role: CallerAdmin, ID: "admin"}
	resp, err := a.client(c).Register(ctx, &nodev1.RegisterRequest{BootMac: victimMAC, Facts: facts("SN-V", "", victimMAC)})
	if err != nil {
		t.Fatal(err)
	}
	s, err := openSession(t, a.client(c), resp.GetSessionId())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.lc.Accept(ctx, resp.GetMachineName(), "", false); err != nil {
		t.Fatal(err)
	}
	plan := recvInstall(t, s)
	if err := s.Send(&nodev1.AgentMessage{Msg: &nodev1.AgentMessage_Progress{Progress: &nodev1.Progress{
		InstallId: plan.GetInstallId(), Step: "disk", Detail: "\x1b]0;owned\x07\x1b[2J\u009b31m\u202e"}}}); err != nil {
		t.Fatal(err)
	}
	m := a.eventually(resp.GetMachineName(), "at disk", func(m *inventoryv1.Machine) bool { return m.GetInstall().GetStep() == "disk" })
	want := `\x1b]0;owned\x07\x1b[2J\u009b31m\u202e`
	if d := m.GetInstall().GetDetail(); d != want {
		t.Errorf("stored detail %q, want %q", d, want)
	}
	es := a.entries(victimMAC, "progress: disk")
	if len(es) != 1 || es[0].GetDetail() != want {
		t.Fatalf("timeline progress entries %v", es)
	}
}

func TestTruncate(t *testing.T) {
	for name, tc := range map[string]struct {
		in    string
		limit int
		want  string
	}{
		"short":         {in: "abc", limit: 10, want: "abc"},
		"exact":         {in: "abcd", limit: 4, want: "abcd"},
		"cut":           {in: strings.Repeat("a", 100), limit: 30, want: strings.Repeat("a", 6) + "…[truncated 100 bytes]"},
		"rune boundary": {in: strings.Repeat("é", 50), limit: 31, want: strings.Repeat("é", 3) + "…[truncated 100 bytes]"},
		"tiny limit":    {in: strings.Repeat("a", 100), limit: 5, want: "....."},
	} {
		t.Run(name, func(t *testing.T) {
			got := truncate(tc.in, tc.limit)
			if got != tc.want || len(got) > tc.limit {
				t.Errorf("truncate = %q (%d bytes); want %q", got, len(got), tc.want)
			}
		})
	}
}

// TestPlansOnlyToIdentifiedSessions: sessions.send refuses an install or
// wipe plan for a stream that did not register by identity.
func TestPlansOnlyToIdentifiedSessions(t *testing.T) {
	s := newSessions(AgentLimits{}, nil)
	now := time.Now()
	done := make(chan struct{})
	defer close(done)
	for name, tc := range map[string]struct {
		identified bool
		msg        *nodev1.ApplianceMessage
		want       error
	}{
		"plan, identified":       {identified: true, msg: &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Install{Install: &nodev1.InstallPlan{}}}},
		"plan, not identified":   {msg: &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Install{Install: &nodev1.InstallPlan{}}}, want: apierr.ErrPermissionDenied},
		"wipe, not identified":   {msg: &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Wipe{Wipe: &nodev1.WipePlan{}}}, want: apierr.ErrPermissionDenied},
		"reboot, not identified": {msg: &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Reboot_{Reboot: &nodev1.ApplianceMessage_Reboot{}}}},
	} {
		t.Run(name, func(t *testing.T) {
			st, err := s.attach(name, pendingSession{machine: name, identified: tc.identified}, now, "", done)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.send(name, tc.msg); !errors.Is(err, tc.want) && err != tc.want {
				t.Errorf("send = %v; want %v", err, tc.want)
			}
			s.detach(name, st)
		})
	}
}

// TestAutoAcceptGuard: the serial allowlist and the flags.
func TestAutoAcceptGuard(t *testing.T) {
	tests := map[string]struct {
		serials []string
		flagged bool // another machine holds the report's NIC MAC
		serial  string
		skipped string // "" = accepted
	}{
		"no allowlist":             {serial: "SN-A"},
		"on the allowlist":         {serials: []string{"SN-B", "SN-A"}, serial: "SN-A"},
		"not on the allowlist":     {serials: []string{"SN-B"}, serial: "SN-A", skipped: "not on the --auto-accept-serials allowlist"},
		"no serial with allowlist": {serials: []string{"SN-B"}, skipped: "no real serial"},
		"flagged duplicate-serial": {serial: "SN-A", flagged: true, skipped: "flagged (duplicate-serial"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, nil, harnessOpt{auto: true})
			h.lc.cfg.AutoAcceptSerials = tc.serials
			ctx := context.Background()
			f := facts(tc.serial, "", victimMAC)
			if tc.flagged {
				// An operator adopted a machine that shares a serial.
				if _, err := h.inv.CreateMachine(ctx, &inventoryv1.Machine{Name: inventory.MachineNameForMAC(victimMAC), BootMac: victimMAC, Flags: []string{inventory.FlagDuplicateSerial + ": serial \"SN-A\" is also held by machine m-x"}}); err != nil {
					t.Fatal(err)
				}
			}
			m, err := h.lc.Register(ctx, victimMAC, f)
			if err != nil {
				t.Fatal(err)
			}
			if tc.skipped == "" {
				if m.GetState() != inventoryv1.Machine_INSTALLING {
					t.Fatalf("state %v; want INSTALLING (auto-accepted)", m.GetState())
				}
				return
			}
			if m.GetState() != inventoryv1.Machine_INVENTORIED {
				t.Fatalf("state %v; want INVENTORIED (skipped)", m.GetState())
			}
			es := macEntries(h, victimMAC, "auto-accept-skipped")
			if len(es) != 1 || !strings.Contains(es[0].GetDetail(), tc.skipped) {
				t.Errorf("auto-accept-skipped entries %v; want one saying %q", es, tc.skipped)
			}
		})
	}
}

// TestRegisterAgainAfterTheMACMoved: an agent keeps its boot token across
// Registers (it registers again after every session drop). When its MAC
// moved to the machine its report lands on — its own first report absorbed
// the MAC's placeholder, or an operator adopted its parked record — the
// next Register with the same token lands there too; it is not locked out
// until a reboot fetches a new script. A token bound to an unrelated
// machine stays refused ("stale binding" in TestRegisterBootTokenBinding).
func TestRegisterAgainAfterTheMACMoved(t *testing.T) {
	ctx := context.Background()
	register := func(a *authed, c Caller, f *inventoryv1.Facts) (string, error) {
		resp, err := a.client(c).Register(ctx, &nodev1.RegisterRequest{BootMac: c.MAC, Facts: f})
		return resp.GetMachineName(), err
	}
	t.Run("booted from a NIC its record listed", func(t *testing.T) {
		a := newAuthed(t, harnessOpt{}, AgentLimits{})
		victim, err := a.lc.Register(ctx, victimMAC, facts("SN-VICTIM", "", victimMAC, agentMAC))
		if err != nil {
			t.Fatal(err)
		}
		p, _, err := a.inv.EnsureMachineForMAC(ctx, agentMAC)
		if err != nil {
			t.Fatal(err)
		}
		c := Caller{Role: CallerAgent, ID: "t1", MAC: agentMAC, Machine: p.GetName()}
		for i := range 2 {
			if got, err := register(a, c, facts("SN-VICTIM", "", victimMAC, agentMAC)); err != nil || got != victim.GetName() {
				t.Fatalf("Register %d = %q, %v; want %s", i+1, got, err, victim.GetName())
			}
		}
	})
	t.Run("adopted", func(t *testing.T) {
		a := newAuthed(t, harnessOpt{}, AgentLimits{})
		victim, err := a.lc.Register(ctx, victimMAC, facts("SN-VICTIM", "", victimMAC))
		if err != nil {
			t.Fatal(err)
		}
		p, _, err := a.inv.EnsureMachineForMAC(ctx, agentMAC)
		if err != nil {
			t.Fatal(err)
		}
		c := Caller{Role: CallerAgent, ID: "t1", MAC: agentMAC, Machine: p.GetName()}
		f := facts("SN-VICTIM", "", agentMAC)
		if _, err := register(a, c, f); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("Register from an unlisted NIC = %v; want PermissionDenied (parked)", err)
		}
		if _, err := a.inv.AdoptMachine(ctx, inventory.ConflictName(agentMAC), false); err != nil {
			t.Fatal(err)
		}
		if got, err := register(a, c, f); err != nil || got != victim.GetName() {
			t.Fatalf("Register after the adopt = %q, %v; want %s", got, err, victim.GetName())
		}
		// The same token bound to the parked record's name (a script
		// fetched while it was parked) lands too.
		c.Machine = inventory.ConflictName(agentMAC)
		if got, err := register(a, c, f); err != nil || got != victim.GetName() {
			t.Fatalf("Register with the parked name's token = %q, %v; want %s", got, err, victim.GetName())
		}
	})
}
