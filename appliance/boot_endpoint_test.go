package appliance

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/corralhq/corral/testsupport/require"
)

func TestScriptEndpoint(t *testing.T) {
	lan := []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fe80::1")}
	lo := []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")}
	for name, tc := range map[string]struct {
		listen, advertise string
		ifAddrs           []netip.Addr
		want              string
		warn              bool
		err               string
	}{
		"every address":                 {listen: ":20180", ifAddrs: lan, want: ":20180"},
		"0.0.0.0":                       {listen: "0.0.0.0:20180", ifAddrs: lan, want: ":20180"},
		"[::]":                          {listen: "[::]:20180", ifAddrs: lan, want: ":20180"},
		"the boot interface's address":  {listen: "10.0.0.1:20180", ifAddrs: lan, want: "10.0.0.1:20180"},
		"loopback on a loopback iface":  {listen: "127.0.0.1:20180", ifAddrs: lo, want: ":20180"},
		"localhost on a loopback iface": {listen: "localhost:20180", ifAddrs: lo, want: ":20180"},
		"another routed address":        {listen: "192.168.7.1:20180", ifAddrs: lan, want: "192.168.7.1:20180", warn: true},
		"loopback, advertised":          {listen: "127.0.0.1:20180", advertise: "10.0.0.1:443", ifAddrs: lan, want: "10.0.0.1:443"},
		"loopback, nothing advertised": {listen: "127.0.0.1:20180", ifAddrs: lan,
			err: "--api-listen 127.0.0.1:20180 accepts only local connections, but booting machines on --boot-interface br0 would be told to reach the API at 10.0.0.1:20180: " +
				"listen on the boot interface's address or 0.0.0.0 (--api-listen 10.0.0.1:20180 or :20180), or set --api-advertise HOST:PORT to an address they reach"},
		"localhost, nothing advertised": {listen: "localhost:20180", ifAddrs: lan, err: "or set --api-advertise HOST:PORT"},
		"[::1], nothing advertised":     {listen: "[::1]:20180", ifAddrs: lan, err: "accepts only local connections"},
		"loopback advertised":           {listen: "127.0.0.1:20180", advertise: "127.0.0.1:20180", ifAddrs: lan, err: `--api-advertise "127.0.0.1:20180": agents on --boot-interface br0 cannot reach it`},
		"unspecified advertised":        {listen: "127.0.0.1:20180", advertise: "0.0.0.0:20180", ifAddrs: lan, err: "cannot reach it: give a HOST:PORT on the boot LAN, e.g. 10.0.0.1:20180"},
		"malformed advertised":          {listen: "127.0.0.1:20180", advertise: "10.0.0.1", ifAddrs: lan, err: "cannot reach it"},
	} {
		t.Run(name, func(t *testing.T) {
			got, warn, err := scriptEndpoint(tc.listen, "20180", tc.advertise, "br0", tc.ifAddrs)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want || (warn != "") != tc.warn {
				t.Errorf("endpoint %q warn %q, want %q (warn %v)", got, warn, tc.want, tc.warn)
			}
		})
	}
}

// TestBootRefusesLoopbackAPI starts an appliance whose boot interface is a
// real (dummy) link with a LAN address while the API listens on loopback
// only: New refuses and names the fix; with --api-advertise it starts.
func TestBootRefusesLoopbackAPI(t *testing.T) {
	require.Root(t, "creates a network interface")
	require.Tool(t, "ip")
	b := make([]byte, 3)
	rand.Read(b)
	link := "crdm" + hex.EncodeToString(b)
	addr := fmt.Sprintf("10.254.%d.%d", b[0], b[1]%250+1)
	for _, args := range [][]string{{"link", "add", link, "type", "bridge"}, {"addr", "add", addr + "/32", "dev", link}, {"link", "set", link, "up"}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
		if args[0] == "link" && args[1] == "add" {
			t.Cleanup(func() { exec.Command("ip", "link", "del", link).Run() })
		}
	}
	cfg := func(advertise string) Config {
		return Config{DataDir: t.TempDir(), APIListen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler),
			Boot:      BootConfig{Interface: link, DHCPMode: "off", TFTPListen: "off", HTTPListen: "127.0.0.1:0", NoRA: true},
			Lifecycle: LifecycleConfig{APIAdvertise: advertise}}
	}
	srv, err := New(cfg(""))
	if err == nil {
		srv.Close()
		t.Fatal("New with a loopback API and a LAN boot interface succeeded")
	}
	if want := "or set --api-advertise HOST:PORT"; !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), addr) {
		t.Fatalf("New: %v\nwant the fix (%q) and the boot address %s", err, want, addr)
	}
	srv, err = New(cfg(addr + ":20180"))
	if err != nil {
		t.Fatalf("New with --api-advertise: %v", err)
	}
	srv.Close()
}
