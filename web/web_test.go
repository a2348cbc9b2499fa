package web_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/web"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
)

// TestGateway: the JSON API answers as the gRPC API does for the caller's
// token (the same interceptor decides), with HTTP codes for its statuses,
// and refuses bad input before calling anything.
func TestGateway(t *testing.T) {
	a := startAppliance(t)
	name := a.machine(t, "SN-GW-1", "52:54:00:aa:00:01")
	viewer, operator := a.tokens[authv1.Role_ROLE_VIEWER], a.tokens[authv1.Role_ROLE_OPERATOR]
	const js = "application/json"
	for tn, tc := range map[string]struct {
		method, path, token, ctype, body string
		want                             int
		wantCode                         string // error code in the body, "" for success
		wantIn                           string // a substring of the body
	}{
		"no token":             {"GET", "/api/machines", "", "", "", 401, "Unauthenticated", "Bearer"},
		"not bearer":           {"GET", "/api/machines", "Basic dXNlcjpwdw==", "", "", 401, "Unauthenticated", "Bearer"},
		"unknown token":        {"GET", "/api/machines", "not-a-token", "", "", 401, "Unauthenticated", ""},
		"viewer lists":         {"GET", "/api/machines", viewer, "", "", 200, "", `"serial":"SN-GW-1"`},
		"list page size":       {"GET", "/api/machines?page_size=0", viewer, "", "", 400, "InvalidArgument", "page_size"},
		"list garbled token":   {"GET", "/api/machines?page_token=x", viewer, "", "", 400, "InvalidArgument", "page_token"},
		"viewer gets":          {"GET", "/api/machines/" + name, viewer, "", "", 200, "", `"state":"INVENTORIED"`},
		"viewer timeline":      {"GET", "/api/machines/" + name + "/timeline?limit=50", viewer, "", "", 200, "", `"source":"tftp"`},
		"timeline limit":       {"GET", "/api/machines/" + name + "/timeline?limit=0", viewer, "", "", 400, "InvalidArgument", "limit"},
		"missing machine":      {"GET", "/api/machines/nope", viewer, "", "", 404, "NotFound", ""},
		"viewer accept":        {"POST", "/api/machines/" + name + "/accept", viewer, js, `{"disk":"auto"}`, 403, "PermissionDenied", "Your token's role (viewer) cannot accept machines; an operator token can."},
		"viewer power":         {"POST", "/api/machines/" + name + "/power", viewer, js, `{"action":"cycle"}`, 403, "PermissionDenied", "Your token's role (viewer) cannot switch machines' power; an operator token can."},
		"viewer maintenance":   {"POST", "/api/machines/" + name + "/maintenance", viewer, js, `{"on":true}`, 403, "PermissionDenied", "Your token's role (viewer) cannot put machines into or out of maintenance; an operator token can."},
		"bad power action":     {"POST", "/api/machines/" + name + "/power", operator, js, `{"action":"explode"}`, 400, "InvalidArgument", "explode"},
		"not json":             {"POST", "/api/machines/" + name + "/accept", operator, "text/plain", `{}`, 415, "InvalidArgument", "application/json"},
		"unknown field":        {"POST", "/api/machines/" + name + "/accept", operator, js, `{"disk":"auto","force":true}`, 400, "InvalidArgument", "force"},
		"two objects":          {"POST", "/api/machines/" + name + "/accept", operator, js, `{} {}`, 400, "InvalidArgument", "more"},
		"too large":            {"POST", "/api/machines/" + name + "/accept", operator, js, `{"disk":"` + strings.Repeat("x", web.MaxBodyBytes) + `"}`, 413, "InvalidArgument", ""},
		"maintenance needs on": {"POST", "/api/machines/" + name + "/maintenance", operator, js, `{}`, 400, "InvalidArgument", "on"},
		"unknown api path":     {"GET", "/api/frobnicate", viewer, "", "", 404, "NotFound", ""},
		"viewer nodes":         {"GET", "/api/nodes", viewer, "", "", 200, "", ""},
		"viewer vms":           {"GET", "/api/vms", viewer, "", "", 200, "", ""},
		"viewer volumes":       {"GET", "/api/volumes", viewer, "", "", 200, "", ""},
	} {
		t.Run(tn, func(t *testing.T) {
			res, got := a.do(t, tc.method, tc.path, tc.token, tc.ctype, tc.body)
			if res.StatusCode != tc.want {
				t.Fatalf("%s %s = %d %s, want %d", tc.method, tc.path, res.StatusCode, got, tc.want)
			}
			if got := res.Header.Get("Cache-Control"); got != "no-store" {
				t.Errorf("Cache-Control = %q, want no-store", got)
			}
			if tc.wantCode != "" {
				var e struct {
					Error struct{ Code, Message string }
				}
				if err := json.Unmarshal([]byte(got), &e); err != nil {
					t.Fatalf("error body %q: %v", got, err)
				}
				if e.Error.Code != tc.wantCode {
					t.Errorf("code = %q (%s), want %q", e.Error.Code, e.Error.Message, tc.wantCode)
				}
			}
			if !strings.Contains(got, tc.wantIn) {
				t.Errorf("body %s lacks %q", got, tc.wantIn)
			}
		})
	}

	// An operator may; the record changed through the same RPC.
	res, got := a.do(t, "POST", "/api/machines/"+name+"/maintenance", operator, "application/json", `{"on":true,"reason":"web test"}`)
	if res.StatusCode != http.StatusOK || !strings.Contains(got, `"state":"MAINTENANCE"`) {
		t.Fatalf("operator maintenance = %d %s", res.StatusCode, got)
	}
	m, err := a.admin.GetMachine(context.Background(), &inventoryv1.GetMachineRequest{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	if m.GetState() != inventoryv1.Machine_MAINTENANCE {
		t.Errorf("state after the page's maintenance = %v", m.GetState())
	}
}

// TestWhoami: /api/whoami tells the page the token's role and which of
// its actions the role may do, as the API's access options say; a token
// the appliance does not accept is 401.
func TestWhoami(t *testing.T) {
	a := startAppliance(t)
	type act struct {
		Allowed bool
		Needs   string
		Refusal string
	}
	type whoami struct {
		Role    string
		Actions map[string]act
	}
	refused := func(role, what string) act {
		return act{false, "operator", "Your token's role (" + role + ") cannot " + what + "; an operator token can."}
	}
	for tn, tc := range map[string]struct {
		token string
		want  whoami
	}{
		"viewer": {a.tokens[authv1.Role_ROLE_VIEWER], whoami{"viewer", map[string]act{
			"accept":      refused("viewer", "accept machines"),
			"power":       refused("viewer", "switch machines' power"),
			"maintenance": refused("viewer", "put machines into or out of maintenance"),
			"console":     refused("viewer", "open machines' consoles"),
		}}},
		"operator": {a.tokens[authv1.Role_ROLE_OPERATOR], whoami{"operator", map[string]act{
			"accept": {true, "operator", ""}, "power": {true, "operator", ""}, "maintenance": {true, "operator", ""}, "console": {true, "operator", ""},
		}}},
	} {
		t.Run(tn, func(t *testing.T) {
			res, body := a.do(t, "GET", "/api/whoami", tc.token, "", "")
			if res.StatusCode != http.StatusOK {
				t.Fatalf("whoami = %d %s", res.StatusCode, body)
			}
			var got whoami
			if err := json.Unmarshal([]byte(body), &got); err != nil {
				t.Fatalf("whoami body %s: %v", body, err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("whoami (-want +got):\n%s", d)
			}
		})
	}
	for tn, tok := range map[string]string{"no token": "", "unknown token": "crl_nope_nope", "not a token": "not-a-token"} {
		if res, body := a.do(t, "GET", "/api/whoami", tok, "", ""); res.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "Unauthenticated") {
			t.Errorf("%s: whoami = %d %s, want 401", tn, res.StatusCode, body)
		}
	}
}

// TestHeaders: the page and the API carry the strict headers; the page
// is served from the embedded files, with no directory listings.
func TestHeaders(t *testing.T) {
	a := startAppliance(t)
	for tn, tc := range map[string]struct {
		path  string
		want  int
		ctype string
	}{
		"index":   {"/", 200, "text/html"},
		"script":  {"/assets/app.js", 200, "text/javascript"},
		"style":   {"/assets/app.css", 200, "text/css"},
		"listing": {"/assets/", 404, ""},
		"missing": {"/assets/nope.js", 404, ""},
		"api":     {"/api/machines", 401, "application/json"},
	} {
		t.Run(tn, func(t *testing.T) {
			res, _ := a.do(t, "GET", tc.path, "", "", "")
			if res.StatusCode != tc.want {
				t.Fatalf("GET %s = %d, want %d", tc.path, res.StatusCode, tc.want)
			}
			if !strings.HasPrefix(res.Header.Get("Content-Type"), tc.ctype) {
				t.Errorf("Content-Type = %q, want %s", res.Header.Get("Content-Type"), tc.ctype)
			}
			got := map[string]string{
				"Content-Security-Policy": res.Header.Get("Content-Security-Policy"),
				"X-Frame-Options":         res.Header.Get("X-Frame-Options"),
				"X-Content-Type-Options":  res.Header.Get("X-Content-Type-Options"),
				"Referrer-Policy":         res.Header.Get("Referrer-Policy"),
			}
			want := map[string]string{
				"Content-Security-Policy": web.ContentSecurityPolicy,
				"X-Frame-Options":         "DENY",
				"X-Content-Type-Options":  "nosniff",
				"Referrer-Policy":         "no-referrer",
			}
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("headers (-want +got):\n%s", d)
			}
			if c := res.Header.Values("Set-Cookie"); len(c) > 0 {
				t.Errorf("sets cookies: %v", c)
			}
		})
	}
	if !strings.Contains(web.ContentSecurityPolicy, "script-src 'self';") || strings.Contains(web.ContentSecurityPolicy, "unsafe") {
		t.Errorf("CSP allows more than this origin's scripts: %s", web.ContentSecurityPolicy)
	}
}

// TestWatchStream: a watch answers either a stream whose first lines are
// the machines as ADDED then SYNCED (corral.watch.v1), or, on an
// appliance without the Watch RPC, 501 before any line (the page then
// polls). Bad input is refused before the RPC.
func TestWatchStream(t *testing.T) {
	a := startAppliance(t)
	name := a.machine(t, "SN-W-1", "52:54:00:aa:00:02")
	viewer := a.tokens[authv1.Role_ROLE_VIEWER]

	res, body := a.do(t, "GET", "/api/watch/machines?from_revision=-1", viewer, "", "")
	if res.StatusCode != http.StatusBadRequest || !strings.Contains(body, "from_revision") {
		t.Errorf("negative revision = %d %s", res.StatusCode, body)
	}
	res, _ = a.do(t, "GET", "/api/watch/machines", "", "", "")
	if res.StatusCode != http.StatusUnauthorized {
		t.Errorf("watch without a token = %d", res.StatusCode)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, a.base+"/api/watch/machines", nil)
	req.Header.Set("Authorization", "Bearer "+viewer)
	r, err := a.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	switch r.StatusCode {
	case http.StatusNotImplemented:
		var e struct{ Error struct{ Code string } }
		if err := json.NewDecoder(r.Body).Decode(&e); err != nil || e.Error.Code != codes.Unimplemented.String() {
			t.Errorf("501 body: %v %+v", err, e)
		}
		t.Log("this appliance has no WatchMachines yet: the page polls")
	case http.StatusOK:
		if ct := r.Header.Get("Content-Type"); ct != "application/x-ndjson" {
			t.Errorf("Content-Type = %q", ct)
		}
		sc := bufio.NewScanner(r.Body)
		var types []string
		for sc.Scan() && len(types) < 2 {
			if strings.TrimSpace(sc.Text()) == "" {
				continue
			}
			var ev struct {
				Type    string
				Machine struct{ Name string }
			}
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				t.Fatalf("line %q: %v", sc.Text(), err)
			}
			types = append(types, ev.Type+" "+ev.Machine.Name)
		}
		if d := cmp.Diff([]string{"ADDED " + name, "SYNCED "}, types); d != "" {
			t.Errorf("first events (-want +got):\n%s", d)
		}
	default:
		t.Fatalf("watch = %d", r.StatusCode)
	}
}

func TestHTTPStatus(t *testing.T) {
	for c, want := range map[codes.Code]int{
		codes.OK: 200, codes.InvalidArgument: 400, codes.OutOfRange: 400, codes.Unauthenticated: 401,
		codes.PermissionDenied: 403, codes.NotFound: 404, codes.AlreadyExists: 409, codes.FailedPrecondition: 409,
		codes.Aborted: 409, codes.ResourceExhausted: 429, codes.Canceled: 499, codes.Internal: 500, codes.Unknown: 500,
		codes.DataLoss: 500, codes.Unimplemented: 501, codes.Unavailable: 503, codes.DeadlineExceeded: 504,
	} {
		if got := web.HTTPStatus(c); got != want {
			t.Errorf("HTTPStatus(%v) = %d, want %d", c, got, want)
		}
	}
}

func TestNewRefuses(t *testing.T) {
	for name, cfg := range map[string]web.Config{
		"no conn": {},
	} {
		if _, err := web.New(cfg); err == nil {
			t.Errorf("%s: New accepted %+v", name, cfg)
		}
	}
}
