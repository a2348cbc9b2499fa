package http

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corralhq/corral/agent/cmdline"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/images"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite golden files")

type fakeInv struct {
	mu       sync.Mutex
	machines map[string]*inventoryv1.Machine // by MAC
	// ensureErr, when set, is what EnsureMachineForMAC returns.
	ensureErr error
}

func (f *fakeInv) BootIntent(_ context.Context, mac string) (string, inventoryv1.BootIntent, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.machines[mac]
	if !ok {
		return "", inventoryv1.BootIntent_BOOT_INTENT_DISCOVER, nil
	}
	return m.GetName(), m.GetBootIntent(), nil
}

func (f *fakeInv) EnsureMachineForMAC(_ context.Context, mac string) (*inventoryv1.Machine, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m, ok := f.machines[mac]; ok {
		return m, false, nil
	}
	if f.ensureErr != nil {
		return nil, false, f.ensureErr
	}
	m := &inventoryv1.Machine{Name: "m-" + strings.ReplaceAll(mac, ":", ""), BootIntent: inventoryv1.BootIntent_BOOT_INTENT_DISCOVER}
	f.machines[mac] = m
	return m, true, nil
}

type fakeTokens struct {
	mu     sync.Mutex
	issued []string // "mac machine"
	fail   bool
}

func (f *fakeTokens) IssueBoot(_ context.Context, mac, machine string, ttl time.Duration) (string, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail {
		return "", false, errors.New("store down")
	}
	f.issued = append(f.issued, mac+" "+machine)
	return "crl_0123456789abcdef_secretsecretsecretsecretsecretsecretsecretsecretsecre", len(f.issued) == 1, nil
}

type recorder struct {
	mu     sync.Mutex
	events []string
	full   []event
}

type event struct {
	mac, event, detail string
	attrs              map[string]string
}

func (r *recorder) Event(mac, source, ev, detail string, attrs map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, fmt.Sprintf("%s %s %s file=%s bytes=%s status=%s", mac, source, ev, attrs["file"], attrs["bytes"], attrs["status"]))
	r.full = append(r.full, event{mac, ev, detail, attrs})
}

// detail is the last ev event's detail for mac.
func (r *recorder) detail(mac, ev string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.full) - 1; i >= 0; i-- {
		if e := r.full[i]; e.mac == mac && e.event == ev {
			return e.detail
		}
	}
	return ""
}

// attr is the last ev event's attribute k for mac.
func (r *recorder) attr(mac, ev, k string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.full) - 1; i >= 0; i-- {
		if e := r.full[i]; e.mac == mac && e.event == ev {
			return e.attrs[k]
		}
	}
	return ""
}

func (r *recorder) all() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.events, "\n")
}

type fixture struct {
	srv    *httptest.Server
	inv    *fakeInv
	tokens *fakeTokens
	rec    *recorder
	initrd []byte
	s      *Server
}

// noHypervisorImage names the tests whose catalog lacks the hypervisor
// image.
var noHypervisorImage = map[string]bool{"TestHypervisorWithoutImage": true}

func newFixture(t *testing.T, mutate func(*Config)) *fixture {
	t.Helper()
	src := t.TempDir()
	for _, n := range []string{images.UndionlyKPXE, images.IPXEEFI, "ipxe.lkrn"} {
		os.WriteFile(filepath.Join(src, n), []byte("bin "+n), 0o644)
	}
	initrd := bytes.Repeat([]byte("initramfs!"), 100000)
	ipath := filepath.Join(src, "initrd")
	os.WriteFile(ipath, initrd, 0o644)
	hpath := filepath.Join(src, "hypervisor-initrd")
	os.WriteFile(hpath, []byte("hypervisor initramfs"), 0o644)
	icfg := images.Config{Dir: t.TempDir(), IPXEDirs: []string{src}, Initrd: ipath, HypervisorInitrd: hpath}
	if noHypervisorImage[t.Name()] {
		icfg.HypervisorInitrd = ""
	}
	cat, err := images.Open(icfg)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{inv: &fakeInv{machines: map[string]*inventoryv1.Machine{
		"52:54:00:00:00:01": {Name: "m-525400000001", BootIntent: inventoryv1.BootIntent_BOOT_INTENT_DISCOVER},
		"52:54:00:00:00:02": {Name: "rack1-u7", BootIntent: inventoryv1.BootIntent_BOOT_INTENT_LOCAL},
		"52:54:00:00:00:03": {Name: "hv3", BootIntent: inventoryv1.BootIntent_BOOT_INTENT_HYPERVISOR},
	}}, tokens: &fakeTokens{}, rec: &recorder{}, initrd: initrd}
	cfg := Config{Listen: "127.0.0.1:0", Catalog: cat, Inventory: f.inv, Tokens: f.tokens, Timeline: f.rec,
		APIEndpoint: ":20180", CAFingerprint: strings.Repeat("ab", 32)}
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.lis.Close()
	f.s = s
	f.srv = httptest.NewUnstartedServer(s)
	f.srv.Start()
	t.Cleanup(f.srv.Close)
	return f
}

// answer is what get keeps of a response whose body it has read and closed.
type answer struct {
	StatusCode int
	Header     http.Header
}

func get(t *testing.T, url string, hdr map[string]string) (answer, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Host = "10.0.0.1:8080"
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{StatusCode: resp.StatusCode, Header: resp.Header}, b
}

func TestScriptsGolden(t *testing.T) {
	f := newFixture(t, nil)
	for name, mac := range map[string]string{
		"discover":   "52-54-00-00-00-01", // any MAC notation
		"local":      "52:54:00:00:00:02",
		"hypervisor": "52:54:00:00:00:03",
	} {
		t.Run(name, func(t *testing.T) {
			resp, body := get(t, f.srv.URL+"/boot.ipxe?mac="+mac, nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			checkGolden(t, filepath.Join("testdata", name+".ipxe"), body)
		})
	}
	if diff := cmp.Diff([]string{"52:54:00:00:00:01 m-525400000001"}, f.tokens.issued); diff != "" {
		t.Errorf("boot tokens issued (-want +got), one for discover (not local, not hypervisor):\n%s", diff)
	}
	if got := f.rec.all(); strings.Count(got, " http script ") != 3 {
		t.Errorf("timeline:\n%s", got)
	}
}

func TestCmdlineLimit(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.KernelArgs = strings.Repeat("x", 2100) })
	resp, body := get(t, f.srv.URL+"/boot.ipxe?mac=52:54:00:00:00:01", nil)
	if resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(body), "limit 2048") {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
}

func TestRefusals(t *testing.T) {
	f := newFixture(t, nil)
	for name, tc := range map[string]struct {
		path   string
		status int
		want   string
	}{
		"unknown mac":      {"/boot.ipxe?mac=52:54:00:99:99:99", 404, "unknown MAC 52:54:00:99:99:99"},
		"malformed mac":    {"/boot.ipxe?mac=zz", 400, "not a 6-byte MAC"},
		"missing mac":      {"/boot.ipxe", 400, "mac query parameter is required"},
		"unknown path":     {"/etc/passwd", 404, "no such path"},
		"traversal":        {"/images/../pki/ca.key", 404, ""},
		"encoded dotdot":   {"/images/..%2fpki%2fca.key", 404, "not in the image catalog"},
		"unknown image":    {"/images/nope.img", 404, "not in the image catalog"},
		"directory":        {"/images/", 404, "not in the image catalog"},
		"bad artifact mac": {"/images/vmlinuz?mac=1", 400, "not a 6-byte MAC"},
	} {
		t.Run(name, func(t *testing.T) {
			resp, body := get(t, f.srv.URL+tc.path, nil)
			if resp.StatusCode != tc.status || !strings.Contains(string(body), tc.want) {
				t.Fatalf("GET %s = %d %q, want %d containing %q", tc.path, resp.StatusCode, body, tc.status, tc.want)
			}
		})
	}
	if !strings.Contains(f.rec.all(), "52:54:00:99:99:99 http http-refused") {
		t.Errorf("refusal of a well-formed MAC not on its timeline:\n%s", f.rec.all())
	}
	f.tokens.fail = true
	resp, _ := get(t, f.srv.URL+"/boot.ipxe?mac=52:54:00:00:00:01", nil)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("token store down: status %d, want 503", resp.StatusCode)
	}
}

func TestCreateUnknown(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.CreateUnknown = true })
	resp, body := get(t, f.srv.URL+"/boot.ipxe?mac=52:54:00:99:99:99", nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "m-525400999999") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
}

// TestCreateUnknownCapReached: past the discovered-machine cap an unknown
// MAC's script is refused with the reason, and nothing goes on a timeline
// (a flood of spoofed MACs must not grow one per MAC).
func TestCreateUnknownCapReached(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.CreateUnknown = true })
	f.inv.mu.Lock()
	f.inv.ensureErr = apierr.New(apierr.ErrExhausted, "inventory: too many discovered machines")
	f.inv.mu.Unlock()
	resp, body := get(t, f.srv.URL+"/boot.ipxe?mac=52:54:00:99:99:98", nil)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "--max-discovered") {
		t.Fatalf("%d %s, want 503 naming --max-discovered", resp.StatusCode, body)
	}
	if tl := f.rec.all(); strings.Contains(tl, "52:54:00:99:99:98") {
		t.Errorf("timeline has the refused MAC:\n%s", tl)
	}
}

func TestArtifactsRangeAndTimeline(t *testing.T) {
	f := newFixture(t, nil)
	resp, body := get(t, f.srv.URL+"/images/initrd.img?mac=52:54:00:00:00:01", nil)
	if resp.StatusCode != http.StatusOK || !bytes.Equal(body, f.initrd) {
		t.Fatalf("full GET: %d, %d bytes", resp.StatusCode, len(body))
	}
	if resp.Header.Get("Accept-Ranges") != "bytes" || resp.Header.Get("ETag") == "" {
		t.Errorf("headers: %v", resp.Header)
	}
	resp, body = get(t, f.srv.URL+"/images/initrd.img?mac=52:54:00:00:00:01", map[string]string{"Range": "bytes=10-19"})
	if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(body, f.initrd[10:20]) {
		t.Fatalf("range GET: %d %q", resp.StatusCode, body)
	}
	resp, _ = get(t, f.srv.URL+"/images/initrd.img", map[string]string{"Range": "bytes=99999999-"})
	if resp.StatusCode != http.StatusRequestedRangeNotSatisfiable {
		t.Errorf("bad range: %d", resp.StatusCode)
	}
	tl := f.rec.all()
	for _, want := range []string{
		fmt.Sprintf("52:54:00:00:00:01 http artifact file=initrd.img bytes=%d status=200", len(f.initrd)),
		"52:54:00:00:00:01 http artifact file=initrd.img bytes=10 status=206",
	} {
		if !strings.Contains(tl, want) {
			t.Errorf("timeline lacks %q:\n%s", want, tl)
		}
	}
	req, _ := http.NewRequest(http.MethodPut, f.srv.URL+"/images/initrd.img", strings.NewReader("x"))
	r2, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r2.Body.Close()
	if r2.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("PUT: %d", r2.StatusCode)
	}
}

// TestHypervisorScript: the hypervisor intent boots the discovery kernel
// with the hypervisor initramfs and the same agent/cmdline parameters as
// discover plus corral.mode=hypervisor, but no token (NoToken: the
// hypervisor boot never uses one); the script and both downloads are on
// the machine's timeline under their names.
func TestHypervisorScript(t *testing.T) {
	f := newFixture(t, nil)
	resp, body := get(t, f.srv.URL+"/boot.ipxe?mac=52:54:00:00:00:03", nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var kernelLine string
	for _, l := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(l, "kernel ") {
			kernelLine = l
		}
	}
	if !strings.Contains(kernelLine, "/images/"+images.DiscoverKernel+"?mac=52:54:00:00:00:03 initrd="+images.HypervisorInitrd+" ") {
		t.Errorf("kernel line: %q", kernelLine)
	}
	p, err := cmdline.Parse(kernelLine)
	if err != nil {
		t.Fatal(err)
	}
	want := cmdline.Params{Endpoints: []string{"10.0.0.1:20180"}, Token: NoToken,
		CAFingerprint: strings.Repeat("ab", 32), MAC: "52:54:00:00:00:03", Mode: "hypervisor"}
	if diff := cmp.Diff(want, p); diff != "" {
		t.Errorf("parsed cmdline (-want +got):\n%s", diff)
	}
	if !strings.Contains(string(body), "initrd --name "+images.HypervisorInitrd+" http://10.0.0.1:8080/images/"+images.HypervisorInitrd+"?mac=52:54:00:00:00:03") {
		t.Errorf("no initrd line for the hypervisor image:\n%s", body)
	}
	for _, n := range []string{images.DiscoverKernel, images.HypervisorInitrd} {
		if resp, _ := get(t, f.srv.URL+"/images/"+n+"?mac=52:54:00:00:00:03", nil); resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %d", n, resp.StatusCode)
		}
	}
	get(t, f.srv.URL+"/images/nope.img?mac=52:54:00:00:00:03", nil)
	tl := f.rec.all()
	for _, want := range []string{
		"52:54:00:00:00:03 http script file= bytes=",
		"52:54:00:00:00:03 http artifact file=vmlinuz ",
		"52:54:00:00:00:03 http artifact file=hypervisor-initrd.img bytes=20 status=200",
		"52:54:00:00:00:03 http http-refused file= bytes= status=404",
	} {
		if !strings.Contains(tl, want) {
			t.Errorf("timeline lacks %q:\n%s", want, tl)
		}
	}
	if got := f.rec.detail("52:54:00:00:00:03", "script"); got != "rendered hypervisor script" {
		t.Errorf("script event detail %q", got)
	}
	if got := f.rec.attr("52:54:00:00:00:03", "script", "initrd"); got != images.HypervisorInitrd {
		t.Errorf("script event initrd attr %q", got)
	}
}

// TestHypervisorWithoutImage: without a hypervisor image the machine is
// told why on its console and in its timeline, and boots its local disk;
// no token is issued.
func TestHypervisorWithoutImage(t *testing.T) {
	f := newFixture(t, nil)
	resp, body := get(t, f.srv.URL+"/boot.ipxe?mac=52:54:00:00:00:03", nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	checkGolden(t, filepath.Join("testdata", "hypervisor-no-image.ipxe"), body)
	if len(f.tokens.issued) != 0 {
		t.Errorf("tokens issued without an image: %v", f.tokens.issued)
	}
	if got := f.rec.detail("52:54:00:00:00:03", "script"); !strings.Contains(got, "rendered hypervisor script: the catalog has no hypervisor image") {
		t.Errorf("script event detail %q", got)
	}
}

// checkGolden compares body with the golden file (written instead with
// -update).
func checkGolden(t *testing.T, golden string, body []byte) {
	t.Helper()
	if *update {
		os.WriteFile(golden, body, 0o644)
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(body, want) {
		t.Errorf("output differs from %s (run with -update):\n%s", golden, body)
	}
}
