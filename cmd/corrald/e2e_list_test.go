package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corralhq/corral/api/clientconfig"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/testsupport/machinefacts"
)

// listStormMachines is how many machines TestE2EListAfterStorm registers
// (CORRAL_LIST_STORM overrides it): enough that their full records are
// several times gRPC's 4 MiB default message, few enough for CI.
const listStormMachines = 1000

// TestE2EListAfterStorm: machines with realistic facts (3.5 KB each, 16
// DIMMs, 4 disks, 4 NICs) register against the built corrald as agents
// do (the boot script's per-boot token, then Register), 16 at a time;
// then `corral get machines` lists every one of them, each once, and
// `-o json` (the FULL view) too, page after page. It prints how long the
// storm and each listing took; it asserts only completeness.
func TestE2EListAfterStorm(t *testing.T) {
	// The storm comes from one address, 127.0.0.1: the per-source agent
	// limit (docs/security.md) is raised for it, as an operator would for
	// a relay or a NAT in front of a rack.
	c := startCredCorrald(t, "--agent-rate-per-source", "100000", "--agent-burst-per-source", "100000")
	n := listStormMachines
	if v, err := strconv.Atoi(os.Getenv("CORRAL_LIST_STORM")); err == nil && v > 0 {
		n = v
	}
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n || t.Failed() {
					return
				}
				mac := machinefacts.ServerMAC(i, 0)
				// Each machine boots from an address of its own.
				from := fmt.Sprintf("127.1.%d.%d", i>>8, i&0xff)
				tok := c.token(mac, from)
				// One connection per machine, closed after its Register:
				// corrald caps connections per address (32).
				conn, err := clientconfig.Dial(&clientconfig.Config{Endpoint: c.api, CACert: c.cc.CACert, Token: tok})
				if err == nil {
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					_, err = nodev1.NewAgentServiceClient(conn).Register(ctx, &nodev1.RegisterRequest{BootMac: mac, Facts: machinefacts.Server(i)})
					cancel()
					conn.Close()
				}
				if err != nil {
					select {
					case errs <- fmt.Errorf("machine %d: %w", i, err):
					default:
					}
					return
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	t.Logf("storm: %d machines registered in %v", n, time.Since(start).Round(time.Millisecond))

	conf := filepath.Join(t.TempDir(), "admin.conf")
	if err := c.cc.Write(conf); err != nil {
		t.Fatal(err)
	}
	corral := filepath.Join(binDir, "corral")
	for _, args := range [][]string{{"get", "machines"}, {"get", "machines", "-o", "name"}, {"get", "machines", "-o", "json"}} {
		start := time.Now()
		out, err := runCmd(t, corral, append([]string{"--config", conf}, args...)...)
		took := time.Since(start)
		if err != nil {
			t.Fatalf("corral %s: %v\n%.2000s", strings.Join(args, " "), err, out)
		}
		seen := map[string]int{}
		for i := range n {
			mac := machinefacts.ServerMAC(i, 0)
			seen[inventoryMachineName(mac)] = 0
		}
		for _, line := range strings.Split(out, "\n") {
			name := ""
			switch {
			case len(args) == 2:
				if f := strings.Fields(line); len(f) > 0 && f[0] != "NAME" {
					name = f[0]
				}
			case args[3] == "name":
				name = strings.TrimPrefix(line, "machine/")
			default:
				if _, v, ok := strings.Cut(line, `"name": "`); ok && strings.HasPrefix(line, "    \"name\"") {
					name, _, _ = strings.Cut(v, `"`)
				}
			}
			if _, ok := seen[name]; ok {
				seen[name]++
			}
		}
		missing, twice := 0, 0
		for _, k := range seen {
			switch {
			case k == 0:
				missing++
			case k > 1:
				twice++
			}
		}
		if missing > 0 || twice > 0 {
			t.Errorf("corral %s: %d of %d machines missing, %d listed more than once\n%.1000s", strings.Join(args, " "), missing, n, twice, out)
		}
		t.Logf("corral %s: %d machines, %d bytes of output in %v", strings.Join(args, " "), n-missing, len(out), took.Round(time.Millisecond))
	}
	// The FULL view of one page stays under the 4 MiB default.
	resp, err := inventoryv1.NewMachineServiceClient(c.admin).ListMachines(context.Background(), &inventoryv1.ListMachinesRequest{PageSize: 1000, View: inventoryv1.MachineView_MACHINE_VIEW_FULL})
	if err != nil || len(resp.GetMachines()) != min(n, 100) || (resp.GetNextPageToken() != "") != (n > 100) {
		t.Errorf("a FULL page asked for 1000: %d machines, token %q, %v (want %d, a token when more are left)", len(resp.GetMachines()), resp.GetNextPageToken(), err, min(n, 100))
	}
}

// inventoryMachineName is the name a machine first seen by mac gets
// (inventory.MachineNameForMAC).
func inventoryMachineName(mac string) string {
	return "m-" + strings.ReplaceAll(mac, ":", "")
}
