package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/internal/termsafe"
	"github.com/corralhq/corral/inventory"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// AgentServer is the gRPC edge agents on machines dial: Register, the
// command Session, and Join (node enrolment), which cmd wires because it
// needs the CA. Errors become gRPC statuses in toStatus only.
//
// Who may do what (the caller comes from Caller, i.e. the auth layer):
//   - a per-boot AGENT token (bound to a boot MAC and machine) registers
//     only its own boot MAC, and lands only on its own machine — or, when
//     that machine is a DHCP placeholder the report absorbs, on the machine
//     the report's identity names; anything else is PermissionDenied,
//     recorded on the timelines of both the token's MAC and the claimed
//     one with the token id and the peer address;
//   - a session id serves only the caller that registered it (same token
//     id, or the same node certificate name): a NODE certificate may only
//     ever hold a session of the machine of its own name;
//   - an AGENT token an admin made by hand (bound to nothing) and ADMIN
//     tokens register any MAC; the inventory's identity rules apply to
//     every caller.
type AgentServer struct {
	nodev1.UnimplementedAgentServiceServer
	Lifecycle *Lifecycle
	// JoinFunc serves Join; nil answers Unimplemented.
	JoinFunc func(ctx context.Context, req *nodev1.JoinRequest) (*nodev1.JoinResponse, error)
	// Caller says who is calling, from the authenticated principal in ctx
	// (appliance wires it to auth.FromContext); ok=false refuses the
	// call as Unauthenticated. nil trusts every caller like an admin: for
	// tests that run the edge without authentication only.
	Caller func(ctx context.Context) (c Caller, ok bool)
	// TPM, when set, serves AttestBegin and checks the TPM proofs
	// Register carries (attest.go); nil answers AttestBegin Unimplemented.
	TPM TPMVerifier
}

// CallerRole is the kind of principal calling the agent edge.
type CallerRole int

const (
	// CallerAdmin is a person's token (the interceptor lets only ADMIN
	// through to this edge).
	CallerAdmin CallerRole = iota + 1
	// CallerAgent is a discovery agent's token.
	CallerAgent
	// CallerNode is an installed node's certificate.
	CallerNode
)

// Caller is who called the agent edge, as the auth layer established it.
type Caller struct {
	Role CallerRole
	// ID is the token id ("" for a certificate).
	ID string
	// MAC and Machine bind a per-boot agent token (lower-case colon MAC);
	// empty for a token bound to nothing.
	MAC, Machine string
	// Node is a certificate's node name (its common name).
	Node string
}

// key is what a session id is bound to: the token, or the certificate's
// name.
func (c Caller) key() string {
	if c.Role == CallerNode {
		return "node:" + c.Node
	}
	return "token:" + c.ID
}

func (c Caller) String() string {
	switch {
	case c.Role == CallerNode:
		return "node certificate " + c.Node
	case c.MAC != "":
		return fmt.Sprintf("boot token %s (MAC %s, machine %s)", c.ID, c.MAC, c.Machine)
	case c.Role == CallerAgent:
		return "agent token " + c.ID
	}
	return "token " + c.ID
}

// trusted is the caller when AgentServer.Caller is nil.
var trusted = Caller{Role: CallerAdmin}

// RegisterAgent registers srv's AgentService on s.
func RegisterAgent(s grpc.ServiceRegistrar, srv *AgentServer) {
	nodev1.RegisterAgentServiceServer(s, srv)
}

// toStatus is this package's one mapping from error classes to gRPC
// status, for both of its edges.
func toStatus(err error) error { return apierr.ToStatus(err) }

func (s *AgentServer) caller(ctx context.Context) (Caller, error) {
	if s.Caller == nil {
		return trusted, nil
	}
	c, ok := s.Caller(ctx)
	if !ok {
		return Caller{}, status.Error(codes.Unauthenticated, "agent service: no authenticated caller")
	}
	return c, nil
}

// Join serves JoinFunc, or answers Unimplemented when there is none.
func (s *AgentServer) Join(ctx context.Context, req *nodev1.JoinRequest) (*nodev1.JoinResponse, error) {
	if s.JoinFunc == nil {
		return s.UnimplementedAgentServiceServer.Join(ctx, req)
	}
	resp, err := s.JoinFunc(ctx, req)
	if err != nil {
		return nil, toStatus(err)
	}
	return resp, nil
}

// Register records a discovery agent's report (Lifecycle.register, bound
// to the caller's boot token) and returns the machine's name and the id of
// the session the agent opens next. Node certificates are refused.
func (s *AgentServer) Register(ctx context.Context, req *nodev1.RegisterRequest) (*nodev1.RegisterResponse, error) {
	c, err := s.caller(ctx)
	if err != nil {
		return nil, err
	}
	l := s.Lifecycle
	if c.Role == CallerNode {
		return nil, status.Error(codes.PermissionDenied, "Register is for discovery agents, not node certificates")
	}
	ek, err := s.proveTPM(ctx, c, req)
	if err != nil {
		return nil, toStatus(err)
	}
	var match inventory.Match
	m, err := l.register(ctx, c, peerAddr(ctx), req.GetBootMac(), req.GetFacts(), ek, &match)
	if err != nil {
		return nil, toStatus(err)
	}
	kexec := c.Role != CallerNode && slices.Contains(req.GetCapabilities(), nodev1.CapabilityKexec)
	prefetch := slices.Contains(req.GetCapabilities(), nodev1.CapabilityKexecPrefetch)
	id := l.sess.open(m.GetName(), m.GetBootMac(), c.key(), match.Identified, kexec, prefetch, l.now())
	return &nodev1.RegisterResponse{MachineName: m.GetName(), SessionId: id}, nil
}

// Register records a discovery report (inventory.Register) and, in the
// same machine mutation, auto-accepts a machine that just became
// INVENTORIED when the policy says so. The accepted plan goes when the
// registering agent opens its session (at once if one is already open).
// It applies no caller binding: the agent edge does (AgentServer).
func (l *Lifecycle) Register(ctx context.Context, bootMAC string, facts *inventoryv1.Facts) (*inventoryv1.Machine, error) {
	var match inventory.Match
	return l.register(ctx, trusted, "", bootMAC, facts, "", &match)
}

// register is Register for caller c (from peer): a bound boot token must
// name its own MAC and land on its own machine (see AgentServer). ek is
// the endorsement key the caller proved ("" for none).
func (l *Lifecycle) register(ctx context.Context, c Caller, peer, bootMAC string, facts *inventoryv1.Facts, ek string, match *inventory.Match) (*inventoryv1.Machine, error) {
	var admit func(inventory.Match) error
	if c.MAC != "" {
		boot, err := inventory.NormalizeMAC(bootMAC)
		if err != nil {
			return nil, fmt.Errorf("boot_mac: %w", err)
		}
		if boot != c.MAC {
			return nil, l.refuseRegister(c, peer, boot, "", fmt.Sprintf("the token was issued for boot MAC %s, not %s", c.MAC, boot))
		}
		admit = func(mt inventory.Match) error {
			if why := tokenMachineMismatch(c, mt); why != "" {
				return l.refuseRegister(c, peer, boot, machineMAC(mt.Machine), why)
			}
			return nil
		}
	}
	var acc autoAccepted
	m, err := l.inv.Register(ctx, bootMAC, facts, l.withEK(inventory.RegisterOptions{
		Admit: func(mt inventory.Match) error {
			*match = mt
			if admit != nil {
				return admit(mt)
			}
			return nil
		},
		Hook: func(m *inventoryv1.Machine, became bool) {
			acc = l.autoAccept(m, became)
		},
	}, bootMAC, ek))
	if err != nil {
		return nil, err
	}
	return l.afterAutoAccept(ctx, m, acc), nil
}

// tokenMachineMismatch says why a boot token bound to c.Machine may not
// land on the matched machine, or "". It may land on its own machine; on
// another only when its own was a DHCP placeholder (or is gone) that the
// report absorbs, the report having matched the other by its identity, or
// when the token was issued for its MAC's own placeholder or parked record
// and the MAC now belongs to the machine the report lands on.
func tokenMachineMismatch(c Caller, mt inventory.Match) string {
	if mt.Name == c.Machine {
		return ""
	}
	h := mt.Holder
	if h != nil && h.GetName() == mt.Name && macNamed(c) {
		// The token was issued for whatever machine its MAC is (the
		// MAC's placeholder or parked record), and the MAC now belongs to
		// the very machine the report lands on: its own earlier report
		// landed there, absorbing the placeholder, or an operator adopted
		// its parked record. A script fetched now would bind the token to
		// that machine (auth.Tokens.IssueBoot); the agent, which keeps its
		// token across Registers, is not locked out until it reboots.
		return ""
	}
	switch {
	case h != nil && h.GetName() != c.Machine:
		return fmt.Sprintf("the token was issued for machine %s, but MAC %s now belongs to machine %s: fetch a new boot script", c.Machine, c.MAC, h.GetName())
	case h != nil && !inventory.Placeholder(h):
		return fmt.Sprintf("the token is good for machine %s only, and the report names machine %s (by %s)", c.Machine, mt.Name, mt.By)
	case !mt.Identified:
		return fmt.Sprintf("machine %s was not matched by its identity", mt.Name)
	}
	return ""
}

// macNamed reports whether the token's machine is a name derived from its
// own boot MAC: the MAC's DHCP placeholder or its parked CONFLICT record.
func macNamed(c Caller) bool {
	return c.Machine == inventory.MachineNameForMAC(c.MAC) || c.Machine == inventory.ConflictName(c.MAC)
}

// refuseRegister records a Register refused for a token binding on the
// timelines of the token's MAC and of the claimed one (claimed: the boot
// MAC asked for; other: the matched machine's MAC, when it differs) and
// returns the PermissionDenied error.
func (l *Lifecycle) refuseRegister(c Caller, peer, claimed, other, why string) error {
	attrs := map[string]string{"token_id": c.ID, "peer": peer, "token_mac": c.MAC, "token_machine": c.Machine, "boot_mac": claimed}
	detail := "Register refused: " + why
	seen := map[string]bool{}
	for _, mac := range []string{c.MAC, claimed, other} {
		if mac != "" && !seen[mac] {
			seen[mac] = true
			l.note(mac, "register-refused", detail, attrs)
		}
	}
	l.warn("agent Register refused", "token_id", c.ID, "mac", claimed, "machine", c.Machine, "peer", peer, "reason", why)
	return apierr.PermissionDeniedf("%s", why)
}

// Session serves an agent's session stream. The agent's first message
// must be a heartbeat carrying the session id Register returned to the
// same caller. The appliance answers
// with `wait`, then sends commands as they are issued; the agent sends
// heartbeats and progress.
func (s *AgentServer) Session(stream nodev1.AgentService_SessionServer) error {
	ctx := stream.Context()
	c, err := s.caller(ctx)
	if err != nil {
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	l := s.Lifecycle
	pa := peerAddr(ctx)
	id, found, mine := l.sess.take(first.GetHeartbeat().GetSessionId(), c.key(), l.now())
	if !found {
		return status.Error(codes.FailedPrecondition, "session: first message must be a heartbeat with an unused session id from Register (ids are used once and expire unused)")
	}
	machine := id.machine
	if !mine || (c.Role == CallerNode && c.Node != machine) {
		why := fmt.Sprintf("session id of machine %s was not issued to %s", machine, c)
		l.note(id.mac, "session-refused", why, map[string]string{"token_id": c.ID, "peer": pa, "node": c.Node})
		l.warn("agent Session refused", "machine", machine, "mac", id.mac, "token_id", c.ID, "node", c.Node, "peer", pa, "reason", "session id of another caller")
		return status.Error(codes.PermissionDenied, "session: "+why)
	}
	local := ""
	if p, ok := peer.FromContext(ctx); ok && p.LocalAddr != nil {
		local = p.LocalAddr.String()
	}
	st, err := l.sess.attach(machine, id, l.now(), local, ctx.Done())
	if err != nil {
		l.note(id.mac, "session-refused", err.Error(), map[string]string{"token_id": c.ID, "peer": pa})
		l.warn("second agent session refused", "machine", machine, "mac", id.mac, "token_id", c.ID, "peer", pa)
		return toStatus(err)
	}
	defer l.sess.detach(machine, st)
	// In a fleet, the one-live-session rule spans the appliances (claims.go).
	cl, err := l.claimSession(ctx, machine, pa)
	if err != nil {
		l.note(id.mac, "session-refused", err.Error(), map[string]string{"token_id": c.ID, "peer": pa})
		l.warn("second agent session refused", "machine", machine, "mac", id.mac, "token_id", c.ID, "peer", pa, "reason", "live on another appliance")
		return toStatus(err)
	}
	defer l.releaseClaim(cl)
	lostClaim := make(chan struct{})
	var lostOnce sync.Once
	l.heartbeat(ctx, machine)
	// Commands queued now (a pending install plan or wipe) wait in the
	// stream's channel and follow the `wait` below; queuing them first
	// means the agent's first answer comes only once the appliance has
	// looked at its machine.
	l.onConnect(ctx, machine)
	if err := stream.Send(&nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Wait_{Wait: &nodev1.ApplianceMessage_Wait{}}}); err != nil {
		return err
	}
	recvErr := make(chan error, 1)
	go func() {
		for {
			msg, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			if !l.sess.current(machine, st) {
				continue // found dead and replaced: nothing it says counts
			}
			switch x := msg.GetMsg().(type) {
			case *nodev1.AgentMessage_Heartbeat:
				l.sess.beat(machine, st, l.now())
				if !l.beatClaim(ctx, cl) {
					lostOnce.Do(func() { close(lostClaim) })
				}
				l.heartbeat(ctx, machine)
			case *nodev1.AgentMessage_Progress:
				p := l.capProgress(machine, x.Progress)
				attrs := map[string]string{"done": boolString(p.GetDone())}
				if p.GetError() != "" {
					attrs["error"] = p.GetError()
				}
				l.ev.Event(id.mac, "agent", "progress: "+p.GetStep(), p.GetDetail(), attrs)
				l.onProgress(ctx, machine, p)
			case *nodev1.AgentMessage_Csr:
				l.onCSR(ctx, machine, x.Csr)
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-recvErr:
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
				return nil
			}
			return err
		case <-lostClaim:
			return status.Error(codes.Aborted, "session closed: another appliance took over this machine's session after it went stale")
		case cmd, ok := <-st.ch:
			if !ok {
				return status.Error(codes.Aborted, "session closed: it was found dead (no heartbeat within the timeout) and replaced by a newer one of the same machine")
			}
			if err := stream.Send(cmd); err != nil {
				return err
			}
		}
	}
}

// capProgress truncates a progress message's step, detail and error to
// AgentLimits.MaxProgressBytes each (at a UTF-8 boundary, with a marker
// saying how much was cut) and its install id to 64 bytes, and escapes
// their control characters (internal/termsafe: free text from the
// machine, shown on operators' terminals; replaced rather than refused, so
// an install is never failed by its own log line), before any of it
// reaches a log line, the timeline or the store. The message is copied
// only when something is cut or escaped.
func (l *Lifecycle) capProgress(machine string, p *nodev1.Progress) *nodev1.Progress {
	limit := l.sess.lim.MaxProgressBytes
	fits := len(p.GetStep()) <= limit && len(p.GetDetail()) <= limit && len(p.GetError()) <= limit && len(p.GetInstallId()) <= maxInstallID
	if fits && !termsafe.Has(p.GetStep()) && !termsafe.Has(p.GetDetail()) && !termsafe.Has(p.GetError()) && !termsafe.Has(p.GetInstallId()) {
		return p
	}
	esc := func(s string, n int) string { return truncate(termsafe.Escape(s), n) }
	c := &nodev1.Progress{Step: esc(p.GetStep(), limit), Detail: esc(p.GetDetail(), limit), Done: p.GetDone(),
		Error: esc(p.GetError(), limit), InstallId: esc(p.GetInstallId(), maxInstallID)}
	if fits {
		return c
	}
	l.warn("agent progress truncated", "machine", machine, "max_bytes", limit,
		"step_bytes", len(p.GetStep()), "detail_bytes", len(p.GetDetail()), "error_bytes", len(p.GetError()))
	return c
}

// maxInstallID bounds a progress message's install id (ours are 16 hex
// digits): a longer one matches nothing and is cut before it is logged.
const maxInstallID = 64

// truncate cuts s to at most limit bytes, marker included, at a rune
// boundary.
func truncate(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	marker := "…[truncated " + strconv.Itoa(len(s)) + " bytes]"
	keep := limit - len(marker)
	if keep < 0 {
		return strings.Repeat(".", limit)
	}
	for keep > 0 && !utf8.RuneStart(s[keep]) {
		keep--
	}
	return s[:keep] + marker
}

// warn logs a refusal or a limit that bit, at most a few lines a second
// across the agent edge (a flood of refused calls cannot flood the log);
// lines dropped are counted in the next one.
func (l *Lifecycle) warn(msg string, args ...any) {
	if dropped, ok := l.sess.warnGate.Allow(); ok {
		if dropped > 0 {
			args = append(args, "suppressed", dropped)
		}
		l.log.Warn(msg, args...)
	}
}

// note puts a refusal of the agent edge on mac's timeline: at most 20 a
// second (bursts of 100) across the edge, so that a flood of refused calls
// cannot turn into a flood of store writes; the log line (warn) counts
// what is dropped.
func (l *Lifecycle) note(mac, event, detail string, attrs map[string]string) {
	if _, ok := l.sess.noteGate.Allow(); ok {
		l.ev.Event(mac, "agent", event, detail, attrs)
	}
}

func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

// heartbeat records that machine's agent is alive, persisting last_seen at
// most once a minute per machine.
func (l *Lifecycle) heartbeat(ctx context.Context, machine string) {
	now := l.now()
	if !l.sess.seenDue(machine, now) {
		return
	}
	_, err := l.inv.UpdateMachine(ctx, machine, func(m *inventoryv1.Machine) error {
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		m.Annotations[inventory.AnnotationLastSeen] = now.UTC().Format("2006-01-02T15:04:05Z")
		return nil
	})
	if err != nil {
		l.log.Debug("last_seen not updated", "machine", machine, "err", err)
	}
}

func boolString(b bool) string {
	if b {
		return "true"
	}
	return "false"
}
