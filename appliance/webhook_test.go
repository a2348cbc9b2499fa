package appliance

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/api/clientconfig"
	webhookv1 "github.com/corralhq/corral/api/webhook/v1"
	"github.com/corralhq/corral/ipmi/seal"
	"github.com/corralhq/corral/store/record"
)

// TestWebhooksWired: WebhookService is admin-only, a boot-LAN receiver is
// refused without its flag, the secret is returned once and stored only
// sealed (it opens with the data directory's seal key, bound to the
// receiver's name), and the audit records the add.
func TestWebhooksWired(t *testing.T) {
	dir := t.TempDir()
	srv, err := New(Config{DataDir: dir, APIListen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler),
		Boot: BootConfig{DHCPRange: "10.77.0.100-10.77.0.200/24"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	cc, err := clientconfig.Load(filepath.Join(dir, AdminConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	admin := webhookv1.NewWebhookServiceClient(dial(t, cc, ""))
	operator := webhookv1.NewWebhookServiceClient(dial(t, cc, newToken(t, srv, authv1.Role_ROLE_OPERATOR)))
	req := &webhookv1.AddWebhookRequest{Name: "siem", Url: "https://hooks.example.com/corral", Events: []string{"audit", "health"}}
	if _, err := operator.AddWebhook(ctx, req); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("operator add: %v, want PermissionDenied", err)
	}
	if _, err := admin.AddWebhook(ctx, &webhookv1.AddWebhookRequest{Url: "https://10.77.0.150/x", Events: []string{"audit"}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("boot-LAN receiver: %v, want InvalidArgument", err)
	}
	resp, err := admin.AddWebhook(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetSecret()) < 40 || len(resp.GetReceiver().GetSealedSecret()) != 0 {
		t.Fatalf("add answered secret %q, sealed %d bytes", resp.GetSecret(), len(resp.GetReceiver().GetSealedSecret()))
	}
	list, err := admin.ListWebhooks(ctx, &webhookv1.ListWebhooksRequest{})
	if err != nil || len(list.GetReceivers()) != 1 || len(list.GetReceivers()[0].GetSealedSecret()) != 0 {
		t.Fatalf("list: %v %v", list, err)
	}
	// The store holds the key sealed, bound to the name.
	kvs, err := srv.store.List(ctx, "/webhooks/receivers/")
	if err != nil || len(kvs) != 1 {
		t.Fatalf("records: %v %v", kvs, err)
	}
	var rec webhookv1.Receiver
	if err := record.Unmarshal(kvs[0].Value, &rec); err != nil {
		t.Fatal(err)
	}
	key, err := os.ReadFile(filepath.Join(dir, seal.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	sl, _ := seal.New(key)
	if _, err := sl.Open(rec.GetSealedSecret(), []byte("webhook/siem")); err != nil {
		t.Fatalf("sealed secret does not open: %v", err)
	}
	if _, err := sl.Open(rec.GetSealedSecret(), []byte("webhook/other")); err == nil {
		t.Fatal("sealed secret opens under another name")
	}
	if _, err := admin.RemoveWebhook(ctx, &webhookv1.RemoveWebhookRequest{Name: "siem"}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RemoveWebhook(ctx, &webhookv1.RemoveWebhookRequest{Name: "siem"}); status.Code(err) != codes.NotFound {
		t.Fatalf("second remove: %v, want NotFound", err)
	}
}
