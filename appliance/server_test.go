package appliance

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/auth/pki"
	"github.com/corralhq/corral/store"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

const gib = 1 << 30

func applyNode(t testing.TB, c poolv1.NodeServiceClient, name string, milli uint32, mem uint64) {
	t.Helper()
	_, err := c.ApplyNode(context.Background(), &poolv1.ApplyNodeRequest{Name: name, CpuMilliCores: milli, MemoryBytes: mem, StorageBytes: 100 * gib, Rack: "r1"})
	if err != nil {
		t.Fatalf("ApplyNode: %v", err)
	}
}

func TestFirstStartWritesAdminConfig(t *testing.T) {
	dir := t.TempDir()
	_, cc := startServer(t, dir)
	fi, err := os.Stat(filepath.Join(dir, AdminConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("admin.conf mode %v, want 0600", fi.Mode().Perm())
	}
	if cc.Token == "" || cc.CACert == "" || cc.Endpoint == "" {
		t.Fatalf("admin.conf incomplete: %+v", cc)
	}
}

func TestRoles(t *testing.T) {
	srv, cc := startServer(t, t.TempDir())
	ctx := context.Background()
	tokens := map[string]string{
		"none":     "",
		"viewer":   newToken(t, srv, authv1.Role_ROLE_VIEWER),
		"user":     newToken(t, srv, authv1.Role_ROLE_USER),
		"operator": newToken(t, srv, authv1.Role_ROLE_OPERATOR),
		"admin":    cc.Token,
		"node":     newToken(t, srv, authv1.Role_ROLE_NODE),
		"bogus":    "crl_0000000000000000_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
	}
	type call func(poolv1.NodeServiceClient, inventoryv1.MachineServiceClient) error
	list := func(n poolv1.NodeServiceClient, _ inventoryv1.MachineServiceClient) error {
		_, err := n.ListNodes(ctx, &poolv1.ListNodesRequest{})
		return err
	}
	apply := func(n poolv1.NodeServiceClient, _ inventoryv1.MachineServiceClient) error {
		_, err := n.ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: "n1", CpuMilliCores: 1000, MemoryBytes: gib})
		return err
	}
	machines := func(_ poolv1.NodeServiceClient, m inventoryv1.MachineServiceClient) error {
		_, err := m.ListMachines(ctx, &inventoryv1.ListMachinesRequest{})
		return err
	}
	// Allocation needs USER: a viewer (read-only) token may not hold
	// machines. With no READY machine an admitted call is ResourceExhausted.
	allocate := func(_ poolv1.NodeServiceClient, m inventoryv1.MachineServiceClient) error {
		_, err := m.AllocateMachines(ctx, &inventoryv1.AllocateMachinesRequest{Count: 1})
		return err
	}
	cases := map[string]struct {
		token string
		call  call
		want  codes.Code
	}{
		"viewer allocate":   {"viewer", allocate, codes.PermissionDenied},
		"user allocate":     {"user", allocate, codes.ResourceExhausted},
		"operator allocate": {"operator", allocate, codes.ResourceExhausted},
		"user apply":        {"user", apply, codes.PermissionDenied},
		"user machines":     {"user", machines, codes.OK},
		"no token list":     {"none", list, codes.Unauthenticated},
		"bogus token list":  {"bogus", list, codes.Unauthenticated},
		"viewer list":       {"viewer", list, codes.OK},
		"viewer apply":      {"viewer", apply, codes.PermissionDenied},
		"operator apply":    {"operator", apply, codes.OK},
		"admin apply":       {"admin", apply, codes.OK},
		"node token apply":  {"node", apply, codes.PermissionDenied},
		"node list":         {"node", list, codes.PermissionDenied},
		"viewer machines":   {"viewer", machines, codes.OK},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := *cc
			c.Token = tokens[tc.token]
			conn := dial(t, &c, "")
			if tc.token == "none" {
				c.Token = ""
				conn = dial(t, &c, "")
			}
			err := tc.call(poolv1.NewNodeServiceClient(conn), inventoryv1.NewMachineServiceClient(conn))
			if got := status.Code(err); got != tc.want {
				t.Fatalf("got %v (%v), want %v", got, err, tc.want)
			}
		})
	}
}

// TestConcurrentReserveCompute: 64 concurrent ReserveCompute calls through
// the real TLS gRPC server on bbolt against a node with room for exactly 10.
func TestConcurrentReserveCompute(t *testing.T) {
	_, cc := startServer(t, t.TempDir())
	c := poolv1.NewNodeServiceClient(dial(t, cc, ""))
	applyNode(t, c, "n1", 10_000, 10*gib)
	var wg sync.WaitGroup
	codesSeen := make([]codes.Code, 64)
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.ReserveCompute(context.Background(), &poolv1.ReserveComputeRequest{
				NodeName: "n1", ComputeName: fmt.Sprintf("vm%02d", i),
				RequestCpuMilliCore: 1000, LimitCpuMilliCore: 1000, RequestMemoryBytes: gib, LimitMemoryBytes: gib,
			})
			codesSeen[i] = status.Code(err)
		}()
	}
	wg.Wait()
	count := map[codes.Code]int{}
	for _, c := range codesSeen {
		count[c]++
	}
	if count[codes.OK] != 10 || count[codes.ResourceExhausted] != 54 {
		t.Fatalf("outcomes %v, want 10 OK and 54 ResourceExhausted", count)
	}
	n, err := c.GetNode(context.Background(), &poolv1.GetNodeRequest{Name: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	if got := len(n.GetReservedComputes()); got != 10 {
		t.Fatalf("node has %d reservations, want 10", got)
	}
}

// TestConcurrentReserveNetworkInterface: 300 concurrent reservations on a
// /24 with a gateway: exactly 253 distinct addresses.
func TestConcurrentReserveNetworkInterface(t *testing.T) {
	_, cc := startServer(t, t.TempDir())
	c := poolv1.NewNetworkServiceClient(dial(t, cc, ""))
	if _, err := c.ApplyNetwork(context.Background(), &poolv1.ApplyNetworkRequest{
		Name: "lan", Ipv4Cidr: "10.20.0.0/24", Ipv4Gateway: "10.20.0.1", DnsServers: []string{"10.20.0.1"},
	}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	outcomes := make([]codes.Code, 300)
	for i := range 300 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.ReserveNetworkInterface(context.Background(), &poolv1.ReserveNetworkInterfaceRequest{
				NetworkName: "lan", NetworkInterfaceName: fmt.Sprintf("if%03d", i),
			})
			outcomes[i] = status.Code(err)
		}()
	}
	wg.Wait()
	count := map[codes.Code]int{}
	for _, c := range outcomes {
		count[c]++
	}
	if count[codes.OK] != 253 || count[codes.ResourceExhausted] != 47 {
		t.Fatalf("outcomes %v, want 253 OK and 47 ResourceExhausted", count)
	}
	n, err := c.GetNetwork(context.Background(), &poolv1.GetNetworkRequest{Name: "lan"})
	if err != nil {
		t.Fatal(err)
	}
	addrs, macs := map[string]bool{}, map[string]bool{}
	pfx := netip.MustParsePrefix("10.20.0.0/24")
	for name, ni := range n.GetReservedNetworkInterfaces() {
		a, err := netip.ParseAddr(ni.GetIpv4Address())
		if err != nil || !pfx.Contains(a) || a.As4()[3] == 0 || a.As4()[3] == 1 || a.As4()[3] == 255 {
			t.Errorf("%s: bad address %q", name, ni.GetIpv4Address())
		}
		addrs[ni.GetIpv4Address()] = true
		macs[ni.GetHardwareAddress()] = true
	}
	if len(addrs) != 253 || len(macs) != 253 {
		t.Fatalf("%d distinct addresses and %d distinct MACs, want 253 each", len(addrs), len(macs))
	}
}

// TestRestartKeepsReservations closes and reopens the appliance on the same
// data dir (the SIGKILL variant runs the real binary in cmd/corrald).
func TestRestartKeepsReservations(t *testing.T) {
	dir := t.TempDir()
	srv, err := New(Config{DataDir: dir, APIListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	cc1, _ := loadAdmin(t, dir)
	c := poolv1.NewNodeServiceClient(dial(t, cc1, ""))
	applyNode(t, c, "n1", 4000, 4*gib)
	for i := range 3 {
		if _, err := c.ReserveCompute(context.Background(), &poolv1.ReserveComputeRequest{NodeName: "n1", ComputeName: fmt.Sprint("c", i),
			RequestCpuMilliCore: 500, LimitCpuMilliCore: 1000, RequestMemoryBytes: gib / 2, LimitMemoryBytes: gib / 2}); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	_, cc2 := startServer(t, dir)
	if cc2.Token != cc1.Token {
		t.Errorf("admin token changed across restart")
	}
	n, err := poolv1.NewNodeServiceClient(dial(t, cc2, "")).GetNode(context.Background(), &poolv1.GetNodeRequest{Name: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(n.GetReservedComputes()) != 3 {
		t.Fatalf("after restart: %d reservations, want 3", len(n.GetReservedComputes()))
	}
}

// TestCorruptStoreRefused: a truncated store file is a startup error naming
// the file, and the file is left as it was.
func TestCorruptStoreRefused(t *testing.T) {
	dir := t.TempDir()
	_, cc := startServer(t, dir)
	applyNode(t, poolv1.NewNodeServiceClient(dial(t, cc, "")), "n1", 1000, gib)
	// The server still holds the file; corrupt a copy of it.
	src := filepath.Join(dir, StoreFile)
	dir2 := t.TempDir()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	// Cut inside the pages in use: bbolt grows its file ahead of its data,
	// so half the file can still hold every page of a small store. Three
	// 4 KiB pages keep the two meta pages and lose the rest.
	bad := b[:min(len(b)/2, 3*4096)]
	if err := os.WriteFile(filepath.Join(dir2, StoreFile), bad, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = New(Config{DataDir: dir2, APIListen: "127.0.0.1:0"})
	if err == nil {
		t.Fatal("New on a truncated store succeeded")
	}
	if !errors.Is(err, store.ErrCorrupt) || !strings.Contains(err.Error(), filepath.Join(dir2, StoreFile)) {
		t.Fatalf("error %q does not name the file / wrap ErrCorrupt", err)
	}
	after, _ := os.ReadFile(filepath.Join(dir2, StoreFile))
	if string(after) != string(bad) {
		t.Fatal("corrupt store file was modified")
	}
	if _, err := os.Stat(filepath.Join(dir2, AdminConfigFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("admin.conf written despite a corrupt store")
	}
}

// TestRegisterAuth: Register needs an agent (or admin) token; a wrong or
// expired token is Unauthenticated and stores nothing.
func TestRegisterAuth(t *testing.T) {
	srv, cc := startServer(t, t.TempDir())
	ctx := context.Background()
	agentTok := newToken(t, srv, authv1.Role_ROLE_AGENT)
	expired, err := srv.Tokens().Create(ctx, authv1.Role_ROLE_AGENT, "expired", time.Nanosecond)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	req := &nodev1.RegisterRequest{BootMac: "52:54:00:12:34:56", Facts: &inventoryv1.Facts{
		System: &inventoryv1.Facts_System{Serial: "SN-REG-1", Uuid: "5b3c5a84-6c1c-4b0e-9d5b-5f1e0d3e7a11"},
	}}
	for name, tc := range map[string]struct {
		token string
		want  codes.Code
	}{
		"wrong token":   {"crl_0000000000000000_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", codes.Unauthenticated},
		"expired token": {expired, codes.Unauthenticated},
		"viewer token":  {newToken(t, srv, authv1.Role_ROLE_VIEWER), codes.PermissionDenied},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := nodev1.NewAgentServiceClient(dial(t, cc, tc.token)).Register(ctx, req)
			if status.Code(err) != tc.want {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
	ms, err := inventoryv1.NewMachineServiceClient(dial(t, cc, "")).ListMachines(ctx, &inventoryv1.ListMachinesRequest{})
	if err != nil || len(ms.GetMachines()) != 0 {
		t.Fatalf("refused registrations stored machines: %v %v", ms, err)
	}
	resp, err := nodev1.NewAgentServiceClient(dial(t, cc, agentTok)).Register(ctx, req)
	if err != nil || resp.GetSessionId() == "" {
		t.Fatalf("agent Register: %v %v", resp, err)
	}
	m, err := inventoryv1.NewMachineServiceClient(dial(t, cc, "")).GetMachine(ctx, &inventoryv1.GetMachineRequest{Name: resp.GetMachineName()})
	if err != nil || m.GetSerial() != "SN-REG-1" || m.GetState() != inventoryv1.Machine_INVENTORIED {
		t.Fatalf("registered machine: %v %v", m, err)
	}
	// Oversized facts: InvalidArgument, nothing new stored.
	bad := proto.CloneOf(req)
	bad.BootMac = "52:54:00:12:34:57"
	bad.Facts.System.Serial = strings.Repeat("S", 10000)
	if _, err := nodev1.NewAgentServiceClient(dial(t, cc, agentTok)).Register(ctx, bad); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("oversized facts: %v", err)
	}
	// The session: first message must carry the session id; then `wait`.
	stream, err := nodev1.NewAgentServiceClient(dial(t, cc, agentTok)).Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&nodev1.AgentMessage{Msg: &nodev1.AgentMessage_Heartbeat{Heartbeat: &nodev1.Heartbeat{SessionId: resp.GetSessionId()}}}); err != nil {
		t.Fatal(err)
	}
	cmd, err := stream.Recv()
	if err != nil || cmd.GetWait() == nil {
		t.Fatalf("session first command: %v %v", cmd, err)
	}
	stream.CloseSend()
}

// TestServerSendsCA: the TLS chain carries the CA, so an agent that knows
// only the CA's fingerprint can verify the appliance.
func TestServerSendsCA(t *testing.T) {
	srv, cc := startServer(t, t.TempDir())
	conn, err := tls.Dial("tcp", cc.Endpoint, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	want, err := pki.Fingerprint(srv.CA().CertPEM())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range conn.ConnectionState().PeerCertificates {
		sum := sha256.Sum256(c.Raw)
		if hex.EncodeToString(sum[:]) == want {
			return
		}
	}
	t.Fatalf("the server's chain does not include the CA (fingerprint %s)", want)
}

// TestJoinAndNodeIdentity: a node token buys a certificate through Join;
// with it the node may apply its own Node and no other.
func TestJoinAndNodeIdentity(t *testing.T) {
	srv, cc := startServer(t, t.TempDir())
	ctx := context.Background()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{IPAddresses: []net.IP{net.ParseIP("10.0.0.11")}}, key)
	csr := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))

	// A viewer token cannot join; a node token can.
	if _, err := nodev1.NewAgentServiceClient(dial(t, cc, newToken(t, srv, authv1.Role_ROLE_VIEWER))).Join(ctx, &nodev1.JoinRequest{Name: "node-1", CsrPem: csr}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("viewer Join: %v", err)
	}
	resp, err := nodev1.NewAgentServiceClient(dial(t, cc, newToken(t, srv, authv1.Role_ROLE_NODE))).Join(ctx, &nodev1.JoinRequest{Name: "node-1", CsrPem: csr})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nodev1.NewAgentServiceClient(dial(t, cc, newToken(t, srv, authv1.Role_ROLE_NODE))).Join(ctx, &nodev1.JoinRequest{Name: "node-1", CsrPem: "garbage"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("garbage CSR: %v", err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	cert, err := tls.X509KeyPair([]byte(resp.GetCertPem()), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(cc.Endpoint, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{cert}, RootCAs: srv.CA().Pool(), ServerName: "127.0.0.1",
	})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	nodes := poolv1.NewNodeServiceClient(conn)
	if _, err := nodes.ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: "node-1", CpuMilliCores: 1000, MemoryBytes: gib}); err != nil {
		t.Fatalf("node-1 applying itself: %v", err)
	}
	if _, err := nodes.ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: "node-2", CpuMilliCores: 1000, MemoryBytes: gib}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("node-1 applying node-2: %v", err)
	}
}
