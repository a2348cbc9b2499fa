package session

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/auth/pki"
	"google.golang.org/grpc"
)

// fakeInstaller reports "disk", then blocks until release is closed, then
// reports "done".
type fakeInstaller struct {
	release chan struct{}
	err     error // returned (as the install's error) after release instead of "done"

	mu       sync.Mutex
	installs []string // install_ids, in call order
	wipes    []string
}

func (f *fakeInstaller) Install(ctx context.Context, plan *nodev1.InstallPlan, _ func(context.Context, []byte) ([]byte, error), progress func(*nodev1.Progress)) error {
	f.mu.Lock()
	f.installs = append(f.installs, plan.GetInstallId())
	f.mu.Unlock()
	progress(&nodev1.Progress{Step: "disk", Detail: "/dev/vdb (1 GiB)", InstallId: plan.GetInstallId()})
	select {
	case <-f.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	if f.err != nil {
		progress(&nodev1.Progress{Step: "identity", Error: f.err.Error(), Done: true, InstallId: plan.GetInstallId()})
		return f.err
	}
	progress(&nodev1.Progress{Step: "done", Done: true, InstallId: plan.GetInstallId()})
	return nil
}

func (f *fakeInstaller) Wipe(_ context.Context, plan *nodev1.WipePlan, progress func(*nodev1.Progress)) error {
	f.mu.Lock()
	f.wipes = append(f.wipes, plan.GetDisk())
	f.mu.Unlock()
	progress(&nodev1.Progress{Step: "wipe", Detail: "wiped " + plan.GetDisk(), Done: true, InstallId: plan.GetInstallId()})
	return nil
}

func installCmd(id string) *nodev1.ApplianceMessage {
	return &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Install{Install: &nodev1.InstallPlan{Disk: "auto", Hostname: "node-1", InstallId: id}}}
}

// progressOf returns the steps (error-marked) the appliance received for id.
func (f *fakeAppliance) progressOf(id string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, p := range f.progress {
		if p.GetInstallId() != id {
			continue
		}
		s := p.GetStep()
		if p.GetError() != "" {
			s += " error: " + p.GetError()
		}
		if p.GetDone() {
			s += " (done)"
		}
		out = append(out, s)
	}
	return out
}

func TestInstallRunsWhileHeartbeating(t *testing.T) {
	wipe := &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Wipe{Wipe: &nodev1.WipePlan{Disk: "/dev/vdb", InstallId: "w-1"}}}
	// A, then B while A runs (refused), then A again (the appliance
	// restarted and resent it: ignored), then a wipe while A runs.
	f := &fakeAppliance{cmds: []*nodev1.ApplianceMessage{installCmd("A"), installCmd("B"), installCmd("A"), wipe}}
	endpoint, ca := serve(t, f, true)
	console := &syncBuffer{}
	inst := &fakeInstaller{release: make(chan struct{})}
	power := &fakePower{}
	cfg := config(endpoint, Fingerprint(ca), console, power)
	cfg.Installer = inst
	cfg.InstallReboot = 50 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()

	waitFor(t, "A's disk step and B's and the wipe's refusal", func() bool {
		return len(f.progressOf("A")) == 1 && len(f.progressOf("B")) == 1 && len(f.progressOf("w-1")) == 1
	})
	f.mu.Lock()
	beats := f.heartbeats
	f.mu.Unlock()
	waitFor(t, "heartbeats while the install runs", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.heartbeats >= beats+3
	})
	close(inst.release)
	waitFor(t, "A done", func() bool { return len(f.progressOf("A")) == 2 })
	waitFor(t, "the reboot after the install", func() bool {
		power.mu.Lock()
		defer power.mu.Unlock()
		return power.rebooted == 1
	})

	for id, want := range map[string][]string{
		"A":   {"disk", "done (done)"},
		"B":   {"install error: busy: install plan A is still running (done)"},
		"w-1": {"wipe error: busy: install plan A is still running (done)"},
	} {
		if got := f.progressOf(id); strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("progress of %s = %q, want %q", id, got, want)
		}
	}
	inst.mu.Lock()
	if strings.Join(inst.installs, ",") != "A" || len(inst.wipes) != 0 {
		t.Errorf("installer calls: installs %v, wipes %v; want one install of A", inst.installs, inst.wipes)
	}
	inst.mu.Unlock()
	for _, want := range []string{
		"install plan A: node node-1, disk auto",
		"install A: disk: /dev/vdb (1 GiB)",
		"refused install plan B: busy",
		"install plan A is already running",
		"install A done; rebooting into the hypervisor in 50ms",
	} {
		if !strings.Contains(console.String(), want) {
			t.Errorf("console lacks %q:\n%s", want, console)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v", err)
	}
}

func TestWipePlan(t *testing.T) {
	wipe := &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Wipe{Wipe: &nodev1.WipePlan{Disk: "/dev/vdb", InstallId: "w-1"}}}
	f := &fakeAppliance{cmds: []*nodev1.ApplianceMessage{wipe}}
	endpoint, ca := serve(t, f, true)
	inst := &fakeInstaller{release: make(chan struct{})}
	power := &fakePower{}
	cfg := config(endpoint, Fingerprint(ca), &syncBuffer{}, power)
	cfg.Installer = inst
	cfg.InstallReboot = time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go Run(ctx, cfg)
	waitFor(t, "the wipe", func() bool { return len(f.progressOf("w-1")) == 1 })
	if got := f.progressOf("w-1"); got[0] != "wipe (done)" {
		t.Errorf("wipe progress = %q", got)
	}
	inst.mu.Lock()
	defer inst.mu.Unlock()
	if len(inst.wipes) != 1 || inst.wipes[0] != "/dev/vdb" {
		t.Errorf("wipes = %v", inst.wipes)
	}
	power.mu.Lock()
	defer power.mu.Unlock()
	if power.rebooted != 0 {
		t.Error("a wipe rebooted the machine")
	}
}

// TestProgressKeptAcrossSessions: progress produced while no session is
// open is delivered on the next one.
func TestProgressKeptAcrossSessions(t *testing.T) {
	j := &jobs{cfg: &Config{Console: &syncBuffer{}}}
	j.progress(&nodev1.Progress{Step: "disk", InstallId: "A"})
	done := make(chan struct{})
	out := make(chan *nodev1.AgentMessage, 4)
	j.attach(out, done)
	j.progress(&nodev1.Progress{Step: "done", Done: true, InstallId: "A"})
	close(done)
	j.detach()
	j.progress(&nodev1.Progress{Step: "late", InstallId: "A"})
	var got []string
	for len(out) > 0 {
		got = append(got, (<-out).GetProgress().GetStep())
	}
	if strings.Join(got, ",") != "disk,done" || len(j.pending) != 1 || j.pending[0].GetStep() != "late" {
		t.Errorf("sent %v, pending %v", got, j.pending)
	}
}

// keyInstaller makes a key, has it signed through sign and checks that
// the certificate is for that key: the session's part of the CSR flow.
type keyInstaller struct {
	fakeInstaller
	mu   sync.Mutex
	key  *ecdsa.PrivateKey
	cert *x509.Certificate
	err  error
}

func (k *keyInstaller) Install(ctx context.Context, plan *nodev1.InstallPlan, sign func(context.Context, []byte) ([]byte, error), progress func(*nodev1.Progress)) error {
	id := plan.GetInstallId()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: plan.GetHostname()}}, key)
	if err != nil {
		return err
	}
	certPEM, err := sign(ctx, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
	var cert *x509.Certificate
	if err == nil {
		block, _ := pem.Decode(certPEM)
		if cert, err = x509.ParseCertificate(block.Bytes); err == nil && !key.PublicKey.Equal(cert.PublicKey) {
			err = errors.New("certificate for another key")
		}
	}
	k.mu.Lock()
	k.key, k.cert, k.err = key, cert, err
	k.mu.Unlock()
	if err != nil {
		progress(&nodev1.Progress{Step: "certificate", Error: err.Error(), Done: true, InstallId: id})
		return err
	}
	progress(&nodev1.Progress{Step: "done", Done: true, InstallId: id})
	return nil
}

func (k *keyInstaller) result() (*ecdsa.PrivateKey, *x509.Certificate, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.key, k.cert, k.err
}

// testCA signs certificate requests for node-1.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  string
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))}
}

// signer answers certificate requests with ca, for node-1.
func signer(t *testing.T, ca *testCA) func(grpc.BidiStreamingServer[nodev1.AgentMessage, nodev1.ApplianceMessage], *nodev1.CertificateRequest) error {
	return func(stream grpc.BidiStreamingServer[nodev1.AgentMessage, nodev1.ApplianceMessage], req *nodev1.CertificateRequest) error {
		block, _ := pem.Decode([]byte(req.GetCsrPem()))
		csr, err := x509.ParseCertificateRequest(block.Bytes)
		if err != nil {
			t.Errorf("request: %v", err)
			return err
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "node-1"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, csr.PublicKey, ca.key)
		if err != nil {
			t.Errorf("sign: %v", err)
			return err
		}
		return stream.Send(&nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Certificate{Certificate: &nodev1.NodeCertificate{
			InstallId: req.GetInstallId(), CertPem: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})), CaCertPem: ca.pem}}})
	}
}

func (f *fakeAppliance) requests() []*nodev1.CertificateRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*nodev1.CertificateRequest(nil), f.csrs...)
}

// TestInstallCertificateRequest: the plan arrives without key material
// (the console lists its fields); the installer's key stays on the
// machine: only a request for it goes to the appliance, for the plan's
// install id, and the signed certificate comes back to the installer.
func TestInstallCertificateRequest(t *testing.T) {
	ca := newTestCA(t)
	f := &fakeAppliance{cmds: []*nodev1.ApplianceMessage{installCmd("A")}}
	f.onCSR = signer(t, ca)
	endpoint, caCert := serve(t, f, true)
	console := &syncBuffer{}
	inst := &keyInstaller{}
	cfg := config(endpoint, Fingerprint(caCert), console, &fakePower{})
	cfg.Installer = inst
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go Run(ctx, cfg)
	waitFor(t, "install A done", func() bool { return len(f.progressOf("A")) == 1 })
	if got := f.progressOf("A"); got[0] != "done (done)" {
		t.Fatalf("progress of A = %q", got)
	}
	key, cert, _ := inst.result()
	reqs := f.requests()
	if len(reqs) != 1 || reqs[0].GetInstallId() != "A" {
		t.Fatalf("certificate requests %v", reqs)
	}
	block, _ := pem.Decode([]byte(reqs[0].GetCsrPem()))
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil || !key.PublicKey.Equal(csr.PublicKey) || cert.Subject.CommonName != "node-1" {
		t.Errorf("request for another key (%v) or certificate for %q", err, cert.Subject.CommonName)
	}
	if strings.Contains(reqs[0].GetCsrPem(), "PRIVATE KEY") {
		t.Error("the request carries a private key")
	}
	for _, want := range []string{
		"install plan A: node node-1, disk auto, wipe false (fields: disk hostname ca_cert_pem install_id)",
		"install A: node key made on this machine; its certificate request sent to the appliance",
	} {
		if !strings.Contains(console.String(), want) {
			t.Errorf("console lacks %q:\n%s", want, console)
		}
	}
}

// TestCertificateRequestAnswers: a refusal fails the install with the
// appliance's reason; no answer fails it after CertificateTimeout; an
// answer for another install is ignored; a request unanswered when its
// session ends goes again on the next one.
func TestCertificateRequestAnswers(t *testing.T) {
	ca := newTestCA(t)
	type stream = grpc.BidiStreamingServer[nodev1.AgentMessage, nodev1.ApplianceMessage]
	answer := func(s stream, c *nodev1.NodeCertificate) error {
		return s.Send(&nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Certificate{Certificate: c}})
	}
	for name, tc := range map[string]struct {
		onCSR   func(n int, s stream, req *nodev1.CertificateRequest) error // n counts requests from 1
		wantErr string
		reqs    int
	}{
		"refused": {func(_ int, s stream, req *nodev1.CertificateRequest) error {
			return answer(s, &nodev1.NodeCertificate{InstallId: req.GetInstallId(), Error: "machine is FAILED, not INSTALLING"})
		}, "certificate error: the appliance refused the certificate request: machine is FAILED, not INSTALLING (done)", 1},
		"no answer": {func(int, stream, *nodev1.CertificateRequest) error { return nil },
			"certificate error: no answer from the appliance to the certificate request within 300ms (done)", 1},
		"another install's answer first": {func(_ int, s stream, req *nodev1.CertificateRequest) error {
			if err := answer(s, &nodev1.NodeCertificate{InstallId: "B", Error: "not you"}); err != nil {
				return err
			}
			return signer(t, ca)(s, req)
		}, "done (done)", 1},
		"session lost before the answer": {func(n int, s stream, req *nodev1.CertificateRequest) error {
			if n == 1 {
				return errors.New("appliance restarted")
			}
			return signer(t, ca)(s, req)
		}, "done (done)", 2},
	} {
		t.Run(name, func(t *testing.T) {
			// Every session gets the plan, as the appliance resends it on
			// reconnect: the agent ignores the running one.
			f := &fakeAppliance{cmds: []*nodev1.ApplianceMessage{installCmd("A")}}
			var n atomic.Int32
			f.onCSR = func(s stream, req *nodev1.CertificateRequest) error {
				return tc.onCSR(int(n.Add(1)), s, req)
			}
			endpoint, caCert := serve(t, f, true)
			inst := &keyInstaller{}
			cfg := config(endpoint, Fingerprint(caCert), &syncBuffer{}, &fakePower{})
			cfg.Installer = inst
			cfg.CertificateTimeout = 300 * time.Millisecond
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- Run(ctx, cfg) }()
			waitFor(t, "install A's end", func() bool { return len(f.progressOf("A")) == 1 })
			if got := f.progressOf("A"); got[0] != tc.wantErr {
				t.Errorf("progress of A = %q, want %q", got, tc.wantErr)
			}
			reqs := f.requests()
			if len(reqs) != tc.reqs {
				t.Fatalf("%d requests, want %d", len(reqs), tc.reqs)
			}
			for _, r := range reqs[1:] {
				if r.GetCsrPem() != reqs[0].GetCsrPem() || r.GetInstallId() != "A" {
					t.Errorf("resent request differs")
				}
			}
			if strings.Contains(tc.wantErr, "refused") {
				if _, _, ierr := inst.result(); !errors.Is(ierr, ErrCertificateRefused) {
					t.Errorf("installer's error %v, want ErrCertificateRefused", ierr)
				}
			}
			cancel()
			<-done
		})
	}
}

// TestInstallPlanCANotPinned: a plan naming a CA other than the one pinned
// on the kernel command line is refused before the installer runs.
func TestInstallPlanCANotPinned(t *testing.T) {
	other, err := pki.EnsureCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for name, planCA := range map[string]string{
		"another CA": string(other.CertPEM()),
		"no CA":      "",
		"garbage":    "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
	} {
		t.Run(name, func(t *testing.T) {
			cmd := installCmd("A")
			cmd.GetInstall().CaCertPem = planCA
			f := &fakeAppliance{cmds: []*nodev1.ApplianceMessage{cmd}, noPlanCA: true}
			endpoint, caCert := serve(t, f, true)
			inst := &keyInstaller{}
			cfg := config(endpoint, Fingerprint(caCert), &syncBuffer{}, &fakePower{})
			cfg.Installer = inst
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go Run(ctx, cfg)
			waitFor(t, "install A answered", func() bool { return len(f.progressOf("A")) == 1 })
			if got := f.progressOf("A")[0]; !strings.HasPrefix(got, "install error: install plan: ") || !strings.HasSuffix(got, "(done)") {
				t.Fatalf("progress of A = %q, want an install error naming the plan's CA", got)
			}
			if key, _, _ := inst.result(); key != nil {
				t.Error("the installer ran for a plan whose CA is not the pinned one")
			}
			if n := len(f.requests()); n != 0 {
				t.Errorf("%d certificate requests sent, want none", n)
			}
		})
	}
}
