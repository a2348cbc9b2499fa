package appliance

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	fleetv1 "github.com/corralhq/corral/api/fleet/v1"
	"github.com/corralhq/corral/auth/pki"
	"github.com/corralhq/corral/store/record"
	"github.com/corralhq/corral/testsupport/etcdtest"
)

// TestFleetSharesBootCA: appliances of one fleet serve HTTPS boot from one
// boot CA, so firmware enrolled with it trusts any of them. Three
// appliances that start HTTPS boot at the same moment on a fleet whose
// secrets hold no boot CA yet (a fleet made before it was shared) end with
// the same CA, the one in the store; its key is stored only sealed. An
// appliance whose data directory holds another boot CA is refused, and
// its CA is left as it was.
func TestFleetSharesBootCA(t *testing.T) {
	c := etcdtest.New(t, 1)
	ctx := context.Background()
	first := t.TempDir()
	a, err := New(etcdConfig(c, first, "a", "/fleet"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	key, err := os.ReadFile(filepath.Join(first, ClusterKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	servers := []*Server{a}
	for _, name := range []string{"b", "c"} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, ClusterKeyFile), key, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := New(etcdConfig(c, dir, name, "/fleet"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		servers = append(servers, s)
	}

	var wg sync.WaitGroup
	errs := make([]error, len(servers))
	for i, s := range servers {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = s.shareBootCA(ctx) }()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("appliance %d: %v", i, err)
		}
	}
	var sec fleetv1.ClusterSecrets
	if _, err := record.Get(ctx, a.store, clusterSecretsKey, &sec); err != nil {
		t.Fatal(err)
	}
	if sec.GetBootCaCertPem() == "" {
		t.Fatal("the fleet's secrets hold no boot CA")
	}
	for _, s := range servers {
		dir := filepath.Join(s.cfg.DataDir, BootCADir)
		cert, _ := os.ReadFile(filepath.Join(dir, pki.CACertFile))
		if string(cert) != sec.GetBootCaCertPem() {
			t.Errorf("%s serves another boot CA than the fleet's", s.cfg.Fleet.Name)
		}
		caKey, _ := os.ReadFile(filepath.Join(dir, pki.CAKeyFile))
		if len(caKey) == 0 || bytes.Contains(sec.GetBootCaKeySealed(), caKey[32:64]) {
			t.Errorf("%s: the boot CA key is missing, or stored unsealed", s.cfg.Fleet.Name)
		}
		ca, err := pki.EnsureBootCA(dir)
		if err != nil {
			t.Fatalf("%s: the shared boot CA does not load: %v", s.cfg.Fleet.Name, err)
		}
		if _, err := ca.EnsureBootServerCert(filepath.Join(dir, "server"), []string{"192.0.2.1"}); err != nil {
			t.Fatalf("%s: the shared boot CA does not sign: %v", s.cfg.Fleet.Name, err)
		}
	}

	// A data directory with its own boot CA is refused, not overwritten.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, ClusterKeyFile), key, 0o600); err != nil {
		t.Fatal(err)
	}
	own, err := pki.EnsureBootCA(filepath.Join(dir, BootCADir))
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(etcdConfig(c, dir, "d", "/fleet"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if err := d.shareBootCA(ctx); err == nil || !strings.Contains(err.Error(), "another boot CA") {
		t.Fatalf("an appliance with its own boot CA: %v", err)
	}
	after, _ := os.ReadFile(filepath.Join(dir, BootCADir, pki.CACertFile))
	if !bytes.Equal(after, own.CertPEM()) {
		t.Error("the appliance's own boot CA was overwritten")
	}
}
