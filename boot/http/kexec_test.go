package http

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/images"
)

// kexecServer runs a Server on 127.0.0.1 with a catalog that has the
// hypervisor image when hv is set.
func kexecServer(t *testing.T, hv bool) (*Server, *fakeTokens, *recorder) {
	t.Helper()
	src := t.TempDir()
	for _, n := range []string{images.UndionlyKPXE, images.IPXEEFI, "ipxe.lkrn"} {
		os.WriteFile(filepath.Join(src, n), []byte("bin "+n), 0o644)
	}
	ipath := filepath.Join(src, "initrd")
	os.WriteFile(ipath, []byte("discovery initramfs"), 0o644)
	icfg := images.Config{Dir: t.TempDir(), IPXEDirs: []string{src}, Initrd: ipath}
	if hv {
		icfg.HypervisorInitrd = filepath.Join(src, "hypervisor-initrd")
		os.WriteFile(icfg.HypervisorInitrd, []byte("hypervisor initramfs"), 0o644)
	}
	cat, err := images.Open(icfg)
	if err != nil {
		t.Fatal(err)
	}
	inv := &fakeInv{machines: map[string]*inventoryv1.Machine{
		"52:54:00:00:00:03": {Name: "hv3", BootIntent: inventoryv1.BootIntent_BOOT_INTENT_HYPERVISOR},
	}}
	tokens, rec := &fakeTokens{}, &recorder{}
	s, err := New(Config{Listen: "127.0.0.1:0", Catalog: cat, Inventory: inv, Tokens: tokens, Timeline: rec,
		APIEndpoint: ":20180", CAFingerprint: strings.Repeat("ab", 32), PeerEndpoints: func(context.Context) []string { return []string{"10.0.0.2:20180"} }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return s, tokens, rec
}

// TestHypervisorBootIsTheScripts: the kexec rendering is the hypervisor
// script's — the same kernel and initrd URLs and kernel command line, for
// the same host — with the catalog's sizes and hashes of the files the
// server then serves; no token is issued for it.
func TestHypervisorBootIsTheScripts(t *testing.T) {
	s, tokens, _ := kexecServer(t, true)
	_, port, _ := net.SplitHostPort(s.Addr().String())
	hb, err := s.HypervisorBoot(context.Background(), "hv3", "52-54-00-00-00-03", "127.0.0.1", "")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://127.0.0.1:" + port
	_, script := get(t, base+"/boot.ipxe?mac=52:54:00:00:00:03", nil)
	// get sends Host 10.0.0.1:8080: render ours for that host to compare.
	hbScript, err := s.HypervisorBoot(context.Background(), "hv3", "52:54:00:00:00:03", "10.0.0.1", "")
	if err != nil {
		t.Fatal(err)
	}
	var kernelLine, initrdLine string
	for _, l := range strings.Split(string(script), "\n") {
		switch {
		case strings.HasPrefix(l, "kernel "):
			kernelLine = l
		case strings.HasPrefix(l, "initrd "):
			initrdLine = l
		}
	}
	// The script's URLs are on 10.0.0.1:8080 (the Host iPXE asked).
	scriptHB := strings.ReplaceAll(hbScript.KernelURL, ":"+port, ":8080") + " " + hbScript.Cmdline
	if diff := cmp.Diff(kernelLine, "kernel "+scriptHB); diff != "" {
		t.Errorf("kernel line (-script +kexec):\n%s", diff)
	}
	if want := "initrd --name " + images.HypervisorInitrd + " " + strings.ReplaceAll(hbScript.InitrdURL, ":"+port, ":8080"); initrdLine != want {
		t.Errorf("initrd line %q, kexec %q", initrdLine, want)
	}
	if !strings.Contains(hb.Cmdline, "corral.endpoint=127.0.0.1:20180,10.0.0.2:20180 ") || !strings.Contains(hb.Cmdline, "corral.token="+NoToken+" ") ||
		!strings.Contains(hb.Cmdline, "corral.mode=hypervisor") || !strings.Contains(hb.Cmdline, "corral.mac=52:54:00:00:00:03") {
		t.Errorf("cmdline %q", hb.Cmdline)
	}
	if len(tokens.issued) != 0 {
		t.Errorf("tokens issued: %v", tokens.issued)
	}
	for _, f := range []struct {
		url string
		a   images.Artifact
	}{{hb.KernelURL, hb.Kernel}, {hb.InitrdURL, hb.Initrd}} {
		resp, body := get(t, f.url, nil)
		sum := sha256.Sum256(body)
		if resp.StatusCode != http.StatusOK || int64(len(body)) != f.a.Size || hex.EncodeToString(sum[:]) != f.a.SHA256 {
			t.Errorf("GET %s: %d, %d bytes sha256 %x; catalog %d bytes %s", f.url, resp.StatusCode, len(body), sum, f.a.Size, f.a.SHA256)
		}
	}
}

func TestHypervisorBootRefusals(t *testing.T) {
	with, _, _ := kexecServer(t, true)
	without, _, _ := kexecServer(t, false)
	tests := map[string]struct {
		s              *Server
		mac, host, err string
	}{
		"no hypervisor image": {s: without, mac: "52:54:00:00:00:03", host: "127.0.0.1", err: "no hypervisor image"},
		"bad MAC":             {s: with, mac: "52:54:00", host: "127.0.0.1", err: "not a 6-byte MAC"},
		"no host":             {s: with, mac: "52:54:00:00:00:03", err: "no host"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := tc.s.HypervisorBoot(context.Background(), "hv3", tc.mac, tc.host, "")
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("HypervisorBoot: %v, want an error with %q", err, tc.err)
			}
		})
	}
}
