package appliance

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/api/clientconfig"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	storev1 "github.com/corralhq/corral/api/store/v1"
	"github.com/corralhq/corral/auth"
	"github.com/corralhq/corral/store/bolt"
	"github.com/corralhq/corral/store/record"
)

// The fixture is a data directory's store written at schema version 1 (the
// layout before this build): an admin token and a network whose CIDRs were
// stored with host bits, as the pool kept them before it refused such
// input. CORRAL_WRITE_FIXTURES=1 writes it again.
var (
	schema1Store = filepath.Join("testdata", "schema1", StoreFile)
	schema1Token = filepath.Join("testdata", "schema1", "admin-token")
)

const schema1Network = "/pool/networks/lab"

func TestWriteSchema1Fixture(t *testing.T) {
	if os.Getenv("CORRAL_WRITE_FIXTURES") == "" {
		t.Skip("set CORRAL_WRITE_FIXTURES=1 to write testdata/schema1 again")
	}
	ctx := context.Background()
	os.MkdirAll(filepath.Dir(schema1Store), 0o755)
	os.Remove(schema1Store)
	st, err := bolt.Open(schema1Store, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tok, err := (&auth.Tokens{Store: st}).Create(ctx, authv1.Role_ROLE_ADMIN, "schema 1 fixture", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := record.Put(ctx, st, schema1Network, &poolv1.Network{Name: "lab", Ipv4Cidr: "10.20.0.5/24", Ipv6Cidr: "fd00:20::5/64"}, 0); err != nil {
		t.Fatal(err)
	}
	kvs, err := st.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range kvs {
		var r storev1.Record
		if err := proto.Unmarshal(kv.Value, &r); err != nil {
			t.Fatal(err)
		}
		r.SchemaVersion = 1
		b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(&r)
		if _, err := st.Put(ctx, kv.Key, b, kv.Revision); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(schema1Token, []byte(tok+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// copySchema1 makes a data directory holding the fixture's store.
func copySchema1(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "data")
	os.MkdirAll(dir, 0o700)
	src, err := os.Open(schema1Store)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(filepath.Join(dir, StoreFile), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	dst.Close()
	return dir
}

// TestMigrateSchema1: corrald opens a store written at schema version 1
// and carries every record to the current version; the old token works.
func TestMigrateSchema1(t *testing.T) {
	dir := copySchema1(t)
	srv, err := New(Config{DataDir: dir, APIListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	// The fixture has tokens but no admin.conf: dial with its token.
	cc := &clientconfig.Config{Endpoint: srv.Addr().String(), CACert: string(srv.CA().CertPEM())}
	kvs, err := srv.store.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range kvs {
		if v, err := record.EnvelopeVersion(kv.Value); err != nil || v != record.SchemaVersion {
			t.Errorf("%s: schema version %d (%v), want %d", kv.Key, v, err, record.SchemaVersion)
		}
	}
	var n poolv1.Network
	if _, err := record.Get(ctx, srv.store, schema1Network, &n); err != nil {
		t.Fatal(err)
	}
	if n.GetIpv4Cidr() != "10.20.0.0/24" || n.GetIpv6Cidr() != "fd00:20::/64" {
		t.Errorf("network CIDRs %s %s, want 10.20.0.0/24 fd00:20::/64", n.GetIpv4Cidr(), n.GetIpv6Cidr())
	}
	tok, err := os.ReadFile(schema1Token)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := poolv1.NewNetworkServiceClient(dial(t, cc, strings.TrimSpace(string(tok)))).GetNetwork(ctx, &poolv1.GetNetworkRequest{Name: "lab"})
	if err != nil || resp.GetIpv4Cidr() != "10.20.0.0/24" {
		t.Errorf("GetNetwork with the fixture's token: %v, %v", resp, err)
	}
}

// TestMigrateRefusesNewerStore: a store holding a record of a newer schema
// version is refused at start, naming the record.
func TestMigrateRefusesNewerStore(t *testing.T) {
	dir := copySchema1(t)
	st, err := bolt.Open(filepath.Join(dir, StoreFile), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := proto.Marshal(&storev1.Record{SchemaVersion: record.SchemaVersion + 1})
	if _, err := st.Put(context.Background(), "/zz/future", b, 0); err != nil {
		t.Fatal(err)
	}
	st.Close()
	_, err = New(Config{DataDir: dir, APIListen: "127.0.0.1:0"})
	if !errors.Is(err, record.ErrSchema) || !strings.Contains(err.Error(), "/zz/future") || !strings.Contains(err.Error(), "newer corrald") {
		t.Fatalf("New: %v, want the newer record refused by name", err)
	}
}
