package tftp

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/images"
)

// fakeGrub renders a configuration naming what it was asked for, or
// refuses.
type fakeGrub struct {
	mu     sync.Mutex
	asked  []string
	refuse error
	big    bool
}

func (g *fakeGrub) GrubConfig(_ context.Context, mac string, client, host netip.Addr) ([]byte, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.asked = append(g.asked, mac+" "+client.String()+" "+host.String())
	if g.refuse != nil {
		return nil, g.refuse
	}
	if g.big {
		return make([]byte, maxGrubConfig+1), nil
	}
	return []byte("linux (tftp)/vmlinuz corral.mac=" + mac + "\n"), nil
}

func (g *fakeGrub) got() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return strings.Join(g.asked, ";")
}

type noMACs struct{}

func (noMACs) MACForIP(net.IP) (string, bool) { return "", false }

func chainServer(t *testing.T, g GrubConfigs, m MACResolver) (string, *recorder) {
	t.Helper()
	cat, _ := testCatalog(t)
	dir := t.TempDir()
	for n, k := range map[string]images.Kind{images.ShimX64EFI: images.KindLoader, images.GrubX64EFI: images.KindLoader, images.DiscoverInitrd: images.KindInitrd} {
		p := filepath.Join(dir, n)
		if err := os.WriteFile(p, []byte("content of "+n), 0o644); err != nil {
			t.Fatal(err)
		}
		cat[n] = images.Artifact{Name: n, Kind: k, Path: p}
	}
	rec := &recorder{}
	s, err := New(Config{Listen: "127.0.0.1:0", Catalog: cat, Timeline: rec, MACs: m, Grub: g, Limits: Limits{Timeout: 500 * time.Millisecond, Retries: 2}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return s.Addr().String(), rec
}

// TestSecureBootChainFiles: with Config.Grub set the signed loaders, the
// kernel and the initramfs are served (also as GRUB names them, from the
// root), grub/grub.cfg is rendered for the MAC leased the client's
// address with the server's address as host, and the loaders' optional
// probes are refused quietly; traversal stays refused.
func TestSecureBootChainFiles(t *testing.T) {
	g := &fakeGrub{}
	addr, rec := chainServer(t, g, macs{})
	for _, name := range []string{images.ShimX64EFI, images.GrubX64EFI, "/" + images.GrubX64EFI, "/vmlinuz", "/" + images.DiscoverInitrd, images.IPXEEFI} {
		if _, _, err := fetch(t, addr, name, 0, false); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	b, _, err := fetch(t, addr, "/grub/grub.cfg", 0, false)
	if err != nil || !strings.Contains(string(b), "corral.mac=52:54:00:00:00:01") {
		t.Fatalf("grub.cfg: %q, %v", b, err)
	}
	if got := g.got(); got != "52:54:00:00:00:01 127.0.0.1 127.0.0.1" {
		t.Errorf("GrubConfig asked with %q", got)
	}
	for _, name := range []string{"revocations_sbat.efi", "grub/x86_64-efi/command.lst", "/grub/../ipxe.efi", "grub/grub.cfg/../x", "../vmlinuz", "grub/grub.cfg.bak"} {
		if _, _, err := fetch(t, addr, name, 0, false); err == nil {
			t.Errorf("%q was served", name)
		}
	}
	time.Sleep(50 * time.Millisecond)
	all := rec.all()
	for _, want := range []string{"tftp-file grub/grub.cfg", "tftp-file vmlinuz", "tftp-not-served revocations_sbat.efi", "tftp-refused grub/grub.cfg.bak"} {
		if !strings.Contains(all, want) {
			t.Errorf("timeline lacks %q:\n%s", want, all)
		}
	}
}

// TestSecureBootGrubRefusals: no lease for the address, the renderer's
// refusal and an oversized configuration are TFTP errors; without
// Config.Grub none of the chain's files is served.
func TestSecureBootGrubRefusals(t *testing.T) {
	t.Run("no lease", func(t *testing.T) {
		g := &fakeGrub{}
		addr, _ := chainServer(t, g, noMACs{})
		if _, _, err := fetch(t, addr, GrubConfigName, 0, false); err == nil || !strings.Contains(err.Error(), "no DHCP lease") {
			t.Errorf("err = %v", err)
		}
		if got := g.got(); got != "" {
			t.Errorf("rendered for a client without a lease: %v", got)
		}
	})
	t.Run("renderer refuses", func(t *testing.T) {
		addr, _ := chainServer(t, &fakeGrub{refuse: errors.New("unknown MAC")}, macs{})
		if _, _, err := fetch(t, addr, GrubConfigName, 0, false); err == nil || !strings.Contains(err.Error(), "unknown MAC") {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("too big", func(t *testing.T) {
		addr, _ := chainServer(t, &fakeGrub{big: true}, macs{})
		if _, _, err := fetch(t, addr, GrubConfigName, 0, false); err == nil || !strings.Contains(err.Error(), "limit") {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("chain off", func(t *testing.T) {
		addr, _ := chainServer(t, nil, macs{})
		for _, name := range []string{images.ShimX64EFI, images.GrubX64EFI, "vmlinuz", GrubConfigName} {
			if _, _, err := fetch(t, addr, name, 0, false); err == nil {
				t.Errorf("%s served with the chain off", name)
			}
		}
	})
}
