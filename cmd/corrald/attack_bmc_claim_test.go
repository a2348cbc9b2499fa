package main

// Attack test for the claim rules' BMC case (docs/security.md, "Claims":
// "A BMC address in a report never identifies a machine by itself"),
// against the built corrald with its DHCP in full mode in a network
// namespace: a real IPMI BMC (ipmi_sim) enrolled before its machine ever
// booted, machines on the boot LAN in another namespace with their own
// leases (raw DHCP) and per-boot tokens, a real gRPC client over TLS from
// their leased addresses.

import (
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netns"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/corralhq/corral/api/clientconfig"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/testsupport/ipmisim"
	"github.com/corralhq/corral/testsupport/machinefacts"
	"github.com/corralhq/corral/testsupport/require"
	"github.com/corralhq/corral/testsupport/syncbuf"
)

// TestAttackBMCClaim: machine rack1-u07 is enrolled by its BMC before it
// ever booted, so its record holds a BMC address and nothing else: no boot
// MAC, no serial, no facts. An impostor on the boot LAN, with its own
// lease and per-boot token, reports that BMC's address (with no serial,
// then with an invented one). It is parked in CONFLICT as a record of its
// own; rack1-u07 is unchanged and its BMC still bound and working; the
// claim is on the impostor's timeline and cannot be accepted. The real
// server then boots from its own MAC and reports the same BMC address and
// its true serial: it is parked for the operator too (a BMC address alone
// identifies nobody), for the BMC address and not for anything the
// impostor said; the operator adopts it into rack1-u07, and once it
// boots again its report lands there. The impostor is refused still.
func TestAttackBMCClaim(t *testing.T) {
	needE2E(t)
	require.Root(t, "network namespaces for DHCP in full mode")
	require.Tool(t, "ip")
	require.File(t, "/boot/ipxe.lkrn", "the discovery kernel stand-in (Debian package ipxe)")
	const (
		impostor, genuine = "52:54:00:bb:20:01", "52:54:00:aa:20:01"
		bmcIP             = "192.0.2.23" // on the appliance's side, as a management network's BMC
		enrolled          = "rack1-u07"
		realSN            = "SN-RACK1-U07"
		realUUID          = "6a1c0f3e-aaaa-4a5b-9c2d-000000002001"
	)
	ctx := context.Background()
	srvNS, cliNS, br, inner := netnsPair(t, "crb", "10.77.1", "10.77.1.250")
	// The BMC: ipmi_sim on the host's loopback, reached from the
	// appliance's namespace at bmcIP:623 (the port the in-band address
	// implies) through a relay.
	ipCmd(t, "-n", srvNS, "addr", "add", bmcIP+"/32", "dev", "lo")
	bmc := ipmisim.Start(t, ipmisim.Options{})
	udpRelay(t, srvNS, bmcIP+":623", bmc.Addr())
	f := startFullCorrald(t, srvNS, br, "10.77.1")
	machines := inventoryv1.NewMachineServiceClient(f.admin)

	if _, err := machines.EnrollMachine(ctx, &inventoryv1.EnrollMachineRequest{Name: enrolled, BmcAddress: bmcIP,
		BmcProtocol: inventoryv1.BmcProtocol_BMC_PROTOCOL_IPMI, BmcUsername: bmc.User, BmcPassword: bmc.Pass}); err != nil {
		t.Fatalf("enroll %s by its BMC: %v", enrolled, err)
	}
	before := f.machine(enrolled)
	if before.GetBootMac() != "" || len(before.GetMacs()) != 0 || before.GetSerial() != "" || before.GetFacts() != nil || before.GetBmc().GetAddress() != bmcIP {
		t.Fatalf("the enrolled record holds more than a BMC address: %v", before)
	}
	// What may change on rack1-u07 without anyone reporting: the power
	// state the appliance reads from its BMC.
	unchanged := func(t *testing.T) {
		t.Helper()
		if diff := cmp.Diff(before, f.machine(enrolled), protocmp.Transform(),
			protocmp.IgnoreFields(&inventoryv1.Machine{}, "power_state", "power_read_at", "updated_at")); diff != "" {
			t.Errorf("the enrolled record changed (-before +after):\n%s", diff)
		}
	}
	withBMC := func(facts *inventoryv1.Facts) *inventoryv1.Facts {
		facts.Bmc = &inventoryv1.Facts_BmcLan{Channel: 1, Ipv4Address: bmcIP, Mac: "0c:c4:7a:01:02:03"}
		return facts
	}

	dhcp := dhcpClient(t, cliNS)
	leaseI := dora(t, dhcp, impostor)
	ipCmd(t, "-n", cliNS, "addr", "add", leaseI+"/24", "dev", inner)

	// The impostor's agent: its token, read off its script once (after
	// the claim its MAC boots its local disk, with no token).
	impostorAgent := f.agent(cliNS, leaseI, f.token(cliNS, leaseI, impostor))

	t.Run("takeover by BMC address", func(t *testing.T) {
		agent := impostorAgent
		for _, facts := range []*inventoryv1.Facts{
			withBMC(machinefacts.QEMU("", "", impostor)),
			withBMC(machinefacts.QEMU("SN-INVENTED", "", impostor)),
		} {
			_, err := agent.Register(ctx, &nodev1.RegisterRequest{BootMac: impostor, Facts: facts})
			wantCode(t, "Register stating the enrolled BMC's address", err, codes.PermissionDenied,
				"parked as machine conflict-525400bb2001: the report states BMC address "+bmcIP+", enrolled for machine "+enrolled)
		}
		unchanged(t)
		parked := f.machine("conflict-525400bb2001")
		if parked.GetState() != inventoryv1.Machine_CONFLICT || parked.GetConflict().GetMachine() != enrolled || parked.GetConflict().GetReports() != 2 {
			t.Fatalf("parked record: state %s, conflict %v", parked.GetState(), parked.GetConflict())
		}
		// The claimed machine has no MAC, so no timeline of its own yet:
		// the claim is on the impostor's, and in the log.
		e := f.waitEntry(impostor, "register-conflict", "enrolled for machine "+enrolled)
		if e.GetAttributes()["claimed"] != enrolled {
			t.Errorf("the entry does not name the claimed machine: %v", e.GetAttributes())
		}
		if !strings.Contains(f.logs.String(), "discovery report parked in CONFLICT") {
			t.Error("corrald logged no parked report")
		}
		_, err := machines.AcceptMachine(ctx, &inventoryv1.AcceptMachineRequest{Name: parked.GetName(), Disk: "auto"})
		wantCode(t, "accept of the parked report", err, codes.FailedPrecondition, "CONFLICT")
		// rack1-u07's BMC is still bound to it and still answers.
		if _, err := machines.GetPower(ctx, &inventoryv1.GetPowerRequest{Name: enrolled}); err != nil {
			t.Errorf("power of %s through its BMC after the claim: %v", enrolled, err)
		}
		if _, err := machines.GetPower(ctx, &inventoryv1.GetPowerRequest{Name: parked.GetName()}); err == nil {
			t.Error("the parked record controls a BMC")
		}
	})

	t.Run("the real server is not refused as the impostor", func(t *testing.T) {
		leaseR := dora(t, dhcp, genuine)
		ipCmd(t, "-n", cliNS, "addr", "add", leaseR+"/24", "dev", inner)
		facts := withBMC(machinefacts.QEMU(realSN, realUUID, genuine))
		agent := f.agent(cliNS, leaseR, f.token(cliNS, leaseR, genuine))
		_, err := agent.Register(ctx, &nodev1.RegisterRequest{BootMac: genuine, Facts: facts})
		// Parked for the operator: for the BMC address, not for anything
		// the impostor said.
		wantCode(t, "the real server's first Register", err, codes.PermissionDenied,
			"parked as machine conflict-525400aa2001: the report states BMC address "+bmcIP+", enrolled for machine "+enrolled)
		if msg := err.Error(); strings.Contains(msg, "SN-INVENTED") || strings.Contains(msg, "525400bb2001") {
			t.Errorf("the real server is refused for the impostor's report: %v", err)
		}
		unchanged(t)
		if _, err := machines.AdoptMachine(ctx, &inventoryv1.AdoptMachineRequest{Name: "conflict-525400aa2001"}); err != nil {
			t.Fatalf("the operator adopts the real server's report: %v", err)
		}
		f.waitEntry(genuine, "adopted", "parked report conflict-525400aa2001 adopted as machine "+enrolled)
		m := f.machine(enrolled)
		if m.GetBootMac() != genuine || m.GetSerial() != realSN || m.GetSystemUuid() != realUUID || !proto.Equal(m.GetFacts(), facts) ||
			m.GetBmc().GetAddress() != bmcIP || m.GetState() != inventoryv1.Machine_INVENTORIED {
			t.Fatalf("%s after the adopt: %v", enrolled, m)
		}
		// Its agent, still running with the token it had, reports again
		// (it retries with back-off): the report lands on rack1-u07 and its
		// session opens, with no reboot.
		reg, err := agent.Register(ctx, &nodev1.RegisterRequest{BootMac: genuine, Facts: facts})
		if err != nil {
			t.Fatalf("the real server's Register after the adopt: %v", err)
		}
		if reg.GetMachineName() != enrolled {
			t.Fatalf("the real server registered as %s, want %s", reg.GetMachineName(), enrolled)
		}
		if _, err := session(t, agent, reg.GetSessionId()); err != nil {
			t.Fatalf("the real server's session: %v", err)
		}
		f.waitEntry(genuine, "registered", "machine "+enrolled)
		if _, err := machines.GetPower(ctx, &inventoryv1.GetPowerRequest{Name: enrolled}); err != nil {
			t.Errorf("power of %s through its BMC after the adopt: %v", enrolled, err)
		}
		// The impostor is still parked, and rack1-u07 as the real
		// server left it.
		adopted := f.machine(enrolled)
		_, err = impostorAgent.Register(ctx, &nodev1.RegisterRequest{BootMac: impostor,
			Facts: withBMC(machinefacts.QEMU("SN-INVENTED", "", impostor))})
		wantCode(t, "the impostor after the adopt", err, codes.PermissionDenied, "parked as machine conflict-525400bb2001")
		if diff := cmp.Diff(adopted, f.machine(enrolled), protocmp.Transform(),
			protocmp.IgnoreFields(&inventoryv1.Machine{}, "power_state", "power_read_at", "updated_at")); diff != "" {
			t.Errorf("the impostor changed %s (-before +after):\n%s", enrolled, diff)
		}
	})
}

// fullCorrald is corrald in a network namespace with its DHCP in full
// mode on the namespace's bridge, its API at <subnet>.1:20180 and boot
// HTTP at <subnet>.1:8080.
type fullCorrald struct {
	t           *testing.T
	srvNS, data string
	api, http   string
	cc          *clientconfig.Config
	logs        *syncbuf.Buffer
	admin       *grpc.ClientConn
}

// startFullCorrald starts corrald in srvNS on bridge br (addresses
// <subnet>.100-150 leased) with TFTP and router advertisements off, and
// stops it (SIGTERM) at the end; extra flags are appended.
func startFullCorrald(t *testing.T, srvNS, br, subnet string, extra ...string) *fullCorrald {
	t.Helper()
	f := &fullCorrald{t: t, srvNS: srvNS, data: t.TempDir(), api: subnet + ".1:20180", http: subnet + ".1:8080", logs: &syncbuf.Buffer{}}
	args := append([]string{"netns", "exec", srvNS, filepath.Join(binDir, "corrald"), "serve", "--data-dir", f.data,
		"--api-listen", ":20180", "--boot-interface", br, "--dhcp-mode", "full", "--dhcp-range", subnet + ".100-" + subnet + ".150",
		"--tftp-listen", "off", "--no-ra", "--http-listen", f.http, "--metrics-listen", "", "--allow-test-images"}, extra...)
	cmd := exec.Command("ip", args...)
	cmd.Stdout, cmd.Stderr = f.logs, f.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{}) // closed when corrald has exited, with waitErr set
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("corrald logs:\n%s", f.logs)
		}
	})
	for deadline := time.Now().Add(60 * time.Second); !strings.Contains(f.logs.String(), "network boot on"); time.Sleep(50 * time.Millisecond) {
		select {
		case <-exited:
			t.Fatalf("corrald exited early: %v\n%s", waitErr, f.logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("corrald did not start\n%s", f.logs)
		}
	}
	cc, err := clientconfig.Load(filepath.Join(f.data, "admin.conf"))
	if err != nil {
		t.Fatal(err)
	}
	f.cc = cc
	f.admin = f.dial(srvNS, "", cc.Token)
	return f
}

// dial is a real gRPC client over TLS (the appliance CA) with token,
// whose connections are made in namespace ns from address from ("" any).
func (f *fullCorrald) dial(ns, from, token string) *grpc.ClientConn {
	f.t.Helper()
	conn, err := clientconfig.Dial(&clientconfig.Config{Endpoint: f.api, CACert: f.cc.CACert, Token: token}, grpc.WithContextDialer(nsDialer(ns, from)))
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { conn.Close() })
	return conn
}

// agent is a discovery agent's client: from its leased address in the
// client namespace, with its per-boot token.
func (f *fullCorrald) agent(ns, from, token string) nodev1.AgentServiceClient {
	return nodev1.NewAgentServiceClient(f.dial(ns, from, token))
}

// token is mac's per-boot token, read off the script the appliance
// serves its leased address from.
func (f *fullCorrald) token(ns, from, mac string) string {
	f.t.Helper()
	var conn net.Conn
	inNetns(f.t, ns, func() {
		d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		var err error
		if conn, err = d.Dial("tcp", f.http); err != nil {
			f.t.Fatalf("dial %s from %s: %v", f.http, from, err)
		}
	})
	defer conn.Close()
	code, _, body := httpOn(f.t, conn, f.http, "/boot.ipxe?mac="+mac)
	if code != 200 {
		f.t.Fatalf("script of %s from %s: %d %s", mac, from, code, body)
	}
	return scriptToken(f.t, body)
}

func (f *fullCorrald) machine(name string) *inventoryv1.Machine {
	f.t.Helper()
	m, err := inventoryv1.NewMachineServiceClient(f.admin).GetMachine(context.Background(), &inventoryv1.GetMachineRequest{Name: name})
	if err != nil {
		f.t.Fatalf("GetMachine %s: %v", name, err)
	}
	return m
}

// waitEntry is credCorrald.waitEntry's twin.
func (f *fullCorrald) waitEntry(mac, event, detail string) *inventoryv1.TimelineEntry {
	f.t.Helper()
	c := &credCorrald{t: f.t, admin: f.admin}
	return c.waitEntry(mac, event, detail)
}

// nsDialer dials in network namespace ns (the calling thread switched
// there while the socket is made) from address from ("" any). It reports
// errors, never fails a test: gRPC calls it on its own goroutines.
func nsDialer(ns, from string) func(context.Context, string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			return nil, err
		}
		defer orig.Close()
		h, err := netns.GetFromName(ns)
		if err != nil {
			runtime.UnlockOSThread()
			return nil, err
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			runtime.UnlockOSThread()
			return nil, err
		}
		defer func() {
			// A thread that cannot go back stays locked and dies with
			// the goroutine.
			if netns.Set(orig) == nil {
				runtime.UnlockOSThread()
			}
		}()
		d := net.Dialer{Timeout: 5 * time.Second}
		if from != "" {
			d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
		}
		return d.DialContext(ctx, "tcp", addr)
	}
}

// dhcpClient is a DHCP client socket (:68, broadcast) in namespace ns,
// closed at the end of the test.
func dhcpClient(t *testing.T, ns string) *net.UDPConn {
	t.Helper()
	var conn *net.UDPConn
	inNetns(t, ns, func() {
		pc, err := net.ListenPacket("udp4", "0.0.0.0:68")
		if err != nil {
			t.Fatalf("listen :68 in %s: %v", ns, err)
		}
		conn = pc.(*net.UDPConn)
	})
	t.Cleanup(func() { conn.Close() })
	raw, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	raw.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_BROADCAST, 1) })
	return conn
}

// udpRelay forwards UDP datagrams sent to listen (a socket in namespace
// ns) to the address to (in the test's own namespace), and the answers
// back, with one upstream socket per client address, until the test
// ends.
func udpRelay(t *testing.T, ns, listen, to string) {
	t.Helper()
	la, err := net.ResolveUDPAddr("udp4", listen)
	if err != nil {
		t.Fatal(err)
	}
	ta, err := net.ResolveUDPAddr("udp4", to)
	if err != nil {
		t.Fatal(err)
	}
	var l *net.UDPConn
	inNetns(t, ns, func() {
		if l, err = net.ListenUDP("udp4", la); err != nil {
			t.Fatalf("relay listen %s in %s: %v", listen, ns, err)
		}
	})
	var mu sync.Mutex
	ups := map[string]*net.UDPConn{}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, u := range ups {
			u.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := l.ReadFromUDP(buf)
			if err != nil {
				return
			}
			mu.Lock()
			up := ups[from.String()]
			if up == nil {
				if up, err = net.DialUDP("udp4", nil, ta); err != nil {
					mu.Unlock()
					continue
				}
				ups[from.String()] = up
				wg.Go(func() {
					b := make([]byte, 65536)
					for {
						n, err := up.Read(b)
						if err != nil {
							return
						}
						l.WriteToUDP(b[:n], from)
					}
				})
			}
			mu.Unlock()
			up.Write(buf[:n])
		}
	})
}
