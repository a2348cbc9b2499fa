package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	consolev1 "github.com/corralhq/corral/api/console/v1"
)

func init() { machineVerbs = append(machineVerbs, (*invocation).consoleCommand) }

// consoleCommand: corral machine console NAME [--read-only] [--take]
func (inv *invocation) consoleCommand() *cobra.Command {
	var readOnly, take bool
	cmd := &cobra.Command{
		Use:   "console NAME",
		Short: "Attach to a machine's serial console (Serial-over-LAN or the Redfish BMC's SSH console, through the appliance); ~. detaches",
		Long: `console attaches to a machine's serial console. corrald keeps one session per
machine over IPMI Serial-over-LAN, or for a Redfish BMC over SSH to the BMC's
serial console (its host key pinned at the first link; see corral machine bmc
forget-hostkey), shared by several viewers: one writer at a time, the others
read-only. It first prints the machine's last output (up to
1 MiB kept by corrald), then what it prints live.

When standard input is a terminal it is put in raw mode: every key goes to
the machine. Type ~. at the start of a line (after Enter) to detach, and ~~
to send one ~. Standard input may be a pipe: its bytes go to the machine,
and its end detaches a writer (a read-only viewer stays until interrupted).

--read-only watches without typing (keys are not sent). Without it the
console is refused while another operator writes; --take takes the write
side from them (they become read-only and are told). Needs the operator
role; attach, take and detach are recorded in the audit stream.`,
		Args:              argsBetween(1, 1),
		ValidArgsFunction: inv.completeNames(machineKind),
		RunE: func(cmd *cobra.Command, args []string) error {
			if readOnly && take {
				return usageErrorf("--take is for a writer: drop --read-only")
			}
			return inv.runConsole(cmd, machineConsole(args[0]), readOnly, take)
		},
	}
	cmd.Flags().BoolVar(&readOnly, "read-only", false, "watch the console without typing")
	cmd.Flags().BoolVar(&take, "take", false, "take the write side from the operator holding it")
	return cmd
}

// errDetached ends a console the user detached from (~.).
var errDetached = errors.New("detached")

// consoleTarget is whose console a viewer attaches to.
type consoleTarget struct {
	open *consolev1.ConsoleOpen // machine or vm set
	kind string                 // "machine", "virtual machine"
	link string                 // what the serial link reaches: "the BMC", "the node"
}

func machineConsole(name string) consoleTarget {
	return consoleTarget{open: &consolev1.ConsoleOpen{Machine: name}, kind: "machine", link: "the BMC"}
}

func vmConsole(name string) consoleTarget {
	return consoleTarget{open: &consolev1.ConsoleOpen{Vm: name}, kind: "virtual machine", link: "the node"}
}

func (inv *invocation) runConsole(cmd *cobra.Command, target consoleTarget, readOnly, take bool) error {
	cc, err := inv.connect(cmd.Flags())
	if err != nil {
		return err
	}
	name := cmp.Or(target.open.GetMachine(), target.open.GetVm())
	subject := fmt.Sprintf("console of %s %q", target.kind, name)
	ctx, cancel := context.WithCancelCause(cmd.Context())
	defer cancel(nil)
	stream, err := consolev1.NewConsoleServiceClient(cc).Attach(ctx)
	if err != nil {
		return inv.callError(subject, err)
	}
	mode := consolev1.ConsoleMode_CONSOLE_MODE_WRITE
	if readOnly {
		mode = consolev1.ConsoleMode_CONSOLE_MODE_READ_ONLY
	}
	open := &consolev1.ConsoleOpen{Machine: target.open.GetMachine(), Vm: target.open.GetVm(), Mode: mode, Take: take}
	if err := stream.Send(&consolev1.ConsoleInput{Input: &consolev1.ConsoleInput_Open{Open: open}}); err != nil {
		return inv.consoleEnd(subject, err)
	}
	stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
	in := cmd.InOrStdin()
	nl := "\n"
	if f, ok := in.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		old, err := term.MakeRaw(int(f.Fd()))
		if err != nil {
			return failf("console: raw terminal: %v", err)
		}
		defer func() { _ = term.Restore(int(f.Fd()), old) }()
		nl = "\r\n"
	}
	var watching atomic.Bool // keys are not sent
	watching.Store(readOnly)
	go func() {
		err := consoleInput(in, func(p []byte) error {
			if watching.Load() {
				return nil
			}
			return stream.Send(&consolev1.ConsoleInput{Input: &consolev1.ConsoleInput_Data{Data: p}})
		})
		switch {
		case errors.Is(err, errDetached):
			cancel(errDetached)
		case err == nil && watching.Load():
			// A read-only viewer's input ends (a pipe, /dev/null): it
			// watches on until interrupted.
		default:
			_ = stream.CloseSend()
		}
	}()
	for {
		out, err := stream.Recv()
		if err != nil {
			if errors.Is(context.Cause(ctx), errDetached) {
				fmt.Fprintf(stderr, "%s[detached from %s]%s", nl, name, nl)
				return nil
			}
			return inv.consoleEnd(subject, err)
		}
		if len(out.GetData()) > 0 {
			if _, err := stdout.Write(out.GetData()); err != nil {
				return writeErr(err)
			}
		}
		switch out.GetEvent() {
		case consolev1.ConsoleEvent_CONSOLE_EVENT_ATTACHED:
			fmt.Fprintf(stderr, "[attached to %s's console, %s; ~. detaches]%s", name, out.GetDetail(), nl)
		case consolev1.ConsoleEvent_CONSOLE_EVENT_WRITE_TAKEN:
			watching.Store(true)
			fmt.Fprintf(stderr, "%s[%s took the write side: read-only now]%s", nl, out.GetDetail(), nl)
		case consolev1.ConsoleEvent_CONSOLE_EVENT_LINK_DOWN:
			fmt.Fprintf(stderr, "%s[link to %s down: %s; corrald retries]%s", nl, target.link, out.GetDetail(), nl)
		case consolev1.ConsoleEvent_CONSOLE_EVENT_LINK_UP:
			fmt.Fprintf(stderr, "%s[link to %s up again]%s", nl, target.link, nl)
		default:
			// LIVE and data: nothing to say.
		}
	}
}

// consoleEnd phrases how a console stream ended: its close (nil) or the
// appliance's status.
func (inv *invocation) consoleEnd(subject string, err error) error {
	if errors.Is(err, io.EOF) {
		return nil
	}
	return inv.callError(subject, err)
}

// consoleInput reads in and hands what to send to send, watching for the
// escape: ~. at the start of a line detaches (errDetached), ~~ sends one
// ~. It returns nil at the end of in.
func consoleInput(in io.Reader, send func([]byte) error) error {
	buf := make([]byte, 1024)
	lineStart, tilde := true, false
	for {
		n, err := in.Read(buf)
		out := make([]byte, 0, n+1)
		for _, b := range buf[:n] {
			switch {
			case tilde:
				tilde = false
				switch b {
				case '.':
					if len(out) > 0 {
						if err := send(out); err != nil {
							return err
						}
					}
					return errDetached
				case '~':
					out = append(out, '~')
				default:
					out = append(out, '~', b)
				}
				lineStart = b == '\r' || b == '\n'
			case lineStart && b == '~':
				tilde = true
			default:
				out = append(out, b)
				lineStart = b == '\r' || b == '\n'
			}
		}
		if len(out) > 0 {
			if err := send(out); err != nil {
				return err
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}
