package ipmi_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/corralhq/corral/ipmi"
	"github.com/corralhq/corral/testsupport/ipmisim"
	"github.com/corralhq/corral/testsupport/redfishtest"
)

// TestAutoPorts: under auto, the port callers fill in for "none given"
// (623) sends IPMI to 623 and Redfish to 443; a port given otherwise is
// used by both.
func TestAutoPorts(t *testing.T) {
	for _, tc := range []struct {
		proto         ipmi.Protocol
		port          int
		ipmi, redfish int
	}{
		{ipmi.ProtocolAuto, 0, 623, 443},
		{ipmi.ProtocolAuto, 623, 623, 443},
		{ipmi.ProtocolAuto, 8443, 8443, 8443},
		{ipmi.ProtocolRedfish, 0, 623, 443},
		{ipmi.ProtocolRedfish, 623, 623, 623},
		{ipmi.ProtocolIPMI, 0, 623, 443},
		{ipmi.ProtocolIPMI, 6230, 6230, 6230},
	} {
		tg := ipmi.Target{Host: "bmc1", Port: tc.port, Protocol: tc.proto}
		if got := tg.PortFor(ipmi.ProtocolIPMI); got != tc.ipmi {
			t.Errorf("%s port %d: IPMI on %d, want %d", tc.proto, tc.port, got, tc.ipmi)
		}
		if got := tg.PortFor(ipmi.ProtocolRedfish); got != tc.redfish {
			t.Errorf("%s port %d: Redfish on %d, want %d", tc.proto, tc.port, got, tc.redfish)
		}
	}
	if s := (ipmi.Target{Host: "bmc1", Port: 623}).String(); s != "auto://bmc1 (ipmi :623, redfish :443)" {
		t.Errorf("String: %q", s)
	}
}

// TestAutoFindsRedfishOn443: a Redfish-only BMC (the Redfish test server
// on 127.0.0.1:443, nothing answering IPMI on 623) is found by protocol
// auto with the port enroll fills in (623), and answers as Redfish: with
// 623 refused (nothing bound) and with 623 silent (bound, never
// answering, as behind a filter). Binding 443 needs root (or
// CAP_NET_BIND_SERVICE); the test is skipped without it.
func TestAutoFindsRedfishOn443(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:443")
	if err != nil {
		t.Skipf("cannot listen on 127.0.0.1:443 (needs root): %v", err)
	}
	pc, err := net.ListenPacket("udp4", "127.0.0.1:623")
	if err != nil {
		_ = ln.Close()
		t.Skipf("127.0.0.1:623/udp is in use: %v", err)
	}
	rf := redfishtest.Serve(t, ln, "root", "calvin", &redfishtest.MemMachine{})
	tg := ipmi.Target{Host: "127.0.0.1", Port: ipmi.DefaultIPMIPort, Protocol: ipmi.ProtocolAuto, Username: rf.User, Password: rf.Pass,
		Timeout: 5 * time.Second, TLSMode: ipmi.TLSFirstUse}
	check := func(what string) {
		t.Helper()
		start := time.Now()
		_, a, err := ipmi.New(ipmi.Config{}).PowerState(context.Background(), tg)
		if err != nil {
			t.Fatalf("623 %s: auto did not find the Redfish BMC on 443: %v (%s)", what, err, a)
		}
		if a.Provider != ipmi.RedfishProviderName || a.TLSSHA256 != rf.Fingerprint() {
			t.Fatalf("623 %s: answered by %q, certificate %q: %s", what, a.Provider, a.TLSSHA256, a)
		}
		if took := time.Since(start); took > 3*time.Second {
			t.Fatalf("623 %s: took %s", what, took)
		}
	}
	check("silent")
	_ = pc.Close()
	check("refused")
}

// TestAutoFindsIPMI: an ipmi_sim BMC is still found by auto, as IPMI.
func TestAutoFindsIPMI(t *testing.T) {
	if testing.Short() {
		t.Skip("starts ipmi_sim")
	}
	b := ipmisim.Start(t, ipmisim.Options{})
	tg := simTarget(b)
	tg.Protocol = ipmi.ProtocolAuto
	_, a, err := nativeOnly().PowerState(context.Background(), tg)
	if err != nil {
		t.Fatal(err)
	}
	if a.Provider != ipmi.NativeProviderName || strings.Contains(a.String(), "gofish") {
		t.Fatalf("answered by %q: %s", a.Provider, a)
	}
}
