package bmc

import (
	"context"
	"errors"
	"fmt"
	"strings"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/inventory"
)

// ConsoleTransport is how a machine's serial console is reached.
type ConsoleTransport int

// The transports: IPMI 2.0 Serial-over-LAN, or SSH to a Redfish BMC's
// serial console service.
const (
	ConsoleSOL ConsoleTransport = iota + 1
	ConsoleRedfishSSH
)

func (t ConsoleTransport) String() string {
	switch t {
	case ConsoleSOL:
		return "IPMI Serial-over-LAN"
	case ConsoleRedfishSSH:
		return "Redfish serial console over SSH"
	}
	return fmt.Sprintf("console transport %d", int(t))
}

// Console says how to reach one machine's serial console: the transport,
// the BMC with its opened password, and for SSH the pinned host key.
type Console struct {
	Target
	Transport ConsoleTransport
	// HostKey is the SSH host key pinned for the BMC's serial console
	// (Bmc.console_host_key: "SHA256:..."); "" until the first link.
	HostKey string
}

// SerialConsoleSSH is how a Redfish BMC says it serves the serial
// console over SSH (ComputerSystem SerialConsole.SSH, or an older
// manager's SerialConsole).
type SerialConsoleSSH struct {
	// Source is "system" or "manager" (where it was read).
	Source       string
	Enabled      bool
	Port         int
	EntryCommand string
	HotKey       string
	Shared       bool
}

// ConsoleReader reads a Redfish BMC's serial console service; cmd wires
// the ipmi package to it. Errors are classified as Driver's are.
type ConsoleReader interface {
	SerialConsoleSSH(ctx context.Context, t Target) (SerialConsoleSSH, Result, error)
}

// FlagConsoleHostKeyChanged starts a machine flag set when its BMC's SSH
// serial console presents a host key other than the pinned one. While it
// is set the console is refused without contacting the BMC; it is
// cleared by ForgetConsoleHostKey and by enrolling the machine at another
// BMC address.
const FlagConsoleHostKeyChanged = "bmc-console-host-key-changed"

// ErrHostKey means a BMC's SSH serial console presented a host key other than
// the pinned one; no credential was sent. Errors of this class are
// *HostKeyError.
var ErrHostKey = apierr.New(apierr.ErrPrecondition, "BMC SSH host key not trusted")

// HostKeyError is a refused SSH host key of a machine's BMC console.
type HostKeyError struct {
	Machine   string
	Pinned    string
	Presented string
}

func (e *HostKeyError) Error() string {
	return fmt.Sprintf("machine %s: its BMC's serial console presented SSH host key %s, not the pinned %s: refused, the password was not sent. "+
		"If the key changed on purpose (a new BMC, a factory reset), check it on the BMC and run `corral machine bmc forget-hostkey %s --expect %s` to pin the next one",
		e.Machine, e.Presented, e.Pinned, e.Machine, e.Pinned)
}

// Unwrap makes errors.Is(err, ErrHostKey) hold.
func (e *HostKeyError) Unwrap() error { return ErrHostKey }

// isRedfish reports whether b is reached over Redfish.
func isRedfish(b *inventoryv1.Bmc) bool {
	return b.GetProtocol() == inventoryv1.BmcProtocol_BMC_PROTOCOL_REDFISH ||
		(b.GetProtocol() == inventoryv1.BmcProtocol_BMC_PROTOCOL_AUTO && b.GetProvider() == RedfishProviderName)
}

// ConsoleTarget returns how to reach machine's serial console without
// contacting its BMC: IPMI Serial-over-LAN for an IPMI BMC (an AUTO one
// answered over IPMI included), the BMC's SSH serial console for a
// Redfish one (Config.Consoles must be set). A machine without an
// enrolled BMC, a Redfish BMC whose console host key was refused (until
// ForgetConsoleHostKey), or one with an unpinned certificate is
// apierr.ErrPrecondition; an unknown machine is the inventory's
// not-found. The password is for the caller's session only: never
// logged, stored or sent elsewhere.
func (c *Service) ConsoleTarget(ctx context.Context, name string) (Console, error) {
	m, t, err := c.target(ctx, name)
	if err != nil {
		return Console{}, err
	}
	b := m.GetBmc()
	if t.Host == "" {
		return Console{}, fmt.Errorf("machine %q: %w", name, apierr.ErrPrecondition)
	}
	if isRedfish(b) {
		if c.cfg.Consoles == nil {
			return Console{}, apierr.Preconditionf("machine %q's BMC is reached over Redfish, and this appliance serves no Redfish serial console", name)
		}
		if f := flagWith(m.GetFlags(), FlagConsoleHostKeyChanged); f != "" {
			return Console{}, hostKeyFlagError(name, b.GetConsoleHostKey(), f)
		}
		return Console{Target: t, Transport: ConsoleRedfishSSH, HostKey: b.GetConsoleHostKey()}, nil
	}
	if t.Port == 0 {
		t.Port = defaultBMCPort(inventoryv1.BmcProtocol_BMC_PROTOCOL_IPMI)
	}
	return Console{Target: t, Transport: ConsoleSOL}, nil
}

// hostKeyFlagError is the refusal a FlagConsoleHostKeyChanged flag
// stands for.
func hostKeyFlagError(name, pinned, flag string) error {
	_, presented, _ := strings.Cut(flag, ", presented ")
	return &HostKeyError{Machine: name, Pinned: pinned, Presented: presented}
}

// SSHConsole asks machine's Redfish BMC how it serves the serial console
// over SSH (under the call timeout, its certificate checked as for every
// Redfish call). A service the BMC reports disabled is
// apierr.ErrPrecondition.
func (c *Service) SSHConsole(ctx context.Context, name string, con Console) (SerialConsoleSSH, error) {
	if c.cfg.Consoles == nil || con.Transport != ConsoleRedfishSSH {
		return SerialConsoleSSH{}, apierr.Preconditionf("machine %q: no Redfish serial console", name)
	}
	m, err := c.inv.GetMachine(ctx, name)
	if err != nil {
		return SerialConsoleSSH{}, err
	}
	cctx, cancel := context.WithTimeout(ctx, con.Timeout)
	sc, res, err := c.cfg.Consoles.SerialConsoleSSH(cctx, con.Target)
	cancel()
	c.noteCertificate(ctx, m, res)
	if err != nil {
		return SerialConsoleSSH{}, fmt.Errorf("machine %s: serial console: %w", name, err)
	}
	if !sc.Enabled {
		where := "SerialConsole.SSH.ServiceEnabled"
		if sc.Source == "manager" {
			where = "the manager's SerialConsole.ServiceEnabled (or its SSH service)"
		}
		return sc, apierr.Preconditionf("machine %s: its BMC reports the serial console over SSH disabled (%s is false): enable it on the BMC", name, where)
	}
	return sc, nil
}

// PinConsoleHostKey stores fingerprint as the machine's console host key
// when none is pinned (trust on first use), by compare-and-swap: it
// succeeds when the pin is fingerprint afterwards, and is a *HostKeyError
// when another key is pinned (by a concurrent link, say). A BMC enrolled
// again at another address since con was read is apierr.ErrPrecondition.
// The first pin is on the machine's timeline.
func (c *Service) PinConsoleHostKey(ctx context.Context, name string, con Console, fingerprint string) error {
	if !strings.HasPrefix(fingerprint, "SHA256:") || len(fingerprint) > 64 {
		return apierr.Invalidf("SSH host key fingerprint %q: want SHA256:<base64>", fingerprint)
	}
	var pinned bool
	m, err := c.inv.UpdateMachine(context.WithoutCancel(ctx), name, func(m *inventoryv1.Machine) error {
		pinned = false
		b := m.GetBmc()
		if b.GetAddress() != con.Host || b.GetPort() != con.Port && b.GetPort() != 0 {
			return apierr.Preconditionf("machine %s's BMC was enrolled again meanwhile: attach again", name)
		}
		switch cur := b.GetConsoleHostKey(); cur {
		case fingerprint:
			return errSkip
		case "":
			b.ConsoleHostKey = fingerprint
			pinned = true
			return nil
		default:
			return &HostKeyError{Machine: name, Pinned: cur, Presented: fingerprint}
		}
	})
	switch {
	case errors.Is(err, errSkip):
		return nil
	case err != nil:
		return err
	case pinned:
		c.event(m, "console-host-key-pinned", "BMC serial console SSH host key "+fingerprint+" pinned (trust on first use)", Result{})
		c.log.Info("BMC console host key pinned", "machine", name, "bmc", con.String(), "host_key", fingerprint)
	}
	return nil
}

// NoteConsoleHostKeyRefused records a refused console host key: the
// machine's FlagConsoleHostKeyChanged flag (written only when it
// changes), a timeline entry and a warning, once per change.
func (c *Service) NoteConsoleHostKeyRefused(ctx context.Context, name, pinned, presented string) {
	flag := fmt.Sprintf("%s: pinned %s, presented %s", FlagConsoleHostKeyChanged, pinned, presented)
	m, err := c.inv.UpdateMachine(context.WithoutCancel(ctx), name, func(m *inventoryv1.Machine) error {
		if m.GetBmc().GetConsoleHostKey() != pinned || flagWith(m.GetFlags(), FlagConsoleHostKeyChanged) == flag {
			return errSkip
		}
		m.Flags = append(withoutFlag(m.GetFlags(), FlagConsoleHostKeyChanged), flag)
		return nil
	})
	switch {
	case errors.Is(err, errSkip):
	case err != nil:
		c.log.Warn("could not record the console host key flag", "machine", name, "err", err)
	default:
		he := &HostKeyError{Machine: name, Pinned: pinned, Presented: presented}
		c.event(m, FlagConsoleHostKeyChanged, he.Error(), Result{})
		c.log.Warn("BMC console host key changed: refused", "machine", name, "pinned", pinned, "presented", presented)
	}
}

// ForgetConsoleHostKey clears machine's console host key pin and its
// FlagConsoleHostKeyChanged flag by compare-and-swap, so the next console
// link pins what the BMC presents then. With expect set, a machine that
// pins another key (or none) is refused. It returns the machine and the
// pin cleared ("" when none was); the change is on the timeline.
func (c *Service) ForgetConsoleHostKey(ctx context.Context, name, expect string) (*inventoryv1.Machine, string, error) {
	if err := inventory.CheckName(name); err != nil {
		return nil, "", err
	}
	var was string
	m, err := c.inv.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		b := m.GetBmc()
		was = b.GetConsoleHostKey()
		if b.GetAddress() == "" {
			return apierr.Preconditionf("machine %q has no enrolled BMC", name)
		}
		if expect != "" && was != expect {
			return apierr.Preconditionf("machine %s pins console host key %q, not %s: nothing changed", name, was, expect)
		}
		if was == "" && flagWith(m.GetFlags(), FlagConsoleHostKeyChanged) == "" {
			return errSkip
		}
		b.ConsoleHostKey = ""
		m.Flags = withoutFlag(m.GetFlags(), FlagConsoleHostKeyChanged)
		return nil
	})
	if errors.Is(err, errSkip) {
		m, err = c.inv.GetMachine(ctx, name)
		return m, "", err
	}
	if err != nil {
		return nil, "", err
	}
	detail := "BMC serial console SSH host key pin cleared: the next console link pins the key presented then"
	if was != "" {
		detail = "BMC serial console SSH host key " + was + " forgotten: the next console link pins the key presented then"
	}
	c.event(m, "console-host-key-forgotten", detail, Result{})
	c.log.Info("BMC console host key forgotten", "machine", name, "host_key", was)
	return m, was, nil
}
