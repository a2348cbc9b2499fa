package main

// Attack test for the deployed OS's phone-home (docs/security.md,
// "Phone-home"), against the built corrald: a machine is registered by its
// agent, pooled, allocated and deployed from an uploaded raw image; then
// POSTs to /phone-home on the boot HTTP server with guessed tokens (and an
// unknown deployment, and a GET) are refused with a bare status and
// change nothing, while the token the plan carried makes it DEPLOYED.

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	osimagev1 "github.com/corralhq/corral/api/osimage/v1"
	"github.com/corralhq/corral/testsupport/machinefacts"
)

func TestAttackPhoneHomeGuessedToken(t *testing.T) {
	c := startCredCorrald(t, "--reconcile-interval", "1s")
	ctx := context.Background()
	machines := inventoryv1.NewMachineServiceClient(c.admin)
	const mac = "52:54:00:ee:00:01"
	agent := c.agent(c.token(mac, "127.0.9.1"))
	reg, err := agent.Register(ctx, &nodev1.RegisterRequest{BootMac: mac, Facts: machinefacts.QEMU("SN-PHONE-1", "", mac)})
	if err != nil {
		t.Fatal(err)
	}
	name := reg.GetMachineName()
	msgs, err := session(t, agent, reg.GetSessionId())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := machines.AcceptMachine(ctx, &inventoryv1.AcceptMachineRequest{Name: name, Target: inventoryv1.AcceptTarget_ACCEPT_TARGET_POOL}); err != nil {
		t.Fatal(err)
	}
	if _, err := machines.AllocateMachines(ctx, &inventoryv1.AllocateMachinesRequest{Count: 1}); err != nil {
		t.Fatal(err)
	}
	uploadRawImage(t, c, "tiny")
	var m *inventoryv1.Machine
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		m, err = machines.DeployMachine(ctx, &inventoryv1.DeployMachineRequest{Name: name, OsImage: "tiny", UserData: []byte("#cloud-config\n{}\n")})
		if err == nil || time.Now().After(deadline) {
			break // the image's block map may still be building
		}
	}
	if err != nil {
		t.Fatalf("deploy: %v", err)
	}
	if m.GetState() != inventoryv1.Machine_DEPLOYING || len(m.GetDeployment().GetUserData()) != 0 {
		t.Fatalf("deploy answered %v, user data %d bytes", m.GetState(), len(m.GetDeployment().GetUserData()))
	}
	id := m.GetDeployment().GetDeploymentId()
	var plan *nodev1.DeployPlan
	for plan == nil {
		select {
		case msg, ok := <-msgs:
			if !ok {
				t.Fatal("session closed before the deploy plan")
			}
			plan = msg.GetDeploy()
		case <-time.After(10 * time.Second):
			t.Fatal("no deploy plan on the session")
		}
	}
	found := regexp.MustCompile(`/phone-home/` + id + `/([A-Za-z0-9_-]+)`).FindStringSubmatch(string(plan.GetSeedVendorData()))
	if found == nil {
		t.Fatalf("no phone-home URL for %s in the seed:\n%s", id, plan.GetSeedVendorData())
	}
	token := found[1]
	guess := func() string {
		b := make([]byte, 32)
		rand.Read(b)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	for _, tc := range []struct {
		what, method, path string
		want               int
	}{
		{"a guessed token", http.MethodPost, "/phone-home/" + id + "/" + guess(), http.StatusForbidden},
		{"another guessed token", http.MethodPost, "/phone-home/" + id + "/" + guess(), http.StatusForbidden},
		{"an unknown deployment", http.MethodPost, "/phone-home/0123456789abcdef0123/" + token, http.StatusNotFound},
		{"a GET with the right token", http.MethodGet, "/phone-home/" + id + "/" + token, http.StatusMethodNotAllowed},
	} {
		code, body := httpDo(t, c.http, "127.0.9.2", tc.method, tc.path)
		if code != tc.want {
			t.Errorf("%s: %d, want %d", tc.what, code, tc.want)
		}
		if strings.Contains(body, id) || strings.Contains(body, "token") {
			t.Errorf("%s: the refusal says more than its status: %q", tc.what, body)
		}
	}
	if got := c.machine(name); got.GetState() != inventoryv1.Machine_DEPLOYING {
		t.Fatalf("after guessed tokens the machine is %v (%s)", got.GetState(), got.GetStateReason())
	}
	e := c.waitEntry(mac, "phone-home-refused", "wrong token")
	if strings.Contains(e.String(), token) {
		t.Fatal("the token is on the timeline")
	}
	if strings.Contains(c.logs.String(), token) {
		t.Fatal("the token is in corrald's log")
	}
	// The plan's own token (no pinned address: DHCP is off) is accepted.
	if code, _ := httpDo(t, c.http, "127.0.9.2", http.MethodPost, "/phone-home/"+id+"/"+token); code != http.StatusOK {
		t.Fatalf("the plan's token: %d", code)
	}
	if got := c.machine(name); got.GetState() != inventoryv1.Machine_DEPLOYED || got.GetDeployment().GetBootedAt() == nil {
		t.Fatalf("after the phone-home: %v", got.GetState())
	}
}

// uploadRawImage uploads 2 MiB of random bytes as raw OS image name,
// waits until it is READY and returns the bytes.
func uploadRawImage(t *testing.T, c *credCorrald, name string) []byte {
	t.Helper()
	disk := make([]byte, 2<<20)
	rand.Read(disk)
	sum := sha256.Sum256(disk)
	cl := osimagev1.NewOSImageServiceClient(c.admin)
	st, err := cl.UploadOSImage(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&osimagev1.UploadOSImageRequest{Part: &osimagev1.UploadOSImageRequest_Header{Header: &osimagev1.UploadOSImageHeader{
		Name: name, Sha256: hex.EncodeToString(sum[:]), SizeBytes: uint64(len(disk)), Format: osimagev1.OSImageFormat_OS_IMAGE_FORMAT_RAW}}}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(disk); i += 256 << 10 {
		if err := st.Send(&osimagev1.UploadOSImageRequest{Part: &osimagev1.UploadOSImageRequest_Data{Data: disk[i : i+256<<10]}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp, err := cl.GetOSImage(context.Background(), &osimagev1.GetOSImageRequest{Name: name})
		if err == nil && resp.GetOsImage().GetState() == osimagev1.OSImageState_OS_IMAGE_STATE_READY {
			return disk
		}
		if time.Now().After(deadline) {
			t.Fatalf("OS image %s not READY: %v %v", name, resp.GetOsImage().GetState(), err)
		}
	}
}

// httpDo sends one request with an empty form body to addr from a
// loopback source address and returns the status and body.
func httpDo(t *testing.T, addr, from, method, path string) (int, string) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	cl := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext}}
	req, err := http.NewRequest(method, "http://"+addr+path, strings.NewReader("instance_id=x"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(b)
}
