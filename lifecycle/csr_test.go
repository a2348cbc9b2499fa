package lifecycle

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"net"
	"net/url"
	"slices"
	"strings"
	"testing"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
)

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// csrFor is a request for key with CN cn and the SANs an attacker would
// like: an IP literal, a URI and another DNS name.
func csrFor(t testing.TB, key crypto.Signer, cn string) string {
	t.Helper()
	u, _ := url.Parse("urn:corral:appliance")
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: cn}, DNSNames: []string{"appliance.example"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, URIs: []*url.URL{u},
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

func certOf(t *testing.T, c *nodev1.NodeCertificate) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode([]byte(c.GetCertPem()))
	if block == nil {
		t.Fatalf("no certificate in %v", c)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

func (a *agent) csr(id, csrPEM string) {
	a.t.Helper()
	if err := a.stream.Send(&nodev1.AgentMessage{Msg: &nodev1.AgentMessage_Csr{Csr: &nodev1.CertificateRequest{InstallId: id, CsrPem: csrPEM}}}); err != nil {
		a.t.Fatal(err)
	}
}

// certificate waits for the next NodeCertificate (skipping nothing: any
// other message fails).
func (a *agent) certificate() *nodev1.NodeCertificate {
	a.t.Helper()
	m := a.next()
	c := m.GetCertificate()
	if c == nil {
		a.t.Fatalf("got %v, want a NodeCertificate", m)
	}
	return c
}

// events returns the machine's lifecycle timeline entries named event.
func (h *harness) events(name, event string) []*inventoryv1.TimelineEntry {
	h.t.Helper()
	ctx := context.Background()
	if err := h.inv.FlushTimeline(ctx); err != nil {
		h.t.Fatal(err)
	}
	es, err := h.inv.Timeline(ctx, name, "", 0)
	if err != nil {
		h.t.Fatal(err)
	}
	var out []*inventoryv1.TimelineEntry
	for _, e := range es {
		if e.GetEvent() == event {
			out = append(out, e)
		}
	}
	return out
}

// accepted connects an agent, accepts its machine and returns the agent
// and the plan it received.
func (h *harness) accepted(mac, serial string) (*agent, *nodev1.InstallPlan) {
	h.t.Helper()
	a := h.connect(mac, facts(serial, "", mac))
	if _, err := h.lc.Accept(context.Background(), a.name, "", false); err != nil {
		h.t.Fatal(err)
	}
	p := a.next().GetInstall()
	if p == nil {
		h.t.Fatal("no install plan")
	}
	return a, p
}

func TestCSRSignedForTheAcceptedName(t *testing.T) {
	h := newHarness(t, nil, harnessOpt{})
	a, plan := h.accepted(mac1, "S1")
	id := plan.GetInstallId()
	key := newKey(t)
	a.csr(id, csrFor(t, key, "appliance"))
	c := a.certificate()
	if c.GetError() != "" || c.GetInstallId() != id || c.GetCaCertPem() != string(h.id.CACertPEM()) {
		t.Fatalf("answer %v", c)
	}
	cert := certOf(t, c)
	// The name is the machine's; the request's CN and SANs are not asked
	// for (the fake signs what it is given: the name).
	if cert.Subject.CommonName != a.name || !key.PublicKey.Equal(cert.PublicKey) {
		t.Errorf("certificate for %q, key match %v", cert.Subject.CommonName, key.PublicKey.Equal(cert.PublicKey))
	}
	if diff := cmp.Diff([]string{a.name}, h.id.names()); diff != "" {
		t.Errorf("names signed (-want +got):\n%s", diff)
	}
	_, fp, err := parseCSR([]byte(csrFor(t, key, "x")))
	if err != nil {
		t.Fatal(err)
	}
	m := h.machine(a.name)
	if got := m.GetAnnotations()[AnnotationNodeKey]; got != id+" "+fp {
		t.Errorf("%s = %q, want %q", AnnotationNodeKey, got, id+" "+fp)
	}
	es := h.events(a.name, "certificate-signed")
	if len(es) != 1 || es[0].GetAttributes()["key"] != fp || es[0].GetAttributes()["serial"] != cert.SerialNumber.Text(16) ||
		!strings.Contains(es[0].GetDetail(), "made on the machine") {
		t.Errorf("certificate-signed entries %v", es)
	}

	// Again on the same session: refused (one signing per session).
	a.csr(id, csrFor(t, key, "x"))
	if c := a.certificate(); !strings.Contains(c.GetError(), "already signed on this session") {
		t.Errorf("second request on the session: %v", c)
	}
	// The agent's session broke before it read the answer: on the new
	// session the plan comes again and the same key is signed again.
	a.close()
	b := h.connect(mac1, facts("S1", "", mac1))
	if p := b.next().GetInstall(); p.GetInstallId() != id {
		t.Fatalf("plan on reconnect %v", p)
	}
	b.csr(id, csrFor(t, key, "x"))
	if c := b.certificate(); c.GetError() != "" || !key.PublicKey.Equal(certOf(t, c).PublicKey) {
		t.Fatalf("same key on a new session: %v", c)
	}
	if n := len(h.events(a.name, "certificate-signed")); n != 2 {
		t.Errorf("%d certificate-signed entries, want 2", n)
	}
	if fl := h.machine(a.name).GetFlags(); len(fl) != 0 {
		t.Errorf("flags %v", fl)
	}
	// A different key for the same install, on this session or any:
	// refused, the machine flagged and the name's certificates revoked.
	other := newKey(t)
	b.csr(id, csrFor(t, other, "x"))
	if c := b.certificate(); !strings.Contains(c.GetError(), "already has a node key ("+fp+")") ||
		!strings.Contains(c.GetError(), "certificates already issued for it are revoked") || c.GetCertPem() != "" {
		t.Fatalf("different key: %v", c)
	}
	m = h.machine(a.name)
	if len(m.GetFlags()) != 1 || !strings.HasPrefix(m.GetFlags()[0], FlagCSRKeyConflict+": install "+id+": ") {
		t.Errorf("flags %v", m.GetFlags())
	}
	if got := m.GetAnnotations()[AnnotationNodeKey]; got != id+" "+fp {
		t.Errorf("recorded key changed to %q", got)
	}
	if diff := cmp.Diff([]string{a.name}, h.certs.revoked()); diff != "" {
		t.Errorf("revoked (-want +got):\n%s", diff)
	}
	// Nothing more is signed for that install, not even the first key on
	// a new session.
	b.close()
	c2 := h.connect(mac1, facts("S1", "", mac1))
	c2.next() // the plan
	c2.csr(id, csrFor(t, key, "x"))
	if c := c2.certificate(); !strings.Contains(c.GetError(), "nothing more is signed for it") {
		t.Fatalf("first key after the conflict: %v", c)
	}
	if n := len(h.id.names()); n != 2 {
		t.Errorf("%d signings, want 2", n)
	}
	if es := h.events(a.name, "csr-refused"); len(es) != 3 {
		t.Errorf("csr-refused entries: %v", es)
	}
	// The install fails when the agent reports it; a new accept takes a
	// new key and clears the flag.
	c2.progress(id, "certificate", true, "node certificate: refused")
	h.eventually(a.name, "FAILED", func(m *inventoryv1.Machine) bool { return m.GetState() == inventoryv1.Machine_FAILED })
	if _, err := h.lc.Accept(context.Background(), a.name, "", true); err != nil {
		t.Fatal(err)
	}
	p2 := c2.next().GetInstall()
	c2.csr(p2.GetInstallId(), csrFor(t, other, "x"))
	if c := c2.certificate(); c.GetError() != "" {
		t.Fatalf("new install: %v", c)
	}
	if fl := h.machine(a.name).GetFlags(); len(fl) != 0 {
		t.Errorf("flags after a new install's certificate: %v", fl)
	}
}

// TestCSRRefusals: each request is answered with an error naming why,
// nothing is signed, the machine record is unchanged, and the refusal is
// on the timeline.
func TestCSRRefusals(t *testing.T) {
	key := newKey(t)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	p224, err := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	good := csrFor(t, key, "x")
	block, _ := pem.Decode([]byte(good))
	tampered := slices.Clone(block.Bytes)
	tampered[len(tampered)-5] ^= 0xff
	// A case's req runs on an agent whose machine was accepted and which
	// received the plan; it returns the install id and PEM to send.
	type reqFunc = func(h *harness, a *agent, plan *nodev1.InstallPlan) (id, csrPEM string)
	sends := func(csrPEM string) reqFunc {
		return func(_ *harness, _ *agent, p *nodev1.InstallPlan) (string, string) { return p.GetInstallId(), csrPEM }
	}
	for name, tc := range map[string]struct {
		req  reqFunc
		want string
	}{
		"wrong install id": {
			req:  func(*harness, *agent, *nodev1.InstallPlan) (string, string) { return "0123456789abcdef", good },
			want: "install plan 0123456789abcdef was not sent on this session",
		},
		"no install id": {
			req:  func(*harness, *agent, *nodev1.InstallPlan) (string, string) { return "", good },
			want: "certificate request without an install_id",
		},
		"garbage":       {req: sends("hello"), want: "no PEM CERTIFICATE REQUEST block"},
		"oversized":     {req: sends(good + strings.Repeat("A", MaxCSRBytes)), want: "bytes; the limit is 8192"},
		"trailing data": {req: sends(good + good), want: "data after the PEM CERTIFICATE REQUEST block"},
		"bad signature": {req: sends(string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: tampered}))), want: "certificate request"},
		"weak RSA":      {req: sends(csrFor(t, rsaKey, "x")), want: "RSA key of 1024 bits"},
		"P-224":         {req: sends(csrFor(t, p224, "x")), want: "ECDSA curve P-224"},
		"a certificate, not a request": {
			req: func(h *harness, _ *agent, p *nodev1.InstallPlan) (string, string) {
				return p.GetInstallId(), string(h.id.CACertPEM())
			},
			want: "no PEM CERTIFICATE REQUEST block",
		},
		"not installing": {
			req: func(h *harness, a *agent, p *nodev1.InstallPlan) (string, string) {
				if _, err := h.lc.SetMaintenance(context.Background(), a.name, true, "hold"); err != nil {
					t.Fatal(err)
				}
				return p.GetInstallId(), good
			},
			want: "is MAINTENANCE, not INSTALLING",
		},
		"install done": {
			req: func(h *harness, a *agent, p *nodev1.InstallPlan) (string, string) {
				h.lc.onProgress(context.Background(), a.name, &nodev1.Progress{InstallId: p.GetInstallId(), Step: "done", Done: true})
				a.next() // reboot
				return p.GetInstallId(), good
			},
			want: "is done: its identity is written",
		},
		"timed out": {
			req: func(h *harness, _ *agent, p *nodev1.InstallPlan) (string, string) {
				h.clk.Advance(DefaultInstallTimeout + 1)
				h.reconcile()
				return p.GetInstallId(), good
			},
			want: "is FAILED, not INSTALLING",
		},
		"superseded": {
			req: func(h *harness, a *agent, p *nodev1.InstallPlan) (string, string) {
				h.lc.onProgress(context.Background(), a.name, &nodev1.Progress{InstallId: p.GetInstallId(), Step: "disk", Done: true, Error: "boom"})
				h.eventually(a.name, "FAILED", func(m *inventoryv1.Machine) bool { return m.GetState() == inventoryv1.Machine_FAILED })
				if _, err := h.lc.Accept(context.Background(), a.name, "", true); err != nil {
					t.Fatal(err)
				}
				a.next() // the new plan
				return p.GetInstallId(), good
			},
			want: "was not sent on this session",
		},
		"another machine's install": {
			// b's agent asks with a's install id on its own session.
			req: func(h *harness, a *agent, p *nodev1.InstallPlan) (string, string) {
				b, _ := h.accepted("52:54:00:00:00:02", "S2")
				*a = *b
				return p.GetInstallId(), good
			},
			want: "was not sent on this session",
		},
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, nil, harnessOpt{})
			a, plan := h.accepted(mac1, "S1")
			id, req := tc.req(h, a, plan)
			before := h.machine(a.name)
			a.csr(id, req)
			c := a.certificate()
			if !strings.Contains(c.GetError(), tc.want) || c.GetCertPem() != "" || c.GetInstallId() != id {
				t.Fatalf("answer %v, want an error containing %q", c, tc.want)
			}
			if n := h.id.names(); len(n) != 0 {
				t.Errorf("signed for %v", n)
			}
			if after := h.machine(a.name); !proto.Equal(before, after) {
				t.Errorf("machine changed:\n%v\n%v", before, after)
			}
			es := h.events(a.name, "csr-refused")
			if len(es) != 1 || es[0].GetDetail() != c.GetError() || es[0].GetAttributes()["install_id"] != id {
				t.Errorf("csr-refused entries %v", es)
			}
		})
	}
}

// TestCSRNotOnThePlanStream: a request that arrives on any other stream
// than the one the plan went on is refused (the session's stream context
// identifies it).
func TestCSRNotOnThePlanStream(t *testing.T) {
	h := newHarness(t, nil, harnessOpt{})
	a, plan := h.accepted(mac1, "S1")
	other, cancel := context.WithCancel(context.Background())
	defer cancel()
	h.lc.onCSR(other, a.name, &nodev1.CertificateRequest{InstallId: plan.GetInstallId(), CsrPem: csrFor(t, newKey(t), "x")})
	if c := a.certificate(); !strings.Contains(c.GetError(), "was not sent on this session") {
		t.Fatalf("answer %v", c)
	}
	if n := h.id.names(); len(n) != 0 {
		t.Errorf("signed for %v", n)
	}
}

// TestCSRSignFailure: a CA error is a refusal naming it; the same key may
// be asked for again.
func TestCSRSignFailure(t *testing.T) {
	h := newHarness(t, nil, harnessOpt{})
	a, plan := h.accepted(mac1, "S1")
	h.id.mu.Lock()
	h.id.fail = errors.New("CA expired")
	h.id.mu.Unlock()
	key := newKey(t)
	a.csr(plan.GetInstallId(), csrFor(t, key, "x"))
	if c := a.certificate(); !strings.Contains(c.GetError(), "could not sign it: CA expired") {
		t.Fatalf("answer %v", c)
	}
	h.id.mu.Lock()
	h.id.fail = nil
	h.id.mu.Unlock()
	a.csr(plan.GetInstallId(), csrFor(t, key, "x"))
	if c := a.certificate(); c.GetError() != "" {
		t.Fatalf("retry: %v", c)
	}
}

func TestParseCSR(t *testing.T) {
	key := newKey(t)
	if _, fp, err := parseCSR([]byte(csrFor(t, key, "n"))); err != nil || !strings.HasPrefix(fp, "sha256:") || len(fp) != 7+64 {
		t.Fatalf("parseCSR = %q, %v", fp, err)
	}
	for name, in := range map[string]string{
		"empty":     "",
		"garbage":   "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
		"key block": "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
		"oversized": strings.Repeat("x", MaxCSRBytes+1),
	} {
		if _, _, err := parseCSR([]byte(in)); !errors.Is(err, apierr.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

// FuzzParseCSR: no input panics; whatever is accepted has a checked
// signature and an accepted key.
func FuzzParseCSR(f *testing.F) {
	f.Add([]byte(csrFor(f, newKey(f), "node-1")))
	f.Add([]byte("-----BEGIN CERTIFICATE REQUEST-----\nMIIB\n-----END CERTIFICATE REQUEST-----\n"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, b []byte) {
		csr, fp, err := parseCSR(b)
		if err != nil {
			if !errors.Is(err, apierr.ErrInvalid) {
				t.Fatalf("error of another class: %v", err)
			}
			return
		}
		if csr.CheckSignature() != nil || len(fp) != 7+64 || len(b) > MaxCSRBytes {
			t.Fatalf("accepted a bad request (%d bytes)", len(b))
		}
	})
}
