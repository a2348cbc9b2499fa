package appliance

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/corralhq/corral/api/clientconfig"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	webhookv1 "github.com/corralhq/corral/api/webhook/v1"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
	"github.com/corralhq/corral/testsupport/etcdtest"
)

// TestWebhookFailoverOnEtcd: two appliances on one etcd; the leader
// stops while a machine's state keeps changing; the receiver still ends
// with every change, in order, duplicates dropped by ID (the new leader
// resumed from the stored delivery cursor).
func TestWebhookFailoverOnEtcd(t *testing.T) {
	c := etcdtest.New(t, 1)
	dirA, dirB := t.TempDir(), t.TempDir()
	a, err := New(etcdConfig(c, dirA, "a", "/whf"))
	if err != nil {
		t.Fatal(err)
	}
	stopA := runFleetServer(t, a)
	key, err := os.ReadFile(filepath.Join(dirA, ClusterKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dirB, ClusterKeyFile), key, 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := New(etcdConfig(c, dirB, "b", "/whf"))
	if err != nil {
		t.Fatal(err)
	}
	runFleetServer(t, b)
	cc, err := clientconfig.Load(filepath.Join(dirA, AdminConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	ccB := *cc
	ccB.Endpoint = b.Addr().String()

	var mu sync.Mutex
	seen := map[string]bool{}
	var states []string
	dups := 0
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A slow receiver: the leader has events queued when it goes.
		time.Sleep(10 * time.Millisecond)
		body, _ := io.ReadAll(r.Body)
		var ev struct {
			ID, Type, Subject string
			Data              struct{ State string }
		}
		if json.Unmarshal(body, &ev) != nil || ev.ID != r.Header.Get("webhook-id") {
			http.Error(w, "bad event", http.StatusBadRequest)
			return
		}
		mu.Lock()
		switch {
		case ev.Subject != "machine/wm1":
		case seen[ev.ID]:
			dups++
		default:
			seen[ev.ID] = true
			states = append(states, ev.Data.State)
		}
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	srv.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	defer srv.Close()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	ctx := context.Background()
	if _, err := webhookv1.NewWebhookServiceClient(dial(t, &ccB, "")).AddWebhook(ctx, &webhookv1.AddWebhookRequest{Name: "r",
		Url: srv.URL, Events: []string{"machine.state"}, AllowBootLan: true, CaPem: ca}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the leader's dispatcher serves the receiver

	cycle := []inventoryv1.Machine_MachineState{inventoryv1.Machine_INVENTORIED, inventoryv1.Machine_READY, inventoryv1.Machine_FAILED}
	var want []string
	set := func(n int) {
		for range n {
			s := cycle[len(want)%len(cycle)]
			if _, err := record.Update(ctx, b.store, store.MachinesPrefix+"wm1", func() *inventoryv1.Machine { return &inventoryv1.Machine{} },
				func(m *inventoryv1.Machine, _ bool) (bool, error) {
					m.Name, m.State, m.UpdatedAt = "wm1", s, timestamppb.Now()
					return false, nil
				}); err != nil {
				t.Fatal(err)
			}
			want = append(want, s.String())
			time.Sleep(5 * time.Millisecond)
		}
	}
	start := time.Now()
	set(30)
	changing := make(chan struct{})
	go func() { defer close(changing); set(60) }()
	time.Sleep(100 * time.Millisecond)
	stopA() // the leader goes mid-stream; B takes over
	<-changing
	waitFor(t, "every change at the receiver", 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(slices.Compact(slices.Clone(states))) >= len(want)
	})
	mu.Lock()
	got := slices.Compact(slices.Clone(states))
	n, d := len(states), dups
	mu.Unlock()
	if !slices.Equal(got, want) {
		t.Fatalf("receiver saw %v\nwant %v", got, want)
	}
	t.Logf("%d changes, %d distinct events at the receiver (%d duplicates dropped by ID), all in order, %s", len(want), n, d, time.Since(start))
}
