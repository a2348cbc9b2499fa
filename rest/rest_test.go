package rest

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"google.golang.org/grpc"
)

// TestHandler: the handler over a gRPC server whose MachineService
// implements nothing. Input that does not decode is refused before the
// server (400, 413); what decodes reaches the server in process, whose
// Unimplemented is 501, for a unary call and a watch alike.
func TestHandler(t *testing.T) {
	srv := grpc.NewServer()
	inventoryv1.RegisterMachineServiceServer(srv, inventoryv1.UnimplementedMachineServiceServer{})
	h, err := New(Config{Server: srv, Logger: slog.New(slog.DiscardHandler), MaxBodyBytes: 1 << 10})
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		method, path, body string
		code               int
		says               string
	}{
		"list":               {"GET", "/v1/machines?view=MACHINE_VIEW_SUMMARY&pageSize=5", "", 501, `"code":12`},
		"get":                {"GET", "/v1/machines/rack1-u07", "", 501, `"code":12`},
		"custom verb":        {"POST", "/v1/machines/rack1-u07:maintenance", `{"on":true}`, 501, `"code":12`},
		"unknown parameter":  {"GET", "/v1/machines?colour=red", "", 400, `unknown query parameter`},
		"bad enum":           {"GET", "/v1/machines?view=HUGE", "", 400, `"code":3`},
		"bad number":         {"GET", "/v1/machines?page_size=many", "", 400, `"code":3`},
		"unknown body field": {"POST", "/v1/machines/rack1-u07:maintenance", `{"on":true,"colour":"red"}`, 400, `unknown field`},
		"malformed body":     {"POST", "/v1/machines/rack1-u07:maintenance", `{"on":`, 400, `"code":3`},
		"oversized body":     {"POST", "/v1/machines/rack1-u07:maintenance", `{"reason":"` + strings.Repeat("x", 2<<10) + `"}`, 413, `"code":8`},
		"watch":              {"GET", "/v1/watch/machines?name=rack1-u07", "", 501, `"code":12`},
		"watch bad param":    {"GET", "/v1/watch/machines?colour=red", "", 400, `unknown query parameter`},
		"watch bad revision": {"GET", "/v1/watch/machines?from_revision=-x", "", 400, `"code":3`},
		"no such watch":      {"GET", "/v1/watch/kettles", "", 404, `"code":5`},
		"openapi":            {"GET", "/openapi.json", "", 200, `"swagger": "2.0"`},
	} {
		t.Run(name, func(t *testing.T) {
			var body *strings.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			var r *http.Request
			if body != nil {
				r = httptest.NewRequest(tc.method, tc.path, body)
			} else {
				r = httptest.NewRequest(tc.method, tc.path, nil)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != tc.code || !strings.Contains(w.Body.String(), tc.says) {
				t.Errorf("%s %s: %d %s, want %d with %s", tc.method, tc.path, w.Code, w.Body.String(), tc.code, tc.says)
			}
		})
	}
}
