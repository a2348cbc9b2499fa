package web_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/web"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
)

// TestPageRoutes: the REST routes the page calls (package rest, on the
// page's listener) answer as the gRPC API does for the caller's token
// (the same interceptor decides): a viewer reads, its mutations are
// refused 403 with {"code":7}, an operator's go through; the list pages
// (pageSize, pageToken) in the SUMMARY view; bad input is refused 400;
// the page's old hand-written routes are gone.
func TestPageRoutes(t *testing.T) {
	a := startAppliance(t)
	name := a.machine(t, "SN-GW-1", "52:54:00:aa:00:01")
	a.machine(t, "SN-GW-2", "52:54:00:aa:00:03")
	viewer, operator := a.tokens[authv1.Role_ROLE_VIEWER], a.tokens[authv1.Role_ROLE_OPERATOR]
	const js = "application/json"
	m := "/v1/machines/" + name
	for tn, tc := range map[string]struct {
		method, path, token, ctype, body string
		want                             int
		wantCode                         codes.Code // error code in the body, OK for success
		wantIn                           string     // a substring of the body
	}{
		"no token":           {"GET", "/v1/machines", "", "", "", 401, codes.Unauthenticated, ""},
		"not bearer":         {"GET", "/v1/machines", "Basic dXNlcjpwdw==", "", "", 401, codes.Unauthenticated, ""},
		"unknown token":      {"GET", "/v1/machines", "not-a-token", "", "", 401, codes.Unauthenticated, ""},
		"viewer lists":       {"GET", "/v1/machines?view=MACHINE_VIEW_SUMMARY&pageSize=1000", viewer, "", "", 200, codes.OK, `"serial":"SN-GW-1"`},
		"list garbled token": {"GET", "/v1/machines?pageToken=x", viewer, "", "", 400, codes.InvalidArgument, "token"},
		"unknown parameter":  {"GET", "/v1/machines?page_sise=1", viewer, "", "", 400, codes.InvalidArgument, "page_sise"},
		"viewer gets":        {"GET", m, viewer, "", "", 200, codes.OK, `"state":"INVENTORIED"`},
		"viewer timeline":    {"GET", m + "/timeline?limit=50", viewer, "", "", 200, codes.OK, `"source":"tftp"`},
		"missing machine":    {"GET", "/v1/machines/nope", viewer, "", "", 404, codes.NotFound, ""},
		"viewer accept":      {"POST", m + ":accept", viewer, js, `{"disk":"auto"}`, 403, codes.PermissionDenied, ""},
		"viewer power":       {"POST", m + "/power", viewer, js, `{"action":"POWER_ACTION_CYCLE"}`, 403, codes.PermissionDenied, ""},
		"viewer maintenance": {"POST", m + ":maintenance", viewer, js, `{"on":true}`, 403, codes.PermissionDenied, ""},
		"bad power action":   {"POST", m + "/power", operator, js, `{"action":"explode"}`, 400, codes.InvalidArgument, "explode"},
		"unknown field":      {"POST", m + ":accept", operator, js, `{"disk":"auto","force":true}`, 400, codes.InvalidArgument, "force"},
		"viewer nodes":       {"GET", "/v1/nodes", viewer, "", "", 200, codes.OK, ""},
		"viewer vms":         {"GET", "/v1/virtual-machines", viewer, "", "", 200, codes.OK, ""},
		"viewer volumes":     {"GET", "/v1/block-storages", viewer, "", "", 200, codes.OK, ""},
		"viewer pools":       {"GET", "/v1/standby-pools", viewer, "", "", 200, codes.OK, ""},
	} {
		t.Run(tn, func(t *testing.T) {
			res, got := a.do(t, tc.method, tc.path, tc.token, tc.ctype, tc.body)
			if res.StatusCode != tc.want {
				t.Fatalf("%s %s = %d %s, want %d", tc.method, tc.path, res.StatusCode, got, tc.want)
			}
			if got := res.Header.Get("Cache-Control"); got != "no-store" {
				t.Errorf("Cache-Control = %q, want no-store", got)
			}
			if tc.wantCode != codes.OK {
				var e struct {
					Code    codes.Code
					Message string
				}
				if err := json.Unmarshal([]byte(got), &e); err != nil {
					t.Fatalf("error body %q: %v", got, err)
				}
				if e.Code != tc.wantCode {
					t.Errorf("code = %v (%s), want %v", e.Code, e.Message, tc.wantCode)
				}
			}
			if !strings.Contains(got, tc.wantIn) {
				t.Errorf("body %s lacks %q", got, tc.wantIn)
			}
		})
	}

	// The page's list: a page at a time, summaries (no fact history).
	var seen []string
	token := ""
	for range 3 {
		path := "/v1/machines?view=MACHINE_VIEW_SUMMARY&pageSize=1"
		if token != "" {
			path += "&pageToken=" + url.QueryEscape(token)
		}
		res, got := a.do(t, "GET", path, viewer, "", "")
		if res.StatusCode != http.StatusOK {
			t.Fatalf("GET %s = %d %s", path, res.StatusCode, got)
		}
		var page struct {
			Machines []struct {
				Name        string
				FactHistory []json.RawMessage
			}
			NextPageToken string
		}
		if err := json.Unmarshal([]byte(got), &page); err != nil {
			t.Fatal(err)
		}
		for _, mc := range page.Machines {
			seen = append(seen, mc.Name)
			if len(mc.FactHistory) > 0 {
				t.Errorf("the SUMMARY list carries %s's fact history", mc.Name)
			}
		}
		if token = page.NextPageToken; token == "" {
			break
		}
	}
	if len(seen) != 2 {
		t.Errorf("paging with pageSize=1 read %v, want both machines", seen)
	}

	// The hand-written routes the page used are gone.
	for _, path := range []string{"/api/machines", "/api/machines/" + name, "/api/nodes", "/api/watch/machines", "/api/standby-pools"} {
		if res, got := a.do(t, "GET", path, viewer, "", ""); res.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s = %d %s, want 404", path, res.StatusCode, got)
		}
	}

	// An operator may; the record changed through the same RPC.
	res, got := a.do(t, "POST", m+":maintenance", operator, js, `{"on":true,"reason":"web test"}`)
	if res.StatusCode != http.StatusOK || !strings.Contains(got, `"state":"MAINTENANCE"`) {
		t.Fatalf("operator maintenance = %d %s", res.StatusCode, got)
	}
	mc, err := a.admin.GetMachine(context.Background(), &inventoryv1.GetMachineRequest{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	if mc.GetState() != inventoryv1.Machine_MAINTENANCE {
		t.Errorf("state after the page's maintenance = %v", mc.GetState())
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
		"whoami":  {"/api/whoami", 401, "application/json"},
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

// TestWatchStream: the page's machine watch (REST, NDJSON) answers a
// stream whose first lines are the machines as ADDED then SYNCED
// (corral.watch.v1), each line {"result":<event>}; bad input and a
// missing token are refused before the RPC.
func TestWatchStream(t *testing.T) {
	a := startAppliance(t)
	name := a.machine(t, "SN-W-1", "52:54:00:aa:00:02")
	viewer := a.tokens[authv1.Role_ROLE_VIEWER]

	res, body := a.do(t, "GET", "/v1/watch/machines?fromRevision=x", viewer, "", "")
	if res.StatusCode != http.StatusBadRequest || !strings.Contains(body, "fromRevision") {
		t.Errorf("garbled revision = %d %s", res.StatusCode, body)
	}
	res, _ = a.do(t, "GET", "/v1/watch/machines", "", "", "")
	if res.StatusCode != http.StatusUnauthorized {
		t.Errorf("watch without a token = %d", res.StatusCode)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, a.base+"/v1/watch/machines?view=MACHINE_VIEW_SUMMARY", nil)
	req.Header.Set("Authorization", "Bearer "+viewer)
	r, err := a.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	if r.StatusCode != http.StatusOK {
		t.Fatalf("watch = %d", r.StatusCode)
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/x-ndjson" {
		t.Errorf("Content-Type = %q", ct)
	}
	sc := bufio.NewScanner(r.Body)
	var types []string
	for len(types) < 2 && sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var ev struct {
			Result struct {
				Type    string
				Machine struct{ Name string }
			}
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		types = append(types, ev.Result.Type+" "+ev.Result.Machine.Name)
	}
	if d := cmp.Diff([]string{"ADDED " + name, "SYNCED "}, types); d != "" {
		t.Errorf("first events (-want +got):\n%s", d)
	}
}

func TestHTTPStatus(t *testing.T) {
	for c, want := range map[codes.Code]int{
		codes.OK: 200, codes.InvalidArgument: 400, codes.OutOfRange: 400, codes.Unauthenticated: 401,
		codes.PermissionDenied: 403, codes.NotFound: 404, codes.AlreadyExists: 409, codes.FailedPrecondition: 400,
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

// TestShutdownWithWatchOpen: corrald stops cleanly while the page's REST
// watch is open (the web listener is shut down before the gRPC server's
// GracefulStop, which cannot drain the in-process transports REST runs
// on). The rig's cleanup fails the test if Run does not return nil.
func TestShutdownWithWatchOpen(t *testing.T) {
	// Registered before the rig's: closed after the appliance stopped.
	var body io.Closer
	t.Cleanup(func() {
		if body != nil {
			body.Close()
		}
	})
	a := startAppliance(t)
	a.machine(t, "SN-STOP-1", "52:54:00:aa:00:04")
	req, _ := http.NewRequest(http.MethodGet, a.base+"/v1/watch/machines?view=MACHINE_VIEW_SUMMARY", nil)
	req.Header.Set("Authorization", "Bearer "+a.tokens[authv1.Role_ROLE_VIEWER])
	r, err := a.client.Do(req) //nolint:bodyclose // closed by the cleanup registered before the rig's, once the appliance stopped
	if err != nil {
		t.Fatal(err)
	}
	if r.StatusCode != http.StatusOK {
		t.Fatalf("watch = %d", r.StatusCode)
	}
	sc := bufio.NewScanner(r.Body)
	for sc.Scan() {
		if strings.Contains(sc.Text(), `"SYNCED"`) {
			break
		}
	}
	// The body stays open: the appliance stops under it (the rig's
	// cleanup), which ends the stream.
	body = r.Body
}
