package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

func init() {
	machineVerbs = append(machineVerbs, (*invocation).machineDeployCommand)
}

// Deploy input bounds: what the appliance accepts (lifecycle's
// MaxUserData, MaxLayoutBytes, MaxSSHKeys), checked before the call.
const (
	maxDeployUserData = 64 << 10
	maxDeployLayout   = 64 << 10
	maxDeployKeyFile  = 64 << 10
	maxDeployKeys     = 32
)

// readBounded reads the file named by flag, refusing one over limit bytes.
func readBounded(flag, path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fileErrorf(flag, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fileErrorf(flag, err)
	}
	if int64(len(b)) > limit {
		return nil, usageErrorf("%s %s: larger than %d bytes", flag, path, limit)
	}
	return b, nil
}

// sshKeyLines reads authorized_keys lines from the files given: every
// non-empty line that is not a comment.
func sshKeyLines(paths []string) ([]string, error) {
	var keys []string
	for _, p := range paths {
		b, err := readBounded("--ssh-key", p, maxDeployKeyFile)
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(string(b), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			keys = append(keys, line)
		}
	}
	if len(keys) > maxDeployKeys {
		return nil, usageErrorf("--ssh-key: %d keys, at most %d", len(keys), maxDeployKeys)
	}
	return keys, nil
}

// machineDeployCommand: corral machine deploy NAME --image I [--layout FILE] [--user-data FILE] [--ssh-key FILE]... [--hostname H] [--wait]
func (inv *invocation) machineDeployCommand() *cobra.Command {
	var image, layoutFile, userDataFile, hostname, output string
	var keyFiles []string
	var wait bool
	cmd := &cobra.Command{
		Use:   "deploy NAME --image I [--layout FILE] [--user-data FILE] [--ssh-key FILE]... [--hostname H] [--wait]",
		Short: "Deploy an operating system onto a machine allocated to you",
		Long: `deploy writes a READY OS image (corral os-image) onto an allocated machine:
its owner or an operator may. The machine becomes DEPLOYING: its discovery
agent (the machine is power-cycled into it through its BMC when one is
enrolled) checks the layout against its disks, streams the image, grows
its last partition and writes a cloud-init seed with the hostname, the SSH
keys, the user data and a static network config of the address the
appliance gave its boot NIC; the machine then boots its disk. It is
DEPLOYED when the OS has booted and phoned home, FAILED with the reason
when a step fails or a timeout passes.

--layout is a disk layout in YAML (default: the image onto the first
disk; docs/operator-guide.md, "Disk layouts"). --user-data is cloud-init
user data (at most 64 KiB; kept by the appliance for resends, never shown
again). --ssh-key names a file of authorized_keys lines, repeatable.
--wait follows the deploy until DEPLOYED (exit 0) or FAILED (exit 1).`,
		Args: argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			if image == "" {
				return usageErrorf("deploy needs --image NAME (corral get os-images)")
			}
			req := &inventoryv1.DeployMachineRequest{Name: args[0], OsImage: image, Hostname: hostname}
			if layoutFile != "" {
				b, err := readBounded("--layout", layoutFile, maxDeployLayout)
				if err != nil {
					return err
				}
				req.Layout = string(b)
			}
			if userDataFile != "" {
				b, err := readBounded("--user-data", userDataFile, maxDeployUserData)
				if err != nil {
					return err
				}
				req.UserData = b
			}
			keys, err := sshKeyLines(keyFiles)
			if err != nil {
				return err
			}
			req.SshKeys = keys
			subject := fmt.Sprintf("deploy machine %q", args[0])
			var m *inventoryv1.Machine
			if err := inv.rpc(cmd, subject, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
				m, err = inventoryv1.NewMachineServiceClient(cc).DeployMachine(ctx, req)
				return err
			}); err != nil {
				return err
			}
			if !wait {
				return printMachine(cmd, m, output)
			}
			if m, err = inv.waitDeploy(cmd, args[0], m.GetDeployment().GetDeploymentId()); err != nil {
				return err
			}
			if err := printMachine(cmd, m, output); err != nil {
				return err
			}
			if m.GetState() == inventoryv1.Machine_FAILED {
				return failf("machine %q: deploy FAILED: %s", args[0], m.GetStateReason())
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&image, "image", "", "the READY OS image to deploy (required)")
	cmd.Flags().StringVar(&layoutFile, "layout", "", "disk layout YAML file (default: the image onto the first disk)")
	cmd.Flags().StringVar(&userDataFile, "user-data", "", "cloud-init user data file (at most 64 KiB)")
	cmd.Flags().StringArrayVar(&keyFiles, "ssh-key", nil, "file of authorized_keys lines for the image's default user, repeatable")
	cmd.Flags().StringVar(&hostname, "hostname", "", "the OS's hostname (default: the machine's name)")
	cmd.Flags().BoolVar(&wait, "wait", false, "follow the deploy until DEPLOYED or FAILED (exit 1 when FAILED)")
	addOutputFlag(cmd, &output)
	return cmd
}

// waitDeploy polls machine name until deployment id is DEPLOYED or
// FAILED, printing each new step on stderr; --timeout bounds each poll,
// not the wait.
func (inv *invocation) waitDeploy(cmd *cobra.Command, name, id string) (*inventoryv1.Machine, error) {
	last := ""
	for {
		var m *inventoryv1.Machine
		if err := inv.rpc(cmd, fmt.Sprintf("get machine %q", name), func(ctx context.Context, cc *grpc.ClientConn) (err error) {
			m, err = inventoryv1.NewMachineServiceClient(cc).GetMachine(ctx, &inventoryv1.GetMachineRequest{Name: name})
			return err
		}); err != nil {
			return nil, err
		}
		d := m.GetDeployment()
		if d.GetDeploymentId() != id {
			return nil, failf("machine %q: deployment %s was replaced by %s", name, id, cmp0(d.GetDeploymentId(), "none"))
		}
		if s := deployStepWords(m); s != last {
			fmt.Fprintln(inv.app.stderr(), "machine "+name+": "+s)
			last = s
		}
		switch m.GetState() {
		case inventoryv1.Machine_DEPLOYED, inventoryv1.Machine_FAILED:
			return m, nil
		case inventoryv1.Machine_DEPLOYING:
		default:
			return m, failf("machine %q is %s: the deploy ended (%s)", name, m.GetState(), m.GetStateReason())
		}
		select {
		case <-cmd.Context().Done():
			return nil, failf("waiting for machine %q: %v", name, cmd.Context().Err())
		case <-time.After(time.Second):
		}
	}
}

// deployNotes follows describe's YAML of a machine with an OS deployment:
// where it is, and that its user data is kept but never shown.
func deployNotes(w io.Writer, m proto.Message) error {
	mm, ok := m.(*inventoryv1.Machine)
	if !ok || mm.GetDeployment() == nil {
		return nil
	}
	d := mm.GetDeployment()
	note := "# deployment " + d.GetDeploymentId() + ": " + deployStepWords(mm)
	if sum := d.GetUserDataSha256(); sum != "" {
		note += "; user data kept by the appliance, not shown (sha256 " + sum + ")"
	}
	_, err := fmt.Fprintln(w, note)
	return writeErr(err)
}

// deployStep is a deploy's step for the state column: the agent's last
// step, "written" once the OS boots, "-" before the plan's first report.
func deployStep(d *inventoryv1.Deployment) string {
	switch {
	case d.GetWrittenAt() != nil:
		return "written"
	case d.GetStep() != "":
		return d.GetStep()
	}
	return "-"
}

func cmp0(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// deployStepWords is a deploy's progress for people: the state, the
// agent's step and detail, escaped.
func deployStepWords(m *inventoryv1.Machine) string {
	d := m.GetDeployment()
	s := m.GetState().String()
	switch {
	case d.GetBootedAt() != nil:
		s += ": the OS phoned home"
	case d.GetWrittenAt() != nil:
		s += ": written, booting the OS"
	case d.GetStep() != "":
		s += ": " + d.GetStep()
		if d.GetDetail() != "" {
			s += " " + d.GetDetail()
		}
	case d.GetSentAt() != nil:
		s += ": plan sent"
	default:
		s += ": waiting for the discovery agent"
	}
	return s
}
