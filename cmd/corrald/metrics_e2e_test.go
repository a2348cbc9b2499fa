package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/corralhq/corral/api/clientconfig"
	"github.com/corralhq/corral/testsupport/etcdtest"
	"github.com/corralhq/corral/testsupport/promassets"
	"github.com/corralhq/corral/testsupport/require"
	"github.com/corralhq/corral/testsupport/syncbuf"
	"github.com/insomniacslk/dhcp/dhcpv4"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestE2EMetricsPrometheus runs the built corrald in a network namespace
// of its own (network boot on its loopback: DHCP proxy, TFTP, HTTP) with
// --metrics-listen and a real unixgram NOTIFY_SOCKET, makes boot and API
// traffic (a PXE DISCOVER, a TFTP download, the machine's script, an image,
// a CLI call), and has a real Prometheus in the same namespace scrape it
// every second; each series family is then asked of Prometheus's query
// API. systemd's READY=1, WATCHDOG=1 and STOPPING=1 are read from the
// socket.
func TestE2EMetricsPrometheus(t *testing.T) {
	needE2E(t)
	require.Root(t, "a network namespace of its own (DHCP on port 67 without disturbing the host)")
	require.Tool(t, "ip", "prometheus")
	require.File(t, "/usr/lib/ipxe/ipxe.efi", "iPXE binaries (Debian package ipxe)")
	b := make([]byte, 3)
	rand.Read(b)
	ns := "crm" + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	if out, err := exec.Command("ip", "-n", ns, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v\n%s", err, out)
	}

	notify := listenNotify(t)
	dataDir := t.TempDir()
	logs := &syncbuf.Buffer{}
	cmd := exec.Command("ip", "netns", "exec", ns, filepath.Join(binDir, "corrald"), "serve", "--data-dir", dataDir,
		"--api-listen", "127.0.0.1:20180", "--boot-interface", "lo", "--dhcp-mode", "proxy", "--no-ra",
		"--http-listen", "127.0.0.1:8080", "--tftp-listen", "127.0.0.1:69", "--metrics-listen", "127.0.0.1:9180", "--allow-test-images")
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+notify.path, "WATCHDOG_USEC=1000000")
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("corrald logs:\n%s", logs)
		}
	})
	notify.wait(t, "READY=1", exited)
	notify.wait(t, "WATCHDOG=1", exited)

	// Boot traffic, from inside the namespace.
	const mac = "52:54:00:9c:00:01"
	inNetns(t, ns, func() {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		hw, _ := net.ParseMAC(mac)
		d, err := dhcpv4.NewDiscovery(hw, pxeClient)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.WriteTo(d.ToBytes(), &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 67}); err != nil {
			t.Fatal(err)
		}
	})
	// The DISCOVER made the machine; its script is served once it exists.
	var code int
	var body string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		code, _, body = httpOn(t, dialIn(t, ns, "127.0.0.1:8080"), "127.0.0.1:8080", "/boot.ipxe?mac="+mac)
		if code == 200 || time.Now().After(deadline) {
			break
		}
	}
	if code != 200 {
		t.Fatalf("script: %d %s", code, body)
	}
	if code, _, body := httpOn(t, dialIn(t, ns, "127.0.0.1:8080"), "127.0.0.1:8080", "/images/ipxe.efi"); code != 200 {
		t.Fatalf("image: %d %.200s", code, body)
	}
	if code, _, _ := httpOn(t, dialIn(t, ns, "127.0.0.1:8080"), "127.0.0.1:8080", "/nothing"); code != 404 {
		t.Fatalf("unknown path: %d", code)
	}
	var n int
	inNetns(t, ns, func() { n = tftpDownload(t, "127.0.0.1:69", "ipxe.efi") })
	if want, _ := os.Stat("/usr/lib/ipxe/ipxe.efi"); int64(n) != want.Size() {
		t.Fatalf("TFTP: %d bytes, want %d", n, want.Size())
	}
	out, err := runCmd(t, "ip", "netns", "exec", ns, filepath.Join(binDir, "corral"), "--config", filepath.Join(dataDir, "admin.conf"), "get", "machines")
	if err != nil || !strings.Contains(out, "DISCOVERED") {
		t.Fatalf("corral get machines: %v\n%s", err, out)
	}
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200} {
		if code, _, body := httpOn(t, dialIn(t, ns, "127.0.0.1:9180"), "127.0.0.1:9180", path); code != want {
			t.Errorf("GET %s: %d %s", path, code, body)
		}
	}

	// A real Prometheus scrapes corrald every second.
	promDir := t.TempDir()
	cfg := filepath.Join(promDir, "prometheus.yml")
	os.WriteFile(cfg, []byte(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [`+strconv.Quote(filepath.Join(promassets.Dir(), promassets.RulesFile))+`]
scrape_configs:
  - job_name: corrald
    static_configs:
      - targets: ["127.0.0.1:9180"]
`), 0o644)
	promLogs := &syncbuf.Buffer{}
	prom := exec.Command("ip", "netns", "exec", ns, "prometheus", "--config.file", cfg, "--web.listen-address", "127.0.0.1:9090",
		"--storage.tsdb.path", filepath.Join(promDir, "data"), "--log.level", "warn")
	prom.Stdout, prom.Stderr = promLogs, promLogs
	if err := prom.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		prom.Process.Kill()
		prom.Wait()
		if t.Failed() {
			t.Logf("prometheus logs:\n%s", promLogs)
		}
	})
	queries := map[string]string{
		"target up":                 `up{job="corrald"} == 1`,
		"API calls by method, code": `corral_api_grpc_server_handled_total{grpc_method="ListMachines",grpc_code="OK"} >= 1`,
		"API latency":               `corral_api_grpc_server_handling_seconds_count{grpc_method="ListMachines"} >= 1`,
		"machines by state":         `corral_machines{state="DISCOVERED"} == 1`,
		"nodes by readiness":        `corral_nodes{state="READY"} == 0`,
		"DHCP packets":              `corral_dhcp_packets_total{type="discover"} >= 1`,
		"DHCP answer time":          `corral_dhcp_answer_seconds_count{type="discover"} >= 1`,
		"TFTP transfers":            `corral_tftp_transfers_total{file="ipxe.efi",outcome="served"} == 1`,
		"boot HTTP script":          `corral_boot_http_requests_total{route="script",code="200"} >= 1`,
		"boot HTTP image":           `corral_boot_http_requests_total{route="image",code="200"} == 1`,
		"boot HTTP other":           `corral_boot_http_requests_total{route="other",code="404"} == 1`,
		"store commits":             `corral_store_commit_seconds_count{op=~"put|update",outcome="ok"} >= 1`,
		"boot phase":                `corral_boot_phase_seconds_count{phase="dhcp_to_script"} == 1`,
		"process":                   `process_resident_memory_bytes > 0`,
		"build info":                `corral_build_info{version!="",commit!="",go_version=~"go.+"} == 1`,
		"leader (alone)":            `corral_leader == 1 and corral_leader_changes_total == 1`,
		"CA expiry":                 `corral_certificate_expiry_timestamp_seconds{cert="ca"} - time() > 9 * 365 * 86400`,
		"server cert expiry":        `corral_certificate_expiry_timestamp_seconds{cert="server"} - time() > 365 * 86400`,
	}
	pending := map[string]string{}
	for k, v := range queries {
		pending[k] = v
	}
	for deadline := time.Now().Add(60 * time.Second); len(pending) > 0 && time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		for name, q := range pending {
			if promHas(t, ns, q) {
				delete(pending, name)
			}
		}
	}
	for name, q := range pending {
		t.Errorf("Prometheus has no %s: %s", name, q)
	}
	if t.Failed() {
		_, _, metrics := httpOn(t, dialIn(t, ns, "127.0.0.1:9180"), "127.0.0.1:9180", "/metrics")
		t.Logf("/metrics:\n%s", metrics)
	}

	// The listener is on whatever network --metrics-listen names, the boot
	// LAN included: what a machine there can send must not become a
	// series (no MAC, no path it asked for), and it cannot hold the
	// listener with idle connections.
	_, _, metrics := httpOn(t, dialIn(t, ns, "127.0.0.1:9180"), "127.0.0.1:9180", "/metrics")
	for _, leak := range []string{mac, strings.ToUpper(mac), "mac=", "boot.ipxe", "52:54:00"} {
		if strings.Contains(metrics, leak) {
			t.Errorf("/metrics carries %q, which a machine on the LAN chose", leak)
		}
	}
	idle := make([]net.Conn, 0, 12)
	for range 12 { // the per-address cap is 8 (Prometheus holds one more)
		idle = append(idle, dialIn(t, ns, "127.0.0.1:9180"))
	}
	// All read at once, within a second of dialling: the server's own
	// header timeout (5 s) must not be what closes them here.
	var refused atomic.Int32
	var wg sync.WaitGroup
	for _, c := range idle {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.SetReadDeadline(time.Now().Add(time.Second))
			if _, err := c.Read(make([]byte, 1)); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
				refused.Add(1) // closed by the appliance at once
			}
		}()
	}
	wg.Wait()
	if n := refused.Load(); n < 4 || n > 5 {
		t.Errorf("%d of 12 idle connections from one address closed at once, want 4 or 5 (per-address cap 8; Prometheus may hold one)", n)
	}
	for _, c := range idle {
		c.Close()
	}

	cmd.Process.Signal(syscall.SIGTERM)
	notify.wait(t, "STOPPING=1", nil)
	select {
	case err := <-exited:
		stopped = true
		if err != nil {
			t.Errorf("corrald exit: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Error("corrald did not stop within 20s of SIGTERM")
	}

	// The shipped alert rules and dashboard (packaging/prometheus) read
	// the series above and, from a corrald in full DHCP mode (ranges exist
	// only there), each range's size and free addresses: a second corrald
	// on the same ports, which the same Prometheus scrapes.
	full := exec.Command("ip", "netns", "exec", ns, filepath.Join(binDir, "corrald"), "serve", "--data-dir", t.TempDir(),
		"--api-listen", "127.0.0.1:20180", "--boot-interface", "lo", "--dhcp-mode", "full", "--dhcp-range", "127.0.0.100-127.0.0.199", "--no-ra",
		"--http-listen", "127.0.0.1:8080", "--tftp-listen", "127.0.0.1:69", "--metrics-listen", "127.0.0.1:9180", "--allow-test-images")
	fullLogs := &syncbuf.Buffer{}
	full.Stdout, full.Stderr = fullLogs, fullLogs
	if err := full.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		full.Process.Kill()
		full.Wait()
		if t.Failed() {
			t.Logf("full-mode corrald logs:\n%s", fullLogs)
		}
	})
	ranges := `corral_dhcp_range_size_addresses{range="127.0.0.100-127.0.0.199"} == 100 and on (instance) corral_dhcp_range_free_addresses == 100`
	for deadline := time.Now().Add(30 * time.Second); !promHas(t, ns, ranges); time.Sleep(300 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Prometheus has no DHCP range gauges from the full-mode corrald within 30s: %s", ranges)
		}
	}
	_, _, fullMetrics := httpOn(t, dialIn(t, ns, "127.0.0.1:9180"), "127.0.0.1:9180", "/metrics")
	checkShippedRules(t, ns, metrics+fullMetrics)
}

// TestE2EReadyzStoreGone runs the built corrald on a real etcd and kills
// etcd: /readyz turns 503 naming the store, gRPC health NOT_SERVING, and
// both come back when etcd does; /healthz stays 200 throughout.
func TestE2EReadyzStoreGone(t *testing.T) {
	needE2E(t)
	cl := etcdtest.New(t, 1)
	dataDir := t.TempDir()
	metrics := freePort(t)
	api := freePort(t)
	d := startCorrald(t, dataDir, api, "CORRAL_STORE=etcd", "CORRAL_ETCD_ENDPOINTS="+cl.EndpointsFlag(),
		"CORRAL_METRICS_LISTEN="+metrics, "CORRAL_HEALTH_INTERVAL=300ms", "CORRAL_APPLIANCE_NAME=m1")
	cc, err := clientconfig.Load(filepath.Join(dataDir, "admin.conf"))
	if err != nil {
		t.Fatal(err)
	}
	cc.Token = "" // health needs no credentials, and checking a token needs the store
	conn, err := clientconfig.Dial(cc)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	get := func(path string) (int, string) {
		c, err := net.DialTimeout("tcp", metrics, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		code, _, body := httpOn(t, c, metrics, path)
		return code, body
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !ok(); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 20s", what)
			}
		}
	}
	health := func() healthpb.HealthCheckResponse_ServingStatus {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "corral.inventory.v1.MachineService"})
		if err != nil {
			t.Fatalf("health: %v", err)
		}
		return r.GetStatus()
	}
	waitFor("ready", func() bool { code, _ := get("/readyz"); return code == 200 })
	// The fleet runner stops the appliance when its first record write
	// fails: kill etcd only after it is written.
	waitFor("runner registered", func() bool { return strings.Contains(d.logs.String(), "runner registered") })
	if st := health(); st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health before: %v", st)
	}

	cl.Kill(0)
	var body string
	waitFor("/readyz 503", func() bool {
		var code int
		code, body = get("/readyz")
		return code == 503
	})
	if !strings.Contains(body, "store does not answer") {
		t.Errorf("/readyz says %q, want the store named", body)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Errorf("/healthz with the store gone: %d, want 200 (the process is alive)", code)
	}
	waitFor("NOT_SERVING", func() bool { return health() == healthpb.HealthCheckResponse_NOT_SERVING })

	if err := cl.StartMember(0); err != nil {
		t.Fatal(err)
	}
	waitFor("ready again", func() bool { code, _ := get("/readyz"); return code == 200 })
	waitFor("SERVING again", func() bool { return health() == healthpb.HealthCheckResponse_SERVING })
}

// notifySocket is a unixgram socket standing in for systemd's.
type notifySocket struct {
	path string
	msgs chan string
}

func listenNotify(t *testing.T) *notifySocket {
	t.Helper()
	dir, err := os.MkdirTemp("", "corral-notify") // short: sun_path is 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	n := &notifySocket{path: filepath.Join(dir, "notify"), msgs: make(chan string, 256)}
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: n.path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	go func() {
		buf := make([]byte, 4096)
		for {
			k, err := c.Read(buf)
			if err != nil {
				close(n.msgs)
				return
			}
			select {
			case n.msgs <- string(buf[:k]):
			default: // WATCHDOG=1 nobody waits for
			}
		}
	}()
	return n
}

// wait reads notifications until one has the line want.
func (n *notifySocket) wait(t *testing.T, want string, exited <-chan error) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case m, ok := <-n.msgs:
			if !ok {
				t.Fatalf("notify socket closed before %s", want)
			}
			for _, l := range strings.Split(m, "\n") {
				if l == want {
					return
				}
			}
		case err := <-exited:
			t.Fatalf("corrald exited before %s: %v", want, err)
		case <-timeout:
			t.Fatalf("no %s on NOTIFY_SOCKET within 30s", want)
		}
	}
}

// dialIn opens a TCP connection from inside the network namespace ns.
func dialIn(t *testing.T, ns, addr string) net.Conn {
	t.Helper()
	var c net.Conn
	var err error
	inNetns(t, ns, func() { c, err = net.DialTimeout("tcp", addr, 5*time.Second) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// promHas asks Prometheus (in ns) for an instant query and reports whether
// it returned a series.
func promHas(t *testing.T, ns, q string) bool {
	t.Helper()
	var c net.Conn
	var err error
	inNetns(t, ns, func() { c, err = net.DialTimeout("tcp", "127.0.0.1:9090", 5*time.Second) })
	if err != nil {
		return false // not up yet
	}
	defer c.Close()
	code, _, body := httpOn(t, c, "127.0.0.1:9090", "/api/v1/query?query="+url.QueryEscape(q))
	if code != 200 {
		return false
	}
	var r struct {
		Status string `json:"status"`
		Data   struct {
			Result []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatalf("query %s: %v: %s", q, err, body)
	}
	return r.Status == "success" && len(r.Data.Result) > 0
}

// tftpDownload reads file from server over TFTP (512-byte blocks) and
// returns its size.
func tftpDownload(t *testing.T, server, file string) int {
	t.Helper()
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	dst, err := net.ResolveUDPAddr("udp4", server)
	if err != nil {
		t.Fatal(err)
	}
	rrq := append(append([]byte{0, 1}, file...), 0)
	rrq = append(append(rrq, "octet"...), 0)
	if _, err := conn.WriteToUDP(rrq, dst); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1024)
	total := 0
	for want := uint16(1); ; want++ {
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		k, from, err := conn.ReadFromUDP(buf)
		if err != nil {
			t.Fatalf("TFTP block %d: %v", want, err)
		}
		if k < 4 || binary.BigEndian.Uint16(buf) != 3 {
			t.Fatalf("TFTP: not a DATA packet: % x", buf[:min(k, 64)])
		}
		if blk := binary.BigEndian.Uint16(buf[2:]); blk != want {
			t.Fatalf("TFTP: block %d, want %d", blk, want)
		}
		total += k - 4
		ack := []byte{0, 4, buf[2], buf[3]}
		if _, err := conn.WriteToUDP(ack, from); err != nil {
			t.Fatal(err)
		}
		if k-4 < 512 {
			return total
		}
	}
}

// checkShippedRules checks the alert rules and the dashboard shipped in
// packaging/prometheus against the corrald and the Prometheus of
// TestE2EMetricsPrometheus (in ns): every metric they read is in corrald's
// /metrics, Prometheus loaded the rules and evaluates each without error,
// none is pending or firing on this healthy appliance, and every dashboard
// expression runs. metrics is corrald's /metrics.
func checkShippedRules(t *testing.T, ns, metrics string) {
	t.Helper()
	rf, err := promassets.Rules()
	if err != nil {
		t.Fatal(err)
	}
	d, err := promassets.ReadDashboard()
	if err != nil {
		t.Fatal(err)
	}
	names := promassets.MetricNames(append(rf.Exprs(), d.Exprs()...))
	for _, n := range names {
		if !promassets.Exposed(metrics, n) {
			t.Errorf("the shipped rules or dashboard read %s, which corrald does not export", n)
		}
	}
	// Prometheus evaluates every rule once a second: wait until each has
	// been evaluated without error and is inactive (the gap between the
	// two corralds may have left CorralApplianceDown pending a moment).
	type rule struct {
		Name, Health, State, LastError string
		LastEvaluation                 time.Time
	}
	var rules []rule
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		var r struct {
			Data struct {
				Groups []struct{ Rules []rule } `json:"groups"`
			} `json:"data"`
		}
		promGet(t, ns, "/api/v1/rules", &r)
		rules = rules[:0]
		settled := true
		for _, g := range r.Data.Groups {
			for _, ru := range g.Rules {
				rules = append(rules, ru)
				settled = settled && !ru.LastEvaluation.IsZero() && ru.Health == "ok" && ru.State == "inactive"
			}
		}
		if len(rules) > 0 && settled || time.Now().After(deadline) {
			break
		}
	}
	if want := len(rf.Exprs()); len(rules) != want {
		t.Errorf("Prometheus loaded %d rules, want %d", len(rules), want)
	}
	for _, ru := range rules {
		if ru.Health != "ok" || ru.State != "inactive" {
			t.Errorf("rule %s: health %q (%s), state %q; want ok and inactive on a healthy appliance", ru.Name, ru.Health, ru.LastError, ru.State)
		}
	}
	for _, e := range d.Exprs() {
		var r struct {
			Status string `json:"status"`
			Error  string `json:"error"`
		}
		promGet(t, ns, "/api/v1/query?query="+url.QueryEscape(e.Expr), &r)
		if r.Status != "success" {
			t.Errorf("dashboard %s: %s: %s", e.Where, e.Expr, r.Error)
		}
	}
	t.Logf("%d metric names of the shipped rules and dashboard exported; %d rules evaluated; %d dashboard expressions ran", len(names), len(rules), len(d.Exprs()))
}

// promGet reads a Prometheus API path (in ns) as JSON into v.
func promGet(t *testing.T, ns, path string, v any) {
	t.Helper()
	_, _, body := httpOn(t, dialIn(t, ns, "127.0.0.1:9090"), "127.0.0.1:9090", path)
	if err := json.Unmarshal([]byte(body), v); err != nil {
		t.Fatalf("GET %s: %v: %.300s", path, err, body)
	}
}
