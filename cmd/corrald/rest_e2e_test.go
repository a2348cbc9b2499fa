package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/api/clientconfig"
	"github.com/corralhq/corral/testsupport/redfishtest"
	"github.com/corralhq/corral/testsupport/require"
)

// restCurl drives the REST API with the real curl binary.
type restCurl struct {
	t      *testing.T
	base   string
	caFile string
	// http1 sends --http1.1 (curl otherwise negotiates HTTP/2).
	http1 bool
	// earlyAnswer tolerates curl's exit 18 ("transfer closed with N bytes
	// remaining") when the server answered before the upload ended: over
	// HTTP/2, Debian 12's curl 7.88 sometimes drops the answer's body when
	// the server's RST_STREAM(NO_ERROR) follows it, as RFC 9113 §8.1 lets
	// a server do. The status it printed still counts.
	earlyAnswer bool
}

type curlAnswer struct {
	code      int
	localPort string
	body      string
}

// do runs curl; body "" sends none, a body starting with @ is a file.
func (c restCurl) do(token, method, path, body string) curlAnswer {
	c.t.Helper()
	args := []string{"-sS", "--cacert", c.caFile, "-X", method, "-w", "\n%{http_code} %{local_port}"}
	if token != "" {
		args = append(args, "-H", "Authorization: Bearer "+token)
	}
	if body != "" {
		args = append(args, "--data-binary", body)
	}
	if c.http1 {
		args = append(args, "--http1.1")
	}
	out, err := runCmd(c.t, "curl", append(args, c.base+path)...)
	if ee, ok := errors.AsType[*exec.ExitError](err); ok && c.earlyAnswer && ee.ExitCode() == 18 {
		err = nil
	}
	if err != nil {
		c.t.Fatalf("curl %s %s: %v\n%s", method, path, err, out)
	}
	i := strings.LastIndexByte(out, '\n')
	code, port, _ := strings.Cut(out[i+1:], " ")
	n, _ := strconv.Atoi(code)
	return curlAnswer{code: n, localPort: port, body: out[:i]}
}

func (c restCurl) token(admin, role string) string {
	c.t.Helper()
	a := c.do(admin, "POST", "/v1/tokens", `{"role":"`+role+`","description":"rest `+role+`"}`)
	var res struct{ Token string }
	if a.code != 200 || json.Unmarshal([]byte(a.body), &res) != nil || res.Token == "" {
		c.t.Fatalf("create %s token: %d %s", role, a.code, a.body)
	}
	return res.Token
}

// TestE2ERESTCurl: the built corrald serves REST on its web listener to
// curl with the same tokens, roles and audit as gRPC. A viewer lists and
// reads machines and is refused a mutation (403, audited with curl's own
// address as the peer); an operator's mutation works and a watch over
// server-sent events sees it; undecodable input is a 4xx that changes
// nothing; no token is 401. About 10 s.
func TestE2ERESTCurl(t *testing.T) {
	needE2E(t)
	if _, err := exec.LookPath("curl"); err != nil {
		require.Missing(t, "curl not installed")
	}
	rf := redfishtest.Start(t, "root", "rest-bmc-Pa55", &redfishtest.MemMachine{})
	dataDir, addr, web := t.TempDir(), freePort(t), freePort(t)
	startCorrald(t, dataDir, addr, "CORRAL_WEB_LISTEN="+web)
	cc, err := clientconfig.Load(filepath.Join(dataDir, "admin.conf"))
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, []byte(cc.CACert), 0o644); err != nil {
		t.Fatal(err)
	}
	c := restCurl{t: t, base: "https://" + web, caFile: caFile}
	// The web listener logs its URL once it serves; the API came first.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if out, err := exec.Command("curl", "-sS", "--cacert", caFile, "-o", "/dev/null", c.base+"/openapi.json").CombinedOutput(); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("web listener: %v %s", err, out)
		}
	}
	viewer := c.token(cc.Token, "ROLE_VIEWER")
	operator := c.token(cc.Token, "ROLE_OPERATOR")

	// No token: 401.
	if a := c.do("", "GET", "/v1/machines", ""); a.code != 401 || !strings.Contains(a.body, `"code":16`) {
		t.Errorf("no token: %d %s", a.code, a.body)
	}
	// An operator enrolls a machine (BMC over Redfish).
	enroll := fmt.Sprintf(`{"name":"rest-u01","bmcAddress":%q,"bmcPort":%d,"bmcProtocol":"BMC_PROTOCOL_REDFISH","bmcUsername":"root","bmcPassword":"rest-bmc-Pa55","bmcTlsSha256":%q,"bootMac":"52:54:00:e2:e1:01"}`,
		rf.Host, rf.Port, rf.Fingerprint())
	if a := c.do(operator, "POST", "/v1/machines", enroll); a.code != 200 || !strings.Contains(a.body, `"name":"rest-u01"`) {
		t.Fatalf("operator enroll: %d %s", a.code, a.body)
	}
	// The viewer lists and reads it.
	if a := c.do(viewer, "GET", "/v1/machines?view=MACHINE_VIEW_SUMMARY", ""); a.code != 200 || !strings.Contains(a.body, `"rest-u01"`) {
		t.Errorf("viewer list: %d %s", a.code, a.body)
	}
	if a := c.do(viewer, "GET", "/v1/machines/rest-u01", ""); a.code != 200 || !strings.Contains(a.body, `"bootMac"`) {
		t.Errorf("viewer get: %d %s", a.code, a.body)
	}
	if a := c.do(viewer, "GET", "/v1/machines/nope", ""); a.code != 404 {
		t.Errorf("viewer get missing: %d %s", a.code, a.body)
	}

	// A watch over server-sent events, from now on.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	watch := exec.CommandContext(ctx, "curl", "-sS", "-N", "--cacert", caFile, "-H", "Authorization: Bearer "+viewer,
		"-H", "Accept: text/event-stream", c.base+"/v1/watch/machines?name=rest-u01")
	wout, err := watch.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := watch.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = watch.Wait() }()
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(wout)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	waitLine := func(what string, ok func(string) bool) {
		t.Helper()
		for {
			select {
			case l, open := <-lines:
				if !open {
					t.Fatalf("watch ended before %s", what)
				}
				if ok(l) {
					return
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("watch: no %s in 20 s", what)
			}
		}
	}
	waitLine("SYNCED", func(l string) bool { return strings.HasPrefix(l, "data: ") && strings.Contains(l, `"SYNCED"`) })

	// The viewer may not mutate: 403, and nothing changed.
	refused := c.do(viewer, "POST", "/v1/machines/rest-u01:maintenance", `{"on":true,"reason":"viewer"}`)
	if refused.code != 403 || !strings.Contains(refused.body, `"code":7`) {
		t.Errorf("viewer maintenance: %d %s", refused.code, refused.body)
	}
	// Bad input: a clear 4xx, nothing changed.
	big := filepath.Join(t.TempDir(), "big.json")
	if err := os.WriteFile(big, []byte(`{"on":true,"reason":"`+strings.Repeat("x", 5<<20)+`"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	// The oversized body is refused from its declared length, before it
	// is read: over HTTP/1.1 curl waits for "100 Continue", gets the 413
	// instead and sends none of it; over HTTP/2 the answer comes while
	// curl is still sending (see earlyAnswer), so only its status counts.
	h1, h2 := c, c
	h1.http1 = true
	h2.earlyAnswer = true
	for name, tc := range map[string]struct {
		curl               restCurl
		method, path, body string
		code               int
	}{
		"malformed JSON":         {c, "POST", "/v1/machines/rest-u01:maintenance", `{"on":tru`, 400},
		"unknown field":          {c, "POST", "/v1/machines/rest-u01:maintenance", `{"on":true,"colour":"red"}`, 400},
		"oversized body":         {h1, "POST", "/v1/machines/rest-u01:maintenance", "@" + big, 413},
		"oversized body, HTTP/2": {h2, "POST", "/v1/machines/rest-u01:maintenance", "@" + big, 413},
		"bad page_token":         {c, "GET", "/v1/machines?page_token=garbage", "", 400},
		"unknown param":          {c, "GET", "/v1/machines?colour=red", "", 400},
		"bad enum":               {c, "GET", "/v1/machines?view=ENORMOUS", "", 400},
	} {
		a := tc.curl.do(operator, tc.method, tc.path, tc.body)
		if a.code != tc.code || (!tc.curl.earlyAnswer && !strings.Contains(a.body, `"message"`)) {
			t.Errorf("%s: %d %s, want %d", name, a.code, a.body, tc.code)
		}
	}
	if a := c.do(viewer, "GET", "/v1/machines/rest-u01", ""); strings.Contains(a.body, `"maintenance":true`) || strings.Contains(a.body, "colour") {
		t.Errorf("refused calls changed the machine: %s", a.body)
	}

	// The operator may: the watch sees the change.
	if a := c.do(operator, "POST", "/v1/machines/rest-u01:maintenance", `{"on":true,"reason":"rest e2e"}`); a.code != 200 {
		t.Fatalf("operator maintenance: %d %s", a.code, a.body)
	}
	waitLine("the maintenance change", func(l string) bool {
		return strings.HasPrefix(l, "data: ") && strings.Contains(l, `"result"`) && strings.Contains(l, "rest e2e")
	})

	// The refusal is audited with curl's address as the peer.
	wantPeer := "127.0.0.1:" + refused.localPort
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		a := c.do(cc.Token, "GET", "/v1/audit/events?method=/corral.inventory.v1.MachineService/SetMaintenance", "")
		var res struct {
			Events []struct{ Who, Code, Peer, Object string }
		}
		if a.code != 200 || json.Unmarshal([]byte(a.body), &res) != nil {
			t.Fatalf("audit list: %d %s", a.code, a.body)
		}
		found := false
		for _, e := range res.Events {
			if e.Code == "PermissionDenied" && strings.Contains(e.Who, "rest ROLE_VIEWER") {
				found = true
				if e.Peer != wantPeer {
					t.Errorf("audited peer %q, want curl's %q", e.Peer, wantPeer)
				}
			}
		}
		if found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no audited refusal of the viewer in %s", a.body)
		}
	}
}
