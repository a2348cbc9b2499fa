package appliance

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"time"

	consolev1 "github.com/corralhq/corral/api/console/v1"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/auth"
	hvappliance "github.com/corralhq/corral/hypervisor/appliance"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/internal/termsafe"
	"github.com/corralhq/corral/inventory/bmc"
	"github.com/corralhq/corral/ipmi/console"
	"github.com/corralhq/corral/ipmi/sol"
	"github.com/corralhq/corral/ipmi/sshcon"
)

// consoleAttachMethod is the method the audit records console steps under.
const consoleAttachMethod = consolev1.ConsoleService_Attach_FullMethodName

// initConsole serves machines' and virtual machines' serial consoles
// (docs/architecture.md, "Machine consoles"): a hub each, as components.
// A machine's link is IPMI Serial-over-LAN (ipmi/sol) or, for a Redfish
// BMC, SSH to the BMC's serial console (ipmi/sshcon), with its sealed BMC
// credentials, opened here and used in this process only; a VM's is its
// serial port through its node (HypervisorService.SerialConsole).
func (s *Server) initConsole() error {
	srv := &console.Server{Who: consoleWho}
	if s.bmc != nil {
		h, err := console.New(console.Config{Link: machineLink{bmc: s.bmc, runner: s.consoleRunner, log: s.log.With("component", "console")}, Auditor: consoleAudit{s}, Logger: s.log.With("component", "console")})
		if err != nil {
			return err
		}
		s.inv.OnDelete(func(_ context.Context, m *inventoryv1.Machine) { h.Forget(m.GetName()) })
		s.addComponent("console", h.Run)
		srv.Hub = h
	}
	if s.vms != nil {
		link := &vmLink{vms: s.vms, seen: map[string]string{}}
		h, err := console.New(console.Config{Link: link, Kind: "virtual machine", Auditor: vmConsoleAudit{s},
			Logger: s.log.With("component", "vm-console")})
		if err != nil {
			return err
		}
		link.hub = h
		s.addComponent("vm-console", h.Run)
		srv.VMs = h
	}
	if srv.Hub == nil && srv.VMs == nil {
		return nil
	}
	console.Register(s.grpc, srv)
	return nil
}

// machineLink opens a machine's console over the transport its BMC
// takes (inventory/bmc.ConsoleTarget): IPMI Serial-over-LAN, or SSH to a
// Redfish BMC's serial console with its host key pinned.
type machineLink struct {
	bmc *bmc.Service
	// runner refuses a machine another appliance of the fleet runs (nil:
	// none does).
	runner func(machine string) error
	log    *slog.Logger
	// sshTimeout, in tests, bounds the SSH connect (default: the BMC
	// call timeout).
	sshTimeout time.Duration
}

func (l machineLink) Check(ctx context.Context, machine string) error {
	if l.runner != nil {
		if err := l.runner(machine); err != nil {
			return err
		}
	}
	_, err := l.bmc.ConsoleTarget(ctx, machine)
	return err
}

// consoleRunner refuses, in a fleet, a console this appliance does not
// run: a BMC takes one SOL session at a time, so two appliances' hubs
// would take the machine's console from each other. The appliance the
// leader gave the machine to (the one that polls its power) serves it.
func (s *Server) consoleRunner(machine string) error {
	if s.owns(machine) {
		return nil
	}
	if s.runner != nil {
		if r, ok := s.runner(machine); ok {
			return apierr.Preconditionf("machine %s's console is served by appliance %q, which runs its BMC work in this fleet: attach through that appliance", machine, r)
		}
	}
	return apierr.Unavailablef("machine %s is not assigned to an appliance of this fleet yet: try again in a few seconds", machine)
}

func (l machineLink) Run(ctx context.Context, machine string, in io.Reader, out io.Writer, up func()) error {
	con, err := l.bmc.ConsoleTarget(ctx, machine)
	if err != nil {
		return err
	}
	t := con.Target
	if con.Transport == bmc.ConsoleSOL {
		return sol.Stream(ctx, sol.Target{Host: t.Host, Port: int(t.Port), Username: t.Username, Password: t.Password,
			CipherSuite: int(t.CipherSuite), ConnectTimeout: t.Timeout, Ready: up}, in, out)
	}
	// A Redfish BMC: where its SSH console is, read over Redfish (the
	// certificate pinned), then SSH to the BMC with its host key pinned
	// before the password goes.
	sc, err := l.bmc.SSHConsole(ctx, machine, con)
	if err != nil {
		return err
	}
	if l.log != nil {
		l.log.Info("console over SSH to the BMC", "machine", machine, "bmc", t.Host, "port", sc.Port, "source", sc.Source,
			"entry_command", termsafe.Escape(sc.EntryCommand), "hot_key", termsafe.Escape(sc.HotKey))
	}
	err = sshcon.Stream(ctx, sshcon.Target{Host: t.Host, Port: sc.Port, Username: t.Username, Password: t.Password,
		HostKey: con.HostKey, EntryCommand: sc.EntryCommand, ConnectTimeout: cmp.Or(l.sshTimeout, t.Timeout), Ready: up,
		Pin: func(fp string) error { return l.bmc.PinConsoleHostKey(ctx, machine, con, fp) }}, in, out)
	var he *sshcon.HostKeyError
	var bhe *bmc.HostKeyError
	switch {
	case errors.As(err, &he) && he.Pinned != "":
		l.bmc.NoteConsoleHostKeyRefused(ctx, machine, he.Pinned, he.Presented)
		return &bmc.HostKeyError{Machine: machine, Pinned: he.Pinned, Presented: he.Presented}
	case errors.As(err, &bhe):
		// Pinned concurrently to another key than this BMC presents.
		l.bmc.NoteConsoleHostKeyRefused(ctx, machine, bhe.Pinned, bhe.Presented)
		return err
	case errors.Is(err, sshcon.ErrAuth):
		return fmt.Errorf("machine %s: %w: %w", machine, bmc.ErrAuth, err)
	case errors.Is(err, sshcon.ErrInvalid):
		return fmt.Errorf("machine %s: %w: %w", machine, apierr.ErrPrecondition, err)
	}
	return err
}

// consoleAudit records viewers' steps in the audit stream.
type consoleAudit struct{ s *Server }

func (a consoleAudit) ConsoleAction(ctx context.Context, machine string, act console.Action) {
	if a.s.audit != nil {
		a.s.audit.Note(ctx, consoleAttachMethod, machine, act.String())
	}
}

// vmLink opens a VM's serial port through its node. A VM deleted and
// created again under its name is another VM: the hub's session of the
// old one (its scrollback, its viewers) is dropped when the new one is
// first attached, told apart by UUID.
type vmLink struct {
	vms *hvappliance.Services
	hub *console.Hub

	mu   sync.Mutex
	seen map[string]string // VM name → the UUID the hub's session is of
}

func (l *vmLink) Check(ctx context.Context, vm string) error {
	id, err := l.vms.CheckSerialConsole(ctx, vm)
	if err != nil {
		return err
	}
	l.mu.Lock()
	prev, ok := l.seen[vm]
	l.seen[vm] = id
	l.mu.Unlock()
	if ok && prev != id {
		l.hub.Forget(vm)
	}
	return nil
}

func (l *vmLink) Run(ctx context.Context, vm string, in io.Reader, out io.Writer, up func()) error {
	return l.vms.SerialConsole(ctx, vm, in, out, up)
}

// vmConsoleAudit records VM console viewers' steps in the audit stream.
type vmConsoleAudit struct{ s *Server }

func (a vmConsoleAudit) ConsoleAction(ctx context.Context, vm string, act console.Action) {
	if a.s.audit != nil {
		a.s.audit.NoteVM(ctx, consoleAttachMethod, vm, act.String())
	}
}

// consoleWho names a viewer to the others as the audit does: its token
// or certificate, never a secret.
func consoleWho(ctx context.Context) string {
	p, ok := auth.FromContext(ctx)
	switch {
	case !ok:
		return "another viewer"
	case p.ID != "":
		return "token:" + p.ID + " (" + strconv.Quote(p.Subject) + ")"
	default:
		return "cert:" + p.Subject
	}
}
