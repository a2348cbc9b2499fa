package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corralhq/corral/testsupport/require"
)

// TestPackagedUnitVerifies: systemd-analyze verify accepts
// packaging/corrald.service (its ExecStart pointed at an executable that
// exists here, since verify checks it), and the unit says what the
// package promises. images/e2e's TestDebInstall checks the installed
// unit the same way; this runs without root or QEMU.
func TestPackagedUnitVerifies(t *testing.T) {
	require.Tool(t, "systemd-analyze")
	unit, err := os.ReadFile("../../packaging/corrald.service")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Type=notify",
		"ExecStart=/usr/bin/corrald serve --config /etc/corral/corrald.yaml --data-dir /var/lib/corral",
		"Restart=on-failure", "WatchdogSec=", "StateDirectory=corral", "User=corral", "LimitNOFILE=",
		"AmbientCapabilities=CAP_NET_BIND_SERVICE CAP_NET_RAW CAP_NET_ADMIN",
		"CapabilityBoundingSet=CAP_NET_BIND_SERVICE CAP_NET_RAW CAP_NET_ADMIN",
		"NoNewPrivileges=yes", "ProtectSystem=strict", "ReadWritePaths=/var/lib/corral", "ProtectHome=yes", "PrivateTmp=yes",
	} {
		if !bytes.Contains(unit, []byte("\n"+want)) {
			t.Errorf("corrald.service lacks %q", want)
		}
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "corrald.service")
	os.WriteFile(path, bytes.ReplaceAll(unit, []byte("ExecStart=/usr/bin/corrald"), []byte("ExecStart="+exe)), 0o644)
	out, err := exec.Command("systemd-analyze", "verify", path).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	// A broken unit is not accepted: the check can fail.
	bad := filepath.Join(t.TempDir(), "corrald.service")
	os.WriteFile(bad, bytes.ReplaceAll(unit, []byte("ExecStart=/usr/bin/corrald"), []byte("ExecStart=/nonexistent/corrald")), 0o644)
	if out, err := exec.Command("systemd-analyze", "verify", bad).CombinedOutput(); err == nil && !strings.Contains(string(out), "nonexistent") {
		t.Errorf("systemd-analyze verify accepted a unit whose binary is missing:\n%s", out)
	}
}

// TestPackagedConfigLoads: the default /etc/corral/corrald.yaml the .deb
// installs is accepted by corrald serve (an unknown key or a bad value
// would stop the service at its first start) and leaves network boot off
// until the operator names an interface.
func TestPackagedConfigLoads(t *testing.T) {
	c, err := serveWith(t, "serve", "--config", "../../packaging/corrald.yaml", "--data-dir", t.TempDir())
	if err != nil {
		t.Fatalf("packaging/corrald.yaml: %v", err)
	}
	if c.Boot.Interface != "" {
		t.Errorf("boot interface %q, want none until the operator sets one", c.Boot.Interface)
	}
}
