package ipmi_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/ipmi"
	"github.com/corralhq/corral/testsupport/redfishtest"
	"github.com/google/go-cmp/cmp"
)

const sessionPost = "POST /redfish/v1/SessionService/Sessions"

// TestRedfishCertificate: every Redfish call checks the leaf certificate
// of every handshake against the target's TLS mode, against a real HTTPS
// Redfish server with a self-signed certificate of its own.
func TestRedfishCertificate(t *testing.T) {
	t.Parallel()
	other := strings.Repeat("ab", 32)
	for name, tc := range map[string]struct {
		mode   ipmi.TLSMode
		pin    func(rf *redfishtest.Server) string
		rotate bool // the server changes its certificate before the call
		// want: nil, or the CertificateError (Pinned/Presented filled
		// from the server: "old", "new", "other", "").
		want *[2]string
		// handshakes: whether the server was contacted at all.
		handshakes bool
	}{
		"pinned accepts its certificate":       {mode: ipmi.TLSPinned, pin: (*redfishtest.Server).Fingerprint, handshakes: true},
		"pinned refuses another certificate":   {mode: ipmi.TLSPinned, pin: func(*redfishtest.Server) string { return other }, want: &[2]string{"other", "old"}, handshakes: true},
		"pinned refuses a changed certificate": {mode: ipmi.TLSPinned, pin: (*redfishtest.Server).Fingerprint, rotate: true, want: &[2]string{"old", "new"}, handshakes: true},
		"nothing pinned: not tried":            {mode: ipmi.TLSPinned, want: &[2]string{"", ""}},
		"first use trusts what is presented":   {mode: ipmi.TLSFirstUse, rotate: true, handshakes: true},
		"insecure accepts anything":            {mode: ipmi.TLSInsecure, rotate: true, handshakes: true},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			rf := redfishtest.Start(t, "root", "calvin", &redfishtest.MemMachine{})
			tg := redfishTarget(rf)
			tg.TLSMode, tg.TLSSHA256 = tc.mode, ""
			if tc.pin != nil {
				tg.TLSSHA256 = tc.pin(rf)
			}
			old := rf.Fingerprint()
			if tc.rotate {
				if err := rf.RotateCertificate(); err != nil {
					t.Fatal(err)
				}
			}
			fps := map[string]string{"old": old, "new": rf.Fingerprint(), "other": other, "": ""}
			st, a, err := ipmi.New(ipmi.Config{}).PowerState(context.Background(), tg)
			if (rf.Handshakes() > 0) != tc.handshakes {
				t.Errorf("%d handshakes, want some: %t", rf.Handshakes(), tc.handshakes)
			}
			if tc.want == nil {
				if err != nil || st != ipmi.PowerOff || a.Provider != ipmi.RedfishProviderName {
					t.Fatalf("got %s %v (%s), want off from gofish", st, err, a)
				}
				if a.TLSSHA256 != rf.Fingerprint() {
					t.Fatalf("answer reports certificate %q, the server's is %q", a.TLSSHA256, rf.Fingerprint())
				}
				return
			}
			var ce *ipmi.CertificateError
			if !errors.Is(err, ipmi.ErrCertificate) || !errors.As(err, &ce) {
				t.Fatalf("want a certificate error, got %v", err)
			}
			if diff := cmp.Diff(ipmi.CertificateError{Pinned: fps[tc.want[0]], Presented: fps[tc.want[1]]}, *ce); diff != "" {
				t.Fatalf("certificate error (-want +got):\n%s", diff)
			}
			if a.TLSSHA256 != fps[tc.want[1]] {
				t.Fatalf("answer reports certificate %q, want %q", a.TLSSHA256, fps[tc.want[1]])
			}
			if tc.want[0] != "" && !strings.Contains(err.Error(), "BMC certificate changed: pinned sha256 "+fps[tc.want[0]]+", presented "+fps[tc.want[1]]) {
				t.Fatalf("message: %v", err)
			}
			// The refusal is in the handshake: no request, so no
			// credentials, ever reached the server.
			if n := rf.Requested(sessionPost); n != 0 || len(rf.Requests()) != 0 {
				t.Fatalf("requests reached a refused BMC: %v", rf.Requests())
			}
		})
	}
}

// TestRedfishCertificateEveryOperation: power actions and the boot device
// are refused like the power state once the certificate changes, and
// work again with the new pin.
func TestRedfishCertificateEveryOperation(t *testing.T) {
	t.Parallel()
	m := &redfishtest.MemMachine{}
	rf := redfishtest.Start(t, "root", "calvin", m)
	c := ipmi.New(ipmi.Config{})
	ctx := context.Background()
	tg := redfishTarget(rf)
	if _, err := c.SetPower(ctx, tg, ipmi.ActionOn); err != nil {
		t.Fatal(err)
	}
	if err := rf.RotateCertificate(); err != nil {
		t.Fatal(err)
	}
	before := len(rf.Requests())
	ops := map[string]func() error{
		"power state": func() error { _, _, err := c.PowerState(ctx, tg); return err },
		"power off":   func() error { _, err := c.SetPower(ctx, tg, ipmi.ActionOff); return err },
		"boot device": func() error { _, err := c.SetBootDevice(ctx, tg, ipmi.BootPXE, ipmi.BootOptions{}); return err },
		"info":        func() error { _, _, err := c.Info(ctx, tg); return err },
	}
	for name, op := range ops {
		if err := op(); !errors.Is(err, ipmi.ErrCertificate) {
			t.Errorf("%s after the certificate changed: %v", name, err)
		}
	}
	if on, _ := m.Power(); !on || len(rf.Requests()) != before {
		t.Fatalf("a refused BMC was acted on: on=%t, requests %v", on, rf.Requests()[before:])
	}
	tg.TLSSHA256 = rf.Fingerprint()
	for name, op := range ops {
		if err := op(); err != nil {
			t.Errorf("%s with the new pin: %v", name, err)
		}
	}
}

// TestRedfishCertificateAuto: under protocol auto an unpinned target never
// tries Redfish (the IPMI providers still do), and the gofish attempt
// says why.
func TestRedfishCertificateAuto(t *testing.T) {
	t.Parallel()
	rf := redfishtest.Start(t, "root", "calvin", &redfishtest.MemMachine{})
	tg := redfishTarget(rf)
	tg.Protocol, tg.TLSSHA256, tg.Timeout = ipmi.ProtocolAuto, "", 2*time.Second
	_, a, err := ipmi.New(ipmi.Config{Providers: []string{ipmi.NativeProviderName, ipmi.RedfishProviderName}}).PowerState(context.Background(), tg)
	if err == nil || rf.Handshakes() != 0 {
		t.Fatalf("unpinned auto: err %v, %d handshakes", err, rf.Handshakes())
	}
	if !strings.Contains(a.String(), "gofish: not tried: no certificate is pinned") {
		t.Fatalf("answer: %s", a)
	}
}

func TestTargetTLSValidate(t *testing.T) {
	pin := strings.Repeat("0f", 32)
	for name, tc := range map[string]struct {
		mode ipmi.TLSMode
		pin  string
		ok   bool
	}{
		"pinned":             {ipmi.TLSPinned, pin, true},
		"unpinned":           {ipmi.TLSPinned, "", true},
		"first use":          {ipmi.TLSFirstUse, "", true},
		"insecure":           {ipmi.TLSInsecure, "", true},
		"upper-case pin":     {ipmi.TLSPinned, strings.ToUpper(pin), false},
		"short pin":          {ipmi.TLSPinned, pin[:62], false},
		"colons":             {ipmi.TLSPinned, "0f:" + pin[3:], false},
		"pin with first use": {ipmi.TLSFirstUse, pin, false},
		"pin with insecure":  {ipmi.TLSInsecure, pin, false},
		"unknown mode":       {ipmi.TLSMode(9), "", false},
	} {
		t.Run(name, func(t *testing.T) {
			tg := ipmi.Target{Host: "10.0.0.1", Protocol: ipmi.ProtocolRedfish, Username: "u", TLSMode: tc.mode, TLSSHA256: tc.pin}
			err := tg.Validate()
			if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ipmi.ErrInvalid)) {
				t.Fatalf("Validate: %v, want ok=%t", err, tc.ok)
			}
		})
	}
}
