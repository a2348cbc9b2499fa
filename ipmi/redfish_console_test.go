package ipmi_test

import (
	"context"
	"errors"
	"testing"

	"github.com/corralhq/corral/ipmi"
	"github.com/corralhq/corral/testsupport/redfishtest"
)

// TestRedfishSerialConsoleSSH: the system's SerialConsole.SSH as the test
// server describes it (port, entry command, hot key, shared); an older
// BMC's manager SerialConsole with the port of its SSH service; an IPMI
// target is refused without a Redfish call.
func TestRedfishSerialConsoleSSH(t *testing.T) {
	t.Parallel()
	rf := redfishtest.Start(t, "root", "calvin", &redfishtest.MemMachine{})
	c := ipmi.New(ipmi.Config{})
	ctx := context.Background()
	rf.Console.Configure(redfishtest.SerialConsoleConfig{Enabled: true, EntryCommand: "console 1", HotKey: "ESC ("})
	sc, a, err := c.SerialConsoleSSH(ctx, redfishTarget(rf))
	want := ipmi.SerialConsole{Source: "system", Enabled: true, Port: rf.Console.Port, EntryCommand: "console 1", HotKey: "ESC (", SharedWithManagerCLI: true}
	if err != nil || sc != want || a.Provider != ipmi.RedfishProviderName {
		t.Fatalf("system: %+v (%s) %v, want %+v", sc, a, err, want)
	}
	rf.Console.Configure(redfishtest.SerialConsoleConfig{Enabled: false})
	if sc, _, err = c.SerialConsoleSSH(ctx, redfishTarget(rf)); err != nil || sc.Enabled {
		t.Fatalf("disabled: %+v %v", sc, err)
	}
	rf.Console.Configure(redfishtest.SerialConsoleConfig{Enabled: true, ManagerOnly: true})
	sc, _, err = c.SerialConsoleSSH(ctx, redfishTarget(rf))
	want = ipmi.SerialConsole{Source: "manager", Enabled: true, Port: rf.Console.Port, SharedWithManagerCLI: true}
	if err != nil || sc != want {
		t.Fatalf("manager: %+v %v, want %+v", sc, err, want)
	}
	tg := redfishTarget(rf)
	tg.Protocol = ipmi.ProtocolIPMI
	if _, _, err := c.SerialConsoleSSH(ctx, tg); !errors.Is(err, ipmi.ErrNotRedfish) {
		t.Fatalf("IPMI target: %v", err)
	}
}
