package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/status"

	"github.com/corralhq/corral/deploy"
)

// DefaultTaskTimeout bounds each task of `corral do` unless --task-timeout
// (or an explicit --timeout) says otherwise: fetching an image or creating
// a VM takes longer than the 30 s of a single-call verb.
const DefaultTaskTimeout = 10 * time.Minute

func (inv *invocation) doCommand() *cobra.Command {
	var (
		parallel    int
		taskTimeout time.Duration
		quiet       bool
	)
	cmd := &cobra.Command{
		Use:   "do FILE",
		Short: "Run a DAG file of API calls (n0cli format)",
		Long: `do runs the tasks of an n0cli-compatible DAG file (- reads stdin):

  TaskName:
    type: Network            # resource: Node, Network, BlockStorage,
                             # VirtualMachine, Image, Machine, ... (or
                             # node, block_storage, ...)
    action: ApplyNetwork     # the RPC name
    args:                    # the RPC's request, proto field names
      name: lan
      ipv4_cidr: 10.0.0.0/24
    depends_on: [OtherTask]  # start after these ended well
    ignore_error: true       # a failure counts as done; dependents run

The whole file is checked first (unknown keys at any depth, unknown type,
action or field, missing dependency, cycle); a file with a problem lists every
problem and runs nothing (exit 2).

Tasks whose dependencies have ended run at once, at most --parallel at a time.
On the first failure without ignore_error no task is started, tasks in flight
are waited for, the rest are skipped, and do exits 1. An interrupt stops the
same way and cancels the calls in flight. Each task's call has its own
deadline, --task-timeout (an explicit --timeout is used when --task-timeout is
not given). One line is printed per task event, then a summary; a task's
response follows its line as one line of JSON unless --quiet.`,
		Args: argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if parallel < 1 {
				return usageErrorf("--parallel must be at least 1, got %d", parallel)
			}
			timeout := taskTimeout
			if !cmd.Flags().Changed("task-timeout") && cmd.Flags().Changed("timeout") {
				timeout = inv.timeout
			}
			if timeout <= 0 {
				return usageErrorf("--task-timeout must be positive, got %v", timeout)
			}
			file := inputName(args[0])
			data, err := readInput(cmd.InOrStdin(), args[0])
			if err != nil {
				return err
			}
			plan, err := deploy.DefaultRegistry().Parse(data)
			if err != nil {
				var pe *deploy.ParseError
				if !errors.As(err, &pe) {
					return usageErrorf("%s: %v", file, err)
				}
				if len(pe.Problems) == 1 {
					return usageErrorf("%s: %s; nothing was run", file, pe.Problems[0])
				}
				for _, p := range pe.Problems {
					fmt.Fprintf(cmd.ErrOrStderr(), "%s: %s\n", file, p)
				}
				return usageErrorf("%s: %d problems (listed above); nothing was run", file, len(pe.Problems))
			}

			cc, err := inv.connect(cmd.Flags())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			var werr error
			r := &deploy.Runner{
				Conn:        cc,
				Parallel:    parallel,
				TaskTimeout: timeout,
				Progress: func(e deploy.Event) {
					if werr == nil {
						werr = printEvent(out, e, quiet)
					}
				},
			}
			s, runErr := r.Run(cmd.Context(), plan)
			if s != nil && werr == nil {
				_, werr = fmt.Fprintf(out, "%d succeeded, %d failed, %d ignored failures, %d skipped of %d tasks in %s\n",
					s.Succeeded, s.Failed, s.Ignored, s.Skipped, len(s.Results), seconds(s.Elapsed))
			}
			if runErr != nil {
				return failf("%s: %v", file, runErr)
			}
			return writeErr(werr)
		},
	}
	f := cmd.Flags()
	f.IntVarP(&parallel, "parallel", "p", deploy.DefaultParallel, "tasks running at once")
	f.DurationVar(&taskTimeout, "task-timeout", DefaultTaskTimeout, "deadline of each task's call")
	f.BoolVarP(&quiet, "quiet", "q", false, "do not print the tasks' responses")
	return cmd
}

// printEvent writes one progress line (and the response of a succeeded
// task unless quiet).
func printEvent(w io.Writer, e deploy.Event, quiet bool) error {
	t := e.Task
	prefix := fmt.Sprintf("[%d/%d]", e.Done, e.Total)
	if e.Kind == deploy.Started {
		_, err := fmt.Fprintf(w, "%s %s started (%s %s)\n", prefix, t.Name, t.Method.Type, t.Action)
		return err
	}
	if e.Kind == deploy.Retrying && len(e.After) > 0 {
		_, err := fmt.Fprintf(w, "%s %s: %s; again once %s ended (attempt %d)\n", prefix, t.Name, rpcMessage(e.Err), strings.Join(e.After, ", "), e.Attempt+1)
		return err
	}
	if e.Kind == deploy.Retrying {
		_, err := fmt.Fprintf(w, "%s %s: %s; again in %s (attempt %d; gives up at %s)\n", prefix, t.Name, rpcMessage(e.Err), seconds(e.Wait), e.Attempt+1, e.GiveUp.Format(time.TimeOnly))
		return err
	}
	res := e.Result
	var err error
	switch res.Outcome {
	case deploy.Succeeded:
		_, err = fmt.Fprintf(w, "%s %s done in %s\n", prefix, t.Name, seconds(res.Elapsed))
		if err == nil && !quiet {
			err = printResponse(w, res)
		}
	case deploy.Failed:
		_, err = fmt.Fprintf(w, "%s %s failed after %s: %s\n", prefix, t.Name, seconds(res.Elapsed), rpcMessage(res.Err))
	case deploy.IgnoredFailure:
		_, err = fmt.Fprintf(w, "%s %s ignored failure after %s: %s\n", prefix, t.Name, seconds(res.Elapsed), rpcMessage(res.Err))
	case deploy.Skipped:
		_, err = fmt.Fprintf(w, "%s %s skipped: %s\n", prefix, t.Name, res.Reason)
	case deploy.NotRun: // no result yet: nothing to print
	}
	return err
}

func printResponse(w io.Writer, res *deploy.Result) error {
	if res.Response == nil {
		return nil
	}
	b, err := protoJSON(res.Response)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return err
	}
	if buf.String() == "{}" {
		return nil
	}
	_, err = fmt.Fprintf(w, "    %s\n", buf.Bytes())
	return err
}

// rpcMessage phrases a task's RPC error as "message (Code)".
func rpcMessage(err error) string {
	if st, ok := status.FromError(err); ok {
		return oneLine(fmt.Sprintf("%s (%s)", st.Message(), st.Code()))
	}
	return oneLine(err.Error())
}

func seconds(d time.Duration) string {
	return fmt.Sprintf("%.2fs", d.Seconds())
}
