package web_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	authv1 "github.com/corralhq/corral/api/auth/v1"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	watchv1 "github.com/corralhq/corral/api/watch/v1"
	"github.com/corralhq/corral/auth/pki"
	"github.com/corralhq/corral/rest"
	"github.com/corralhq/corral/web"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// cutWatch is a MachineService whose WatchMachines follows the Watch
// contract over three machines created at revisions 10, 11 and 12, except
// that once cut is set the next listing (from revision 0) is cut after two
// machines, as the appliance cuts a watcher that does not keep up.
type cutWatch struct {
	inventoryv1.UnimplementedMachineServiceServer
	cut   atomic.Bool
	mu    sync.Mutex
	froms []int64 // from_revision of each call
}

func (s *cutWatch) WatchMachines(req *inventoryv1.WatchMachinesRequest, st grpc.ServerStreamingServer[inventoryv1.MachineEvent]) error {
	s.mu.Lock()
	s.froms = append(s.froms, req.GetFromRevision())
	s.mu.Unlock()
	cut := req.GetFromRevision() == 0 && s.cut.CompareAndSwap(true, false)
	machine := func(i int) *inventoryv1.Machine {
		return &inventoryv1.Machine{Name: fmt.Sprintf("m-%d", i), Serial: fmt.Sprintf("SN-CUT-%d", i), State: inventoryv1.Machine_INVENTORIED}
	}
	for i := range 3 {
		rev := int64(10 + i)
		if rev <= req.GetFromRevision() {
			continue
		}
		if cut && i == 2 {
			return status.Error(codes.ResourceExhausted, "watcher fell behind: cut after revision 11")
		}
		if err := st.Send(&inventoryv1.MachineEvent{Type: watchv1.EventType_ADDED, Revision: rev, Machine: machine(i)}); err != nil {
			return err
		}
	}
	if req.GetFromRevision() == 0 {
		if err := st.Send(&inventoryv1.MachineEvent{Type: watchv1.EventType_SYNCED, Revision: 12}); err != nil {
			return err
		}
	}
	<-st.Context().Done()
	return nil
}

// TestBrowserCutDuringList: a watch stream cut before its SYNCED is
// listed again from revision 0; resuming from the revision of the last
// object received would skip the objects the cut list never sent.
func TestBrowserCutDuringList(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.EnsureCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.EnsureServerCert(dir, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	fake := &cutWatch{}
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))
	inventoryv1.RegisterMachineServiceServer(gs, fake)
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
	h, err := web.New(web.Config{Conn: conn, Role: func(context.Context, string) (authv1.Role, error) { return authv1.Role_ROLE_VIEWER, nil }})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewUnstartedServer(pageMux(t, gs, h))
	hs.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	hs.StartTLS()
	t.Cleanup(hs.Close)

	b := startBrowserAt(t, hs.URL, hs.Listener.Addr().String(), ca.Pool())
	every := until(fmt.Sprintf(`JSON.stringify(%s) === %q`, visibleRows, jsonList([]string{"m-0", "m-1", "m-2"})), 10*time.Second)
	b.signIn("crl_x_y", "m-2", 30*time.Second)
	b.step("every machine", 10*time.Second, every)
	fake.mu.Lock()
	if len(fake.froms) != 1 {
		t.Errorf("signing in opened %d machine watches (from revisions %v), want 1", len(fake.froms), fake.froms)
	}
	fake.froms = nil
	fake.mu.Unlock()

	// Open the machines page again: its listing is cut after two machines.
	fake.cut.Store(true)
	b.step("cut listing", 30*time.Second,
		chromedp.Navigate(hs.URL+"/#/nodes"),
		chromedp.Navigate(hs.URL+"/#/machines"),
		until(`(window.corralPerf.streamErrors || 0) > 0`, 10*time.Second),
		every,
	)
	fake.mu.Lock()
	froms := fake.froms
	fake.mu.Unlock()
	if len(froms) < 2 || froms[0] != 0 || froms[1] != 0 {
		t.Errorf("after the cut the page watched from revisions %v, want 0 then 0 again", froms)
	}
	checkCSP(b.ctx, t)
}

// pageMux serves the page as the appliance does: the REST API of gs's
// services under /v1/ (package rest, in process), the page's own routes
// elsewhere.
func pageMux(t *testing.T, gs *grpc.Server, page http.Handler) http.Handler {
	t.Helper()
	api, err := rest.New(rest.Config{Server: gs, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/", api)
	mux.Handle("/", page)
	return mux
}
