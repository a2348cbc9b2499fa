package lifecycle

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/store/bolt"
	"github.com/google/go-cmp/cmp"
	"golang.org/x/crypto/ssh"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/testing/protocmp"
)

// fakeImages serves RawImages by name; a name in pending is not READY.
type fakeImages struct {
	images  map[string]RawImage
	pending map[string]bool
}

func (f *fakeImages) Raw(_ context.Context, name string) (RawImage, error) {
	if f.pending[name] {
		return RawImage{}, apierr.Preconditionf("OS image %q is DOWNLOADING, not READY", name)
	}
	img, ok := f.images[name]
	if !ok {
		return RawImage{}, apierr.NotFoundf("OS image %q", name)
	}
	return img, nil
}

// fakeAddresses pins every MAC to pinnedAddr and records the holders.
type fakeAddresses struct {
	mu     sync.Mutex
	pinned map[string]string // holder → mac
}

var pinnedAddr = netip.MustParsePrefix("10.0.0.77/24")

func (f *fakeAddresses) Pin(_ context.Context, mac, holder string) (netip.Prefix, netip.Addr, []netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pinned == nil {
		f.pinned = map[string]string{}
	}
	for h, m := range f.pinned {
		if m == mac && h != holder {
			return netip.Prefix{}, netip.Addr{}, nil, apierr.Preconditionf("dhcp: the lease of %s is pinned by %s", mac, h)
		}
	}
	f.pinned[holder] = mac
	return pinnedAddr, netip.MustParseAddr("10.0.0.1"), []netip.Addr{netip.MustParseAddr("10.0.0.2")}, nil
}

func (f *fakeAddresses) Unpin(_ context.Context, _, holder string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.pinned, holder)
	return nil
}

func (f *fakeAddresses) holders() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for h := range f.pinned {
		out = append(out, h)
	}
	return out
}

const testImageSum = "aaaa000000000000000000000000000000000000000000000000000000000001"

// deployHarness is a harness on a bolt store with deploy services and
// one machine, READY and allocated to owner.
type deployHarness struct {
	*harness
	addrs    *fakeAddresses
	images   *fakeImages
	a        *agent
	owner    inventory.Owner
	outcomes *outcomeLog
}

type outcomeLog struct {
	mu  sync.Mutex
	got []string
}

func (o *outcomeLog) add(s string) { o.mu.Lock(); o.got = append(o.got, s); o.mu.Unlock() }
func (o *outcomeLog) list() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.got...)
}

var owner = inventory.Owner{ID: "token:owner", Name: "ci"}

func newDeployHarness(t *testing.T, allocate bool) *deployHarness {
	t.Helper()
	st, err := bolt.Open(filepath.Join(t.TempDir(), "corral.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, st, harnessOpt{})
	t.Cleanup(func() { h.stop(); st.Close() })
	d := &deployHarness{harness: h, addrs: &fakeAddresses{}, owner: owner, outcomes: &outcomeLog{},
		images: &fakeImages{images: map[string]RawImage{"debian": {Name: "debian", SHA256: testImageSum, Size: 2 << 30,
			Map: []byte(`{"extents":[]}`), MapSHA256: "bbbb", Path: "/os-images/" + testImageSum + "/raw"}}, pending: map[string]bool{"later": true}}}
	h.lc.cfg.DeployOutcome = d.outcomes.add
	h.lc.SetDeploy(DeployServices{Images: d.images, Addresses: d.addrs, BootBase: func(host string) string {
		return "http://" + net.JoinHostPort(cmpOr(host, "10.0.0.1"), "8080")
	}})
	d.a = h.connect(mac1, facts("S1", "", mac1))
	ctx := context.Background()
	if _, err := h.inv.AcceptToPool(ctx, d.a.name); err != nil {
		t.Fatal(err)
	}
	if allocate {
		if _, err := h.inv.AllocateMachines(ctx, owner, inventory.AllocateRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// testKey is an authorized_keys line of a fresh ed25519 key.
func testKey(t *testing.T) string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sp, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp))) + " test@example"
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

var phoneHomeRE = regexp.MustCompile(`/phone-home/([0-9a-f]+)/([A-Za-z0-9_-]+)`)

// phoneHomeOf is the deployment id and token a plan's seed carries.
func phoneHomeOf(t *testing.T, p *nodev1.DeployPlan) (id, token string) {
	t.Helper()
	m := phoneHomeRE.FindStringSubmatch(string(p.GetSeedVendorData()) + string(p.GetSeedUserData()))
	if m == nil {
		t.Fatalf("no phone-home URL in the seed: %q", p.GetSeedVendorData())
	}
	return m[1], m[2]
}

// phoneHome posts to the handler from src.
func (d *deployHarness) phoneHome(src, id, token string) int {
	r := httptest.NewRequest(http.MethodPost, PhoneHomePath+id+"/"+token, strings.NewReader("instance_id=x&hostname=y"))
	r.RemoteAddr = net.JoinHostPort(src, "40000")
	w := httptest.NewRecorder()
	d.lc.PhoneHome().ServeHTTP(w, r)
	return w.Code
}

func (d *deployHarness) deploy(by inventory.Owner, req *inventoryv1.DeployMachineRequest) (*inventoryv1.Machine, error) {
	if req.Name == "" {
		req.Name = d.a.name
	}
	return d.lc.Deploy(context.Background(), by, req)
}

func TestDeployByOwnerToDeployed(t *testing.T) {
	d := newDeployHarness(t, true)
	enrollBMC(t, d.harness, d.a.name)
	m, err := d.deploy(d.owner, &inventoryv1.DeployMachineRequest{OsImage: "debian", UserData: []byte("#cloud-config\npassword: secret\n"),
		SshKeys: []string{testKey(t)}})
	if err != nil {
		t.Fatal(err)
	}
	dep := m.GetDeployment()
	if m.GetState() != inventoryv1.Machine_DEPLOYING || dep.GetDeploymentId() == "" || dep.GetHostname() != d.a.name ||
		dep.GetAddress() != pinnedAddr.String() || dep.GetDisk() != "/dev/vda" || dep.GetUserDataSha256() == "" || dep.GetRequestedBy() != owner.ID {
		t.Fatalf("deploying: %v %v", m.GetState(), dep)
	}
	if m.GetBootIntent() != inventoryv1.BootIntent_BOOT_INTENT_DISCOVER {
		t.Fatalf("boot intent %v", m.GetBootIntent())
	}
	if got := d.addrs.holders(); len(got) != 1 || got[0] != "deployment:"+dep.GetDeploymentId() {
		t.Fatalf("pins %v", got)
	}
	plan := d.a.next().GetDeploy()
	if plan == nil {
		t.Fatal("no deploy plan")
	}
	id, token := phoneHomeOf(t, plan)
	want := &nodev1.DeployPlan{DeploymentId: dep.GetDeploymentId(), ImageUrl: "http://10.0.0.1:8080/os-images/" + testImageSum + "/raw",
		ImageSize: 2 << 30, ImageSha256: testImageSum, BlockMap: []byte(`{"extents":[]}`), BlockMapSha256: "bbbb", Layout: dep.GetLayout()}
	// With a BMC the appliance power-cycles the machine once written:
	// the plan leaves the reboot to it (Reboot false).
	if diff := cmp.Diff(want, plan, protocmp.Transform(), protocmp.IgnoreFields(&nodev1.DeployPlan{}, "seed_meta_data", "seed_user_data", "seed_vendor_data", "seed_network_config")); diff != "" {
		t.Fatalf("plan (-want +got):\n%s", diff)
	}
	if id != dep.GetDeploymentId() {
		t.Fatalf("phone-home id %q", id)
	}
	m = d.machine(d.a.name)
	if m.GetDeployment().GetPhoneHomeSha256() != tokenSum(token) || m.GetDeployment().GetSentAt() == nil {
		t.Fatalf("phone-home hash %q sent %v", m.GetDeployment().GetPhoneHomeSha256(), m.GetDeployment().GetSentAt())
	}
	if strings.Contains(m.String(), token) {
		t.Fatal("the token itself is in the record")
	}
	// Progress, then written: boot intent local and the BMC's next boot
	// the disk, persistently.
	d.a.progress(id, "image", false, "")
	d.eventually(d.a.name, "at image", func(m *inventoryv1.Machine) bool { return m.GetDeployment().GetStep() == "image" })
	d.a.progress("other", "image", false, "boom") // another id: ignored
	d.a.progress(id, "written", true, "")
	m = d.eventually(d.a.name, "written", func(m *inventoryv1.Machine) bool { return m.GetDeployment().GetWrittenAt() != nil })
	if m.GetBootIntent() != inventoryv1.BootIntent_BOOT_INTENT_LOCAL || m.GetState() != inventoryv1.Machine_DEPLOYING {
		t.Fatalf("written: %v %v", m.GetBootIntent(), m.GetState())
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		boots, powers := d.bmc.log()
		if len(boots) > 0 && len(powers) > 0 {
			if b := boots[len(boots)-1]; b.Device != inventoryv1.BootDevice_BOOT_DEVICE_DISK || !b.Persistent {
				t.Fatalf("BMC boot %+v", b)
			}
			if p := powers[len(powers)-1]; p != inventoryv1.PowerAction_POWER_ACTION_CYCLE {
				t.Fatalf("BMC power %v, want a cycle into the disk", p)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no BMC boot device set")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Refused phone-homes leave it DEPLOYING.
	addr := pinnedAddr.Addr().String()
	for name, tc := range map[string]struct {
		src, id, token string
		want           int
	}{
		"wrong token":       {addr, id, strings.Repeat("A", 43), http.StatusForbidden},
		"another address":   {"10.0.0.99", id, token, http.StatusForbidden},
		"unknown id":        {addr, "0123456789abcdef0123", token, http.StatusNotFound},
		"malformed id":      {"10.0.0.98", "../../x", token, http.StatusNotFound},
		"token too short":   {"10.0.0.98", id, "abc", http.StatusNotFound},
		"token with a dot.": {"10.0.0.98", id, strings.Repeat("A", 40) + ".", http.StatusNotFound},
	} {
		if got := d.phoneHome(tc.src, tc.id, tc.token); got != tc.want {
			t.Errorf("%s: status %d, want %d", name, got, tc.want)
		}
	}
	if m := d.machine(d.a.name); m.GetState() != inventoryv1.Machine_DEPLOYING {
		t.Fatalf("after refusals: %v %q", m.GetState(), m.GetStateReason())
	}
	if got := d.phoneHome(addr, id, token); got != http.StatusOK {
		t.Fatalf("phone-home: %d", got)
	}
	m = d.machine(d.a.name)
	if m.GetState() != inventoryv1.Machine_DEPLOYED || m.GetDeployment().GetBootedAt() == nil {
		t.Fatalf("after phone-home: %v %v", m.GetState(), m.GetDeployment())
	}
	// Once DEPLOYED, the same phone-home is refused.
	if got := d.phoneHome(addr, id, token); got != http.StatusConflict {
		t.Fatalf("second phone-home: %d", got)
	}
	if got, want := d.outcomes.list(), []string{DeployStarted, DeployDeployed}; !cmp.Equal(got, want) {
		t.Fatalf("outcomes %v, want %v", got, want)
	}
	// A deploy again (the machine is its owner's): a new deployment; the
	// old one's phone-home is refused and the address stays pinned, by
	// the new deployment only.
	m2, err := d.deploy(d.owner, &inventoryv1.DeployMachineRequest{OsImage: "debian"})
	if err != nil {
		t.Fatal(err)
	}
	id2 := m2.GetDeployment().GetDeploymentId()
	if id2 == id || m2.GetState() != inventoryv1.Machine_DEPLOYING {
		t.Fatalf("redeploy: %v %v", m2.GetState(), id2)
	}
	if got := d.addrs.holders(); len(got) != 1 || got[0] != "deployment:"+id2 {
		t.Fatalf("pins after redeploy %v", got)
	}
	_, token2 := phoneHomeOf(t, d.a.next().GetDeploy())
	if got := d.phoneHome(addr, id, token); got != http.StatusNotFound {
		t.Fatalf("old deployment's phone-home: %d", got)
	}
	if got := d.phoneHome(addr, id2, token2); got != http.StatusOK {
		t.Fatalf("new deployment's phone-home: %d", got)
	}
	entries := macEntries(d.harness, mac1, "phone-home-refused")
	if len(entries) == 0 {
		t.Fatal("no phone-home refusal on the timeline")
	}
	for _, e := range entries {
		if strings.Contains(e.String(), token) {
			t.Fatal("a token on the timeline")
		}
	}
}

func TestDeployPermissionsAndRefusals(t *testing.T) {
	d := newDeployHarness(t, true)
	ctx := context.Background()
	before := d.machine(d.a.name)
	other := inventory.Owner{ID: "token:other"}
	operator := inventory.Owner{ID: "token:op", Operator: true}
	threeDisks := "disks:\n- {name: a, device: auto}\n- {name: b, device: auto}\n- {name: c, device: auto}\n" +
		"raids: [{name: md0, level: raid1, devices: [a, b, c], filesystem: ext4, mount: /}]\nimage: md0\n"
	for name, tc := range map[string]struct {
		by   inventory.Owner
		req  *inventoryv1.DeployMachineRequest
		want codes.Code
		text string
	}{
		"another user":       {other, &inventoryv1.DeployMachineRequest{OsImage: "debian"}, codes.PermissionDenied, "not allocated to you"},
		"unknown machine":    {operator, &inventoryv1.DeployMachineRequest{Name: "nope", OsImage: "debian"}, codes.NotFound, ""},
		"unknown image":      {owner, &inventoryv1.DeployMachineRequest{OsImage: "nope"}, codes.NotFound, "nope"},
		"image not READY":    {owner, &inventoryv1.DeployMachineRequest{OsImage: "later"}, codes.FailedPrecondition, "not READY"},
		"no image":           {owner, &inventoryv1.DeployMachineRequest{}, codes.InvalidArgument, "--image"},
		"user data too big":  {owner, &inventoryv1.DeployMachineRequest{OsImage: "debian", UserData: make([]byte, MaxUserData+1)}, codes.InvalidArgument, "user data"},
		"more disks":         {owner, &inventoryv1.DeployMachineRequest{OsImage: "debian", Layout: threeDisks}, codes.FailedPrecondition, "names 3 disks, the machine has 2"},
		"bad layout":         {owner, &inventoryv1.DeployMachineRequest{OsImage: "debian", Layout: "disks: [{nme: x}]"}, codes.InvalidArgument, "layout"},
		"bad hostname":       {owner, &inventoryv1.DeployMachineRequest{OsImage: "debian", Hostname: "a_b"}, codes.InvalidArgument, "hostname"},
		"two-line key":       {owner, &inventoryv1.DeployMachineRequest{OsImage: "debian", SshKeys: []string{"ssh-ed25519 A\nssh-rsa B"}}, codes.InvalidArgument, "one line"},
		"key with a control": {owner, &inventoryv1.DeployMachineRequest{OsImage: "debian", SshKeys: []string{"ssh-ed25519 A\x1b[2J"}}, codes.InvalidArgument, "printable"},
		"not a key":          {owner, &inventoryv1.DeployMachineRequest{OsImage: "debian", SshKeys: []string{"ssh-ed25519 AAAA x@y"}}, codes.InvalidArgument, "not an authorized_keys line"},
		"user data not YAML": {owner, &inventoryv1.DeployMachineRequest{OsImage: "debian", UserData: []byte("#cloud-config\n: [\n")}, codes.InvalidArgument, "not YAML"},
	} {
		_, err := d.deploy(tc.by, tc.req)
		if code(err) != tc.want || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("%s: %v, want %v containing %q", name, err, tc.want, tc.text)
		}
	}
	after := d.machine(d.a.name)
	if diff := cmp.Diff(before, after, protocmp.Transform()); diff != "" {
		t.Fatalf("refused deploys changed the machine (-before +after):\n%s", diff)
	}
	if got := d.addrs.holders(); len(got) != 0 {
		t.Fatalf("refused deploys left pins %v", got)
	}
	d.a.none()
	// An operator deploys another owner's machine.
	m, err := d.deploy(operator, &inventoryv1.DeployMachineRequest{OsImage: "debian", Hostname: "web-1.example"})
	if err != nil || m.GetState() != inventoryv1.Machine_DEPLOYING || m.GetDeployment().GetHostname() != "web-1.example" {
		t.Fatalf("operator deploy: %v %v", m.GetState(), err)
	}
	if d.a.next().GetDeploy() == nil {
		t.Fatal("no plan")
	}
	// Deploying twice at once is refused.
	if _, err := d.deploy(owner, &inventoryv1.DeployMachineRequest{OsImage: "debian"}); code(err) != codes.FailedPrecondition {
		t.Fatalf("second deploy: %v", err)
	}
	_ = ctx
}

func TestDeployRefusedUnallocated(t *testing.T) {
	d := newDeployHarness(t, false)
	operator := inventory.Owner{ID: "token:op", Operator: true}
	_, err := d.deploy(operator, &inventoryv1.DeployMachineRequest{OsImage: "debian"})
	if code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "READY, not allocated") {
		t.Fatalf("READY machine: %v", err)
	}
	// Nobody holds it: a user is told it is not theirs.
	if _, err := d.deploy(owner, &inventoryv1.DeployMachineRequest{OsImage: "debian"}); code(err) != codes.PermissionDenied {
		t.Fatalf("user, unallocated: %v", err)
	}
}

func TestDeployPlanSentOnConnect(t *testing.T) {
	d := newDeployHarness(t, true)
	d.a.close()
	d.eventually(d.a.name, "disconnected", func(*inventoryv1.Machine) bool { return !d.lc.sess.connected(d.a.name) })
	m, err := d.deploy(owner, &inventoryv1.DeployMachineRequest{OsImage: "debian"})
	if err != nil {
		t.Fatal(err)
	}
	if m.GetDeployment().GetSentAt() != nil || len(macEntries(d.harness, mac1, "waiting")) == 0 {
		t.Fatalf("no agent: sent %v", m.GetDeployment().GetSentAt())
	}
	a := d.connect(mac1, facts("S1", "", mac1))
	plan := a.next().GetDeploy()
	if plan.GetDeploymentId() != m.GetDeployment().GetDeploymentId() {
		t.Fatalf("plan on connect: %v", plan)
	}
	_, token := phoneHomeOf(t, plan)
	// Reconnecting gets a new plan whose token replaces the first one's.
	a.close()
	d.eventually(d.a.name, "disconnected", func(*inventoryv1.Machine) bool { return !d.lc.sess.connected(d.a.name) })
	a = d.connect(mac1, facts("S1", "", mac1))
	_, token2 := phoneHomeOf(t, a.next().GetDeploy())
	if token2 == token || d.machine(d.a.name).GetDeployment().GetPhoneHomeSha256() != tokenSum(token2) {
		t.Fatal("the re-sent plan kept the old token")
	}
	if got := d.phoneHome(pinnedAddr.Addr().String(), plan.GetDeploymentId(), token); got != http.StatusForbidden {
		t.Fatalf("first plan's token: %d", got)
	}
}

func TestDeployWithBMCPowerCycles(t *testing.T) {
	d := newDeployHarness(t, true)
	d.a.close()
	d.eventually(d.a.name, "disconnected", func(*inventoryv1.Machine) bool { return !d.lc.sess.connected(d.a.name) })
	enrollBMC(t, d.harness, d.a.name)
	if _, err := d.deploy(owner, &inventoryv1.DeployMachineRequest{OsImage: "debian"}); err != nil {
		t.Fatal(err)
	}
	boots, actions := d.bmc.log()
	if len(boots) != 1 || boots[0].Device != inventoryv1.BootDevice_BOOT_DEVICE_PXE || len(actions) != 1 || actions[0] != inventoryv1.PowerAction_POWER_ACTION_CYCLE {
		t.Fatalf("BMC: %v %v", boots, actions)
	}
	if d.machine(d.a.name).GetWatchdog().GetArmedAt() == nil {
		t.Fatal("boot watchdog not armed")
	}
}

func TestDeployStepErrorFails(t *testing.T) {
	d := newDeployHarness(t, true)
	m, err := d.deploy(owner, &inventoryv1.DeployMachineRequest{OsImage: "debian"})
	if err != nil {
		t.Fatal(err)
	}
	id := m.GetDeployment().GetDeploymentId()
	d.a.next()
	d.a.progress(id, "image", false, "")
	d.a.progress(id, "", true, "extent 3: sha256 mismatch")
	m = d.eventually(d.a.name, "FAILED", func(m *inventoryv1.Machine) bool { return m.GetState() == inventoryv1.Machine_FAILED })
	if m.GetStateReason() != "deploy image: extent 3: sha256 mismatch" {
		t.Fatalf("reason %q", m.GetStateReason())
	}
	// The machine stays its owner's, its address pinned: it may deploy again.
	if !owner.Holds(m) || len(d.addrs.holders()) != 1 {
		t.Fatalf("after failure: holds %v pins %v", owner.Holds(m), d.addrs.holders())
	}
	m, err = d.deploy(owner, &inventoryv1.DeployMachineRequest{OsImage: "debian"})
	if err != nil {
		t.Fatalf("deploy again: %v", err)
	}
	// Release drops the pin.
	if err := d.lc.UnpinDeployment(context.Background(), m); err != nil || len(d.addrs.holders()) != 0 {
		t.Fatalf("unpin: %v, pins left %v", err, d.addrs.holders())
	}
}

func TestDeployTimeouts(t *testing.T) {
	d := newDeployHarness(t, true)
	m, err := d.deploy(owner, &inventoryv1.DeployMachineRequest{OsImage: "debian"})
	if err != nil {
		t.Fatal(err)
	}
	id := m.GetDeployment().GetDeploymentId()
	d.a.next()
	d.a.progress(id, "image", false, "")
	d.eventually(d.a.name, "at image", func(m *inventoryv1.Machine) bool { return m.GetDeployment().GetStep() == "image" })
	d.clk.Advance(DefaultDeployTimeout - time.Second)
	d.reconcile()
	if m := d.machine(d.a.name); m.GetState() != inventoryv1.Machine_DEPLOYING {
		t.Fatalf("before the timeout: %v %q", m.GetState(), m.GetStateReason())
	}
	d.clk.Advance(2 * time.Second)
	d.reconcile()
	m = d.machine(d.a.name)
	if m.GetState() != inventoryv1.Machine_FAILED || m.GetStateReason() != "deploy timeout: no progress within 30m0s after step image" {
		t.Fatalf("deploy timeout: %v %q", m.GetState(), m.GetStateReason())
	}
	// The boot timeout: written, no phone-home.
	m, err = d.deploy(owner, &inventoryv1.DeployMachineRequest{OsImage: "debian"})
	if err != nil {
		t.Fatal(err)
	}
	id = m.GetDeployment().GetDeploymentId()
	d.a.next()
	d.a.progress(id, "written", true, "")
	d.eventually(d.a.name, "written", func(m *inventoryv1.Machine) bool { return m.GetDeployment().GetWrittenAt() != nil })
	written := d.clk.Now()
	d.clk.Advance(DefaultDeployTimeout) // the write timeout no longer applies
	d.reconcile()
	if m := d.machine(d.a.name); m.GetState() != inventoryv1.Machine_FAILED || !strings.HasPrefix(m.GetStateReason(), "deploy boot timeout") {
		t.Fatalf("boot timeout: %v %q", m.GetState(), m.GetStateReason())
	}
	want := "deploy boot timeout: written at " + written.UTC().Format(time.RFC3339) + ", the OS did not phone home within 15m0s"
	if got := d.machine(d.a.name).GetStateReason(); got != want {
		t.Fatalf("reason %q, want %q", got, want)
	}
	if got := d.outcomes.list(); !cmp.Equal(got, []string{DeployStarted, DeployTimedOut, DeployStarted, DeployTimedOut}) {
		t.Fatalf("outcomes %v", got)
	}
}

// TestUserDataNeverAnswered reads a deployed machine through the
// MachineService as a client does: no user data in GetMachine, ListMachines
// or WatchMachines, its hash there.
func TestUserDataNeverAnswered(t *testing.T) {
	d := newDeployHarness(t, true)
	secret := []byte("#cloud-config\nchpasswd: {list: 'root:hunter2'}\n")
	if _, err := d.deploy(owner, &inventoryv1.DeployMachineRequest{OsImage: "debian", UserData: secret}); err != nil {
		t.Fatal(err)
	}
	if got := d.machine(d.a.name).GetDeployment().GetUserData(); string(got) != string(secret) {
		t.Fatal("user data not kept in the record for resends")
	}
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer()
	inventory.Register(gs, &inventory.MachineServer{Inv: d.inv, Lifecycle: d.lc})
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	cc, err := grpc.NewClient("passthrough:///bufnet", grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	c := inventoryv1.NewMachineServiceClient(cc)
	ctx := context.Background()
	check := func(where string, m *inventoryv1.Machine) {
		t.Helper()
		if len(m.GetDeployment().GetUserData()) != 0 || strings.Contains(m.String(), "hunter2") {
			t.Fatalf("%s: user data in the answer", where)
		}
		if m.GetDeployment().GetUserDataSha256() == "" {
			t.Fatalf("%s: no user data hash", where)
		}
	}
	m, err := c.GetMachine(ctx, &inventoryv1.GetMachineRequest{Name: d.a.name})
	if err != nil {
		t.Fatal(err)
	}
	check("GetMachine", m)
	for _, view := range []inventoryv1.MachineView{inventoryv1.MachineView_MACHINE_VIEW_UNSPECIFIED, inventoryv1.MachineView_MACHINE_VIEW_SUMMARY} {
		res, err := c.ListMachines(ctx, &inventoryv1.ListMachinesRequest{View: view})
		if err != nil || len(res.GetMachines()) != 1 {
			t.Fatalf("list: %v %v", res, err)
		}
		check("ListMachines", res.GetMachines()[0])
	}
	m, err = c.DeployMachine(ctx, &inventoryv1.DeployMachineRequest{Name: d.a.name, OsImage: "debian", UserData: secret})
	if code(err) != codes.FailedPrecondition { // DEPLOYING already
		t.Fatalf("deploy again: %v %v", m, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	w, err := c.WatchMachines(wctx, &inventoryv1.WatchMachinesRequest{Name: d.a.name})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := w.Recv()
	if err != nil {
		t.Fatal(err)
	}
	check("WatchMachines", ev.GetMachine())
	// And the answer of a deploy itself.
	if _, err := d.inv.UpdateMachine(ctx, d.a.name, func(m *inventoryv1.Machine) error {
		return inventory.Transition(m, inventory.EventDeployFailed)
	}); err != nil {
		t.Fatal(err)
	}
	m, err = c.DeployMachine(ctx, &inventoryv1.DeployMachineRequest{Name: d.a.name, OsImage: "debian", UserData: secret})
	if err != nil {
		t.Fatal(err)
	}
	check("DeployMachine", m)
	if st := status.Code(err); st != codes.OK {
		t.Fatal(st)
	}
}

// FuzzPhoneHome sends arbitrary paths and bodies to the phone-home
// handler of a DEPLOYING machine: none panics, none answers 2xx, and the
// machine stays DEPLOYING.
func FuzzPhoneHome(f *testing.F) {
	f.Add("/phone-home/0123456789abcdef0123/"+strings.Repeat("A", 43), "10.0.0.77", []byte("instance_id=x"))
	f.Add("/phone-home/../../etc", "10.0.0.78", []byte{})
	f.Add("/phone-home//", "::ffff:10.0.0.77", []byte(strings.Repeat("x", 100)))
	f.Add("/phone-home/%00/%1b", "[::1]", []byte{0xff})
	f.Fuzz(func(t *testing.T, path, src string, body []byte) {
		// A harness each: one outlives no input (its cleanup is the
		// input's).
		d := newDeployHarness(t, true)
		m, err := d.deploy(owner, &inventoryv1.DeployMachineRequest{OsImage: "debian"})
		if err != nil {
			t.Fatal(err)
		}
		id := m.GetDeployment().GetDeploymentId()
		d.a.next()
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(string(body)))
		r.URL.Path = path
		r.RemoteAddr = net.JoinHostPort(src, "1")
		w := httptest.NewRecorder()
		d.lc.PhoneHome().ServeHTTP(w, r)
		if w.Code < 400 || w.Code > 499 {
			t.Fatalf("%q from %q: status %d", path, src, w.Code)
		}
		if m := d.machine(d.a.name); m.GetState() != inventoryv1.Machine_DEPLOYING || m.GetDeployment().GetDeploymentId() != id {
			t.Fatalf("%q: machine %v", path, m.GetState())
		}
	})
}

// TestDeployPlanSentOncePerSession: Deploy's own send and a reconciler
// holding the machine as it was before (plan not yet sent) do not both
// send: a second plan would carry a new token and void the first's.
func TestDeployPlanSentOncePerSession(t *testing.T) {
	d := newDeployHarness(t, true)
	d.a.close()
	d.eventually(d.a.name, "disconnected", func(*inventoryv1.Machine) bool { return !d.lc.sess.connected(d.a.name) })
	m, err := d.deploy(owner, &inventoryv1.DeployMachineRequest{OsImage: "debian"})
	if err != nil {
		t.Fatal(err)
	}
	a := d.connect(mac1, facts("S1", "", mac1))
	_, token := phoneHomeOf(t, a.next().GetDeploy())
	// m is the record from before the plan went: sending it again is
	// refused by the compare-and-swap.
	if sm := d.lc.sendDeploy(context.Background(), m); sm != nil {
		t.Fatal("a stale view sent the plan again")
	}
	a.none()
	if got := d.machine(d.a.name).GetDeployment().GetPhoneHomeSha256(); got != tokenSum(token) {
		t.Fatal("the token changed")
	}
}
