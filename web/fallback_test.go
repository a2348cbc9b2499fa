package web_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/web"
	"google.golang.org/grpc"
)

// TestOlderAppliance: against an API without the Watch RPCs (here: one
// whose MachineService implements nothing) the REST watch answers 501
// before any line, which is what makes the page poll the list instead (an
// appliance without the route answers 404, which the page takes the same
// way); without Config.Role, /api/whoami answers 501 (the page then shows
// every action and leaves the refusals to the API).
func TestOlderAppliance(t *testing.T) {
	gs := grpc.NewServer()
	inventoryv1.RegisterMachineServiceServer(gs, inventoryv1.UnimplementedMachineServiceServer{})
	h, err := web.New(web.Config{Conn: unusedConn{}})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewUnstartedServer(pageMux(t, gs, h))
	hs.EnableHTTP2 = true
	hs.StartTLS()
	t.Cleanup(hs.Close)
	for _, path := range []string{"/api/whoami", "/v1/watch/machines", "/v1/watch/machines/m-1/timeline"} {
		req, _ := http.NewRequest(http.MethodGet, hs.URL+path, nil)
		req.Header.Set("Authorization", "Bearer crl_x_y")
		res, err := hs.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusNotImplemented || !strings.Contains(string(b), "mplemented") {
			t.Errorf("GET %s = %d %s, want 501 Unimplemented", path, res.StatusCode, b)
		}
	}
}

// unusedConn is a connection no call of the test reaches.
type unusedConn struct{ grpc.ClientConnInterface }
