package web_test

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/api/clientconfig"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/appliance"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/testsupport/machinefacts"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// appliance is a real corrald in-process (bbolt, TLS, tokens) with its
// web page on a loopback port.
type applianceRig struct {
	srv    *appliance.Server
	base   string // https://127.0.0.1:port
	client *http.Client
	admin  inventoryv1.MachineServiceClient
	tokens map[authv1.Role]string
}

func startAppliance(t *testing.T) *applianceRig {
	t.Helper()
	return startApplianceWith(t, appliance.BMCConfig{})
}

// startApplianceWith is startAppliance with bmc as the appliance's BMC
// settings.
func startApplianceWith(t *testing.T, bmc appliance.BMCConfig) *applianceRig {
	t.Helper()
	return startApplianceWeb(t, bmc, appliance.WebConfig{})
}

// startApplianceWeb is startApplianceWith with the web page's settings
// (its Listen is set here).
func startApplianceWeb(t *testing.T, bmc appliance.BMCConfig, webc appliance.WebConfig) *applianceRig {
	t.Helper()
	webc.Listen = "127.0.0.1:0"
	log := slog.New(slog.DiscardHandler)
	if os.Getenv("CORRAL_TEST_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	dir := t.TempDir()
	srv, err := appliance.New(appliance.Config{DataDir: dir, APIListen: "127.0.0.1:0", Logger: log,
		Web: webc, BMC: bmc})
	if err != nil {
		t.Fatalf("appliance.New: %v", err)
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
	cc, err := clientconfig.Load(filepath.Join(dir, appliance.AdminConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := clientconfig.Dial(cc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	a := &applianceRig{
		srv:  srv,
		base: "https://" + srv.WebAddr().String(),
		client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: srv.CA().Pool(), MinVersion: tls.VersionTLS12},
		}},
		admin:  inventoryv1.NewMachineServiceClient(conn),
		tokens: map[authv1.Role]string{},
	}
	t.Cleanup(a.client.CloseIdleConnections)
	for _, r := range []authv1.Role{authv1.Role_ROLE_VIEWER, authv1.Role_ROLE_OPERATOR} {
		tok, err := srv.Tokens().Create(context.Background(), r, "web test "+r.String(), 0)
		if err != nil {
			t.Fatal(err)
		}
		a.tokens[r] = tok
	}
	return a
}

// machine registers a QEMU machine as its discovery agent would and puts a
// boot's worth of entries on its timeline (power, DHCP, TFTP, script,
// kernel and initrd, agent), seconds apart.
func (a *applianceRig) machine(t *testing.T, serial, mac string) string {
	t.Helper()
	ctx := context.Background()
	inv := a.srv.Inventory()
	t0 := time.Now().Add(-2 * time.Minute)
	for _, e := range []struct {
		after         time.Duration
		source, event string
		detail        string
	}{
		{0, "bmc", "power-on", "power on (next boot PXE)"},
		{18 * time.Second, "dhcp", "discover", "DISCOVER from a PXE client, arch 7"},
		{19 * time.Second, "dhcp", "ack", "ACK 10.0.0.100"},
		{20 * time.Second, "tftp", "read", "ipxe.efi"},
		{24 * time.Second, "dhcp", "ack", "ACK 10.0.0.100 (iPXE)"},
		{25 * time.Second, "http", "script", "discover script"},
		{26 * time.Second, "http", "artifact", "served vmlinuz"},
		{41 * time.Second, "http", "artifact", "served discover-initrd.img"},
	} {
		inv.Record(&inventoryv1.TimelineEntry{Mac: mac, At: timestamppb.New(t0.Add(e.after)), Source: e.source, Event: e.event, Detail: e.detail})
	}
	m, err := inv.Register(ctx, mac, machinefacts.QEMU(serial, "", mac), inventory.RegisterOptions{})
	if err != nil {
		t.Fatalf("Register: %v", err)
	}
	if err := inv.FlushTimeline(ctx); err != nil {
		t.Fatalf("FlushTimeline: %v", err)
	}
	return m.GetName()
}

// do sends one request to the web API; token "" sends no Authorization,
// one with a space is sent as the whole header.
// reply is an answer do has read to the end and closed.
type reply struct {
	StatusCode int
	Header     http.Header
}

func (a *applianceRig) do(t *testing.T, method, path, token, contentType, body string) (reply, string) {
	t.Helper()
	req, err := http.NewRequest(method, a.base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case strings.Contains(token, " "):
		req.Header.Set("Authorization", token)
	case token != "":
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	res, err := a.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{res.StatusCode, res.Header}, string(b)
}
