package ovmfvars

import (
	"bytes"
	"net"
	"os"
	"testing"

	"github.com/corralhq/corral/testsupport/require"
)

// TestHTTPBootVars writes the HTTP boot entry into Debian's empty OVMF
// variable store: the copy holds Boot0080 with the NIC's MAC and the
// address family's device path node, then BootNext, and nothing else of
// the store changes; a file that is not a variable store, and a store
// already written, are refused.
func TestHTTPBootVars(t *testing.T) {
	const vars = "/usr/share/OVMF/OVMF_VARS_4M.fd"
	require.File(t, vars, "Debian's ovmf")
	base, err := os.ReadFile(vars)
	if err != nil {
		t.Fatal(err)
	}
	mac, _ := net.ParseMAC("52:54:00:12:34:56")
	for _, v6 := range []bool{false, true} {
		out, err := HTTPBootVars(base, mac, 3, v6)
		if err != nil {
			t.Fatal(err)
		}
		if len(out) != len(base) {
			t.Fatalf("store grew from %d to %d bytes", len(base), len(out))
		}
		name := ucs2z("Boot0080")
		at := bytes.Index(out, name)
		if at < 0 || bytes.Contains(base, name) {
			t.Fatalf("v6=%v: Boot0080 not written", v6)
		}
		if !bytes.Contains(out, ucs2z("BootNext")) {
			t.Errorf("v6=%v: BootNext not written", v6)
		}
		path := httpDevicePath(mac, 3, v6)
		if !bytes.Contains(out[at:], path) {
			t.Errorf("v6=%v: the entry's device path is not the NIC's HTTP boot path", v6)
		}
		// The node after MAC() is IPv4 (3,12) or IPv6 (3,13).
		node := path[12+6+37+1] // PciRoot 12 bytes, Pci 6, MAC 37, then type, subtype
		if want := map[bool]byte{false: 12, true: 13}[v6]; node != want {
			t.Errorf("v6=%v: node subtype %d, want %d", v6, node, want)
		}
		// Everything before the first variable is the store's header, as it was.
		if i := bytes.Index(out, []byte{0xaa, 0x55, 0x3f, 0}); i < 0 || !bytes.Equal(out[:i], base[:i]) {
			t.Errorf("v6=%v: the store's header changed", v6)
		}
		if _, err := HTTPBootVars(out, mac, 3, v6); err == nil {
			t.Errorf("v6=%v: a store already written was accepted", v6)
		}
	}
	if _, err := HTTPBootVars(make([]byte, 8192), mac, 3, false); err == nil {
		t.Error("zeros were taken for a firmware volume")
	}
	if _, err := HTTPBootVars([]byte("short"), mac, 3, false); err == nil {
		t.Error("a 5-byte file was taken for a firmware volume")
	}
}
