package web_test

import (
	"crypto/tls"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/corralhq/corral/auth/pki"
	"github.com/corralhq/corral/web"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// TestOlderAppliance: against an API without the Watch RPCs (here: one
// with no services at all) a watch answers 501 Unimplemented before any
// line, which is what makes the page poll the list instead; without
// Config.Role, /api/whoami answers 501 too (the page then shows every
// action and leaves the refusals to the API).
func TestOlderAppliance(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.EnsureCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.EnsureServerCert(dir, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	h, err := web.New(web.Config{Conn: conn})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	for _, path := range []string{"/api/whoami", "/api/watch/machines", "/api/watch/machines/m-1/timeline", "/api/watch/nodes", "/api/watch/vms", "/api/watch/volumes"} {
		req, _ := http.NewRequest(http.MethodGet, hs.URL+path, nil)
		req.Header.Set("Authorization", "Bearer crl_x_y")
		res, err := hs.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e struct{ Error struct{ Code string } }
		err = json.NewDecoder(res.Body).Decode(&e)
		res.Body.Close()
		if res.StatusCode != http.StatusNotImplemented || err != nil || e.Error.Code != "Unimplemented" {
			t.Errorf("GET %s = %d %+v (%v), want 501 Unimplemented", path, res.StatusCode, e, err)
		}
	}
}
