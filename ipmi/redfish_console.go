package ipmi

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/redfish"
)

// SerialConsole is how a Redfish BMC serves its system's serial console
// over SSH, as the BMC describes it.
type SerialConsole struct {
	// Source says where it was read: "system" (ComputerSystem
	// SerialConsole.SSH, schema v1.13 and later) or "manager" (an older
	// Manager's SerialConsole with SSH among its connect types, on the
	// port of the manager's SSH service).
	Source string
	// Enabled is the BMC's ServiceEnabled.
	Enabled bool
	// Port is the SSH port (22 when the BMC names none).
	Port int
	// EntryCommand is typed at the BMC's shell to reach the console
	// (ConsoleEntryCommand; "" for none).
	EntryCommand string
	// HotKey describes the BMC's own key sequence that leaves the console
	// (HotKeySequenceDisplay), for the operator.
	HotKey string
	// SharedWithManagerCLI: the SSH service is the manager's CLI too.
	SharedWithManagerCLI bool
}

// Bounds of what a BMC says of its serial console.
const (
	maxConsoleText = 256
)

// SerialConsoleSSH reads how the BMC serves its (first) system's serial
// console over SSH: the system's SerialConsole.SSH when the BMC has one,
// else the first manager's SerialConsole when it lists SSH (on its SSH
// service's port). A BMC that offers neither is ErrFailed; texts longer
// than 256 bytes are ErrProtocol. It opens nothing but the Redfish
// session (certificate checked as for every Redfish call).
func (c *Controller) SerialConsoleSSH(ctx context.Context, t Target) (SerialConsole, Answer, error) {
	var out SerialConsole
	a, err := c.doRedfish(ctx, t, "serial-console", "a serial console", func(cl *gofish.APIClient) error {
		sys, err := firstSystem(cl)
		if err != nil {
			return err
		}
		ssh := sys.SerialConsole.SSH
		if ssh.Port != 0 || ssh.ServiceEnabled || ssh.ConsoleEntryCommand != "" {
			out = SerialConsole{Source: "system", Enabled: ssh.ServiceEnabled, Port: ssh.Port, EntryCommand: ssh.ConsoleEntryCommand,
				HotKey: ssh.HotKeySequenceDisplay, SharedWithManagerCLI: ssh.SharedWithManagerCLI}
			return checkSerialConsole(&out)
		}
		managers, err := cl.Service.Managers()
		if err != nil {
			return err
		}
		slices.SortFunc(managers, func(a, b *redfish.Manager) int { return strings.Compare(a.ODataID, b.ODataID) })
		for _, m := range managers {
			if !slices.Contains(m.SerialConsole.ConnectTypesSupported, redfish.SSHSerialConnectTypesSupported) {
				continue
			}
			out = SerialConsole{Source: "manager", Enabled: m.SerialConsole.ServiceEnabled, SharedWithManagerCLI: true}
			if np, err := m.NetworkProtocol(); err == nil && np != nil {
				out.Port = int(np.SSH.Port)
				out.Enabled = out.Enabled && (np.SSH.ProtocolEnabled || np.SSH.Port == 0)
			}
			return checkSerialConsole(&out)
		}
		return fmt.Errorf("%w: the BMC describes no serial console over SSH (neither the system's SerialConsole.SSH nor a manager's SerialConsole with SSH)", ErrFailed)
	})
	return out, a, err
}

// checkSerialConsole bounds what the BMC said and fills the default port.
func checkSerialConsole(s *SerialConsole) error {
	if s.Port == 0 {
		s.Port = 22
	}
	if s.Port < 1 || s.Port > 65535 {
		return fmt.Errorf("%w: serial console port %d", ErrProtocol, s.Port)
	}
	if len(s.EntryCommand) > maxConsoleText || len(s.HotKey) > maxConsoleText {
		return fmt.Errorf("%w: the serial console's entry command or hot key text is over %d bytes", ErrProtocol, maxConsoleText)
	}
	return nil
}
