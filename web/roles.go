package web

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	consolev1 "github.com/corralhq/corral/api/console/v1"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// An action is one thing the page can change, named as the page names it,
// with the RPC that does it and what it does in words.
type action struct {
	name   string // the page's name: accept, power, maintenance
	method string // the RPC's full method name
	what   string // completes "cannot ...": "accept machines"
}

// actions are the page's mutating calls. The role each needs is read from
// the RPC's access option, the one the API's interceptor enforces.
var actions = []action{
	{"accept", inventoryv1.MachineService_AcceptMachine_FullMethodName, "accept machines"},
	{"power", inventoryv1.MachineService_SetPower_FullMethodName, "switch machines' power"},
	{"maintenance", inventoryv1.MachineService_SetMaintenance_FullMethodName, "put machines into or out of maintenance"},
	{"console", consolev1.ConsoleService_Attach_FullMethodName, "open machines' consoles"},
}

// needs is the least role the method's access option names (ADMIN when it
// names none: only an admin may call a method without one).
func needs(fullMethod string) authv1.Role {
	name := protoreflect.FullName(strings.ReplaceAll(strings.TrimPrefix(fullMethod, "/"), "/", "."))
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(name)
	if err != nil {
		return authv1.Role_ROLE_ADMIN
	}
	md, ok := d.(protoreflect.MethodDescriptor)
	if !ok {
		return authv1.Role_ROLE_ADMIN
	}
	a, _ := proto.GetExtension(md.Options(), authv1.E_Access).(*authv1.Access)
	if a.GetRole() == authv1.Role_ROLE_UNSPECIFIED {
		return authv1.Role_ROLE_ADMIN
	}
	return a.GetRole()
}

// rank orders the human roles; any other role ranks 0 and may nothing here.
func rank(r authv1.Role) int {
	switch r {
	case authv1.Role_ROLE_VIEWER:
		return 1
	case authv1.Role_ROLE_USER:
		return 2
	case authv1.Role_ROLE_OPERATOR:
		return 3
	case authv1.Role_ROLE_ADMIN:
		return 4
	default: // ROLE_UNSPECIFIED and the machine roles (node, agent, appliance)
		return 0
	}
}

// allowed mirrors the API's rule for people: VIEWER < USER < OPERATOR < ADMIN.
// The page uses it to hide buttons; the API still decides every call.
func allowed(r authv1.Role, need authv1.Role) bool {
	return rank(r) > 0 && rank(r) >= rank(need)
}

// roleName is a role as people write it: viewer, operator, admin.
func roleName(r authv1.Role) string {
	return strings.ToLower(strings.TrimPrefix(r.String(), "ROLE_"))
}

// article is "a" or "an" for a role name.
func article(word string) string {
	if strings.ContainsAny(word[:1], "aeio") { // "a user": its u is spoken "you"
		return "an"
	}
	return "a"
}

// refusal says in words why the role may not do a: "Your token's role
// (viewer) cannot accept machines; an operator token can." An unknown
// role (no Config.Role) is left out.
func refusal(r authv1.Role, a action) string {
	need := roleName(needs(a.method))
	who := "Your token's role"
	if r != authv1.Role_ROLE_UNSPECIFIED {
		who += " (" + roleName(r) + ")"
	}
	return who + " cannot " + a.what + "; " + article(need) + " " + need + " token can."
}

// whoamiAction is one action in the /api/whoami answer.
type whoamiAction struct {
	Allowed bool   `json:"allowed"`
	Needs   string `json:"needs"`
	Refusal string `json:"refusal,omitempty"`
}

// whoami answers the caller's role and, for each action of the page,
// whether the role may do it, the least role that may, and the refusal in
// words.
func (h *Handler) whoami(w http.ResponseWriter, r *http.Request) {
	if _, err := callerCredentials(r); err != nil {
		writeError(w, err)
		return
	}
	if h.cfg.Role == nil {
		writeError(w, status.Error(codes.Unimplemented, "this appliance does not tell the page its caller's role"))
		return
	}
	role, err := h.callerRole(r)
	if err != nil {
		writeError(w, err)
		return
	}
	out := struct {
		Role    string                  `json:"role"`
		Actions map[string]whoamiAction `json:"actions"`
	}{roleName(role), map[string]whoamiAction{}}
	for _, a := range actions {
		need := needs(a.method)
		wa := whoamiAction{Allowed: allowed(role, need), Needs: roleName(need)}
		if !wa.Allowed {
			wa.Refusal = refusal(role, a)
		}
		out.Actions[a.name] = wa
	}
	b, err := json.Marshal(out)
	if err != nil {
		writeError(w, status.Errorf(codes.Internal, "encode response: %v", err))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(append(b, '\n')) // a failed write means the client has gone
}

// callerRole asks Config.Role for the role of the request's token; any
// error there is an Unauthenticated answer (the page then signs out).
func (h *Handler) callerRole(r *http.Request) (authv1.Role, error) {
	tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.CallTimeout)
	defer cancel()
	role, err := h.cfg.Role(ctx, tok)
	if err != nil {
		if ctx.Err() != nil {
			return 0, status.FromContextError(ctx.Err()).Err()
		}
		h.logFailure(r, status.Error(codes.Unauthenticated, err.Error()))
		return 0, status.Error(codes.Unauthenticated, "the appliance does not accept this token (unknown, revoked or expired)")
	}
	return role, nil
}
