package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corralhq/corral/appliance"
	"github.com/corralhq/corral/testsupport/syncbuf"
)

// TestWatchAndEventsAgainstAppliance: against a real in-process corrald
// over TLS, `get networks -w` shows the table when the list is synced and a
// row for a network applied afterwards, and `get events` then shows who
// applied it.
func TestWatchAndEventsAgainstAppliance(t *testing.T) {
	app := startBMCApp(t, appliance.Config{BMC: appliance.BMCConfig{PollInterval: -1}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncbuf.Buffer
	done := make(chan int, 1)
	go func() {
		done <- Run(ctx, []string{"--config", app.conf, "get", "networks", "-w"}, &stdout, &stderr)
	}()
	waitFor(t, "the header (SYNCED)", func() bool { return strings.HasPrefix(stdout.String(), "NAME") })

	file := filepath.Join(t.TempDir(), "net.yaml")
	if err := os.WriteFile(file, []byte("kind: network\nname: lab-net\nipv4_cidr: 192.168.77.0/24\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	app.ok(t, "apply", "-f", file)
	waitFor(t, "the applied network's row", func() bool { return strings.Contains(stdout.String(), "\nlab-net ") })
	cancel()
	if code := <-done; code != ExitOK {
		t.Fatalf("watch exit %d: %s", code, stderr.String())
	}

	var out string
	waitFor(t, "the audit event", func() bool {
		r := app.corral(t, "get", "events", "--since", "10m")
		out = r.stdout
		return r.code == 0 && strings.Contains(out, "ApplyNetwork")
	})
	if !strings.Contains(out, "network/lab-net") {
		t.Errorf("the event does not name its object:\n%s", out)
	}
}
