package cli

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
)

// Annotation keys the CLI sets or reads. They are part of the API
// contract of the hypervisor services (n0stack's names where n0stack has
// one); the CLI does not import the server package that defines them.
const (
	annVMRequestNode = "n0core/provisioning/virtual_machine/request_node_name"
	annVMNodeStatus  = "corral/node_status"
)

// vmCommand groups the virtual machine verbs.
func (inv *invocation) vmCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "vm VERB",
		Aliases: []string{"vms", "virtual_machine", "virtual-machine"},
		Short:   "Create, boot, reboot, shut down, delete virtual machines and attach to their console",
		Args:    cobra.ArbitraryArgs,
		RunE:    groupRunE,
	}
	cmd.AddCommand(
		inv.vmCreateCommand(),
		inv.vmBootCommand(),
		inv.vmPowerCommand("reboot", "Reboot a virtual machine (ACPI; --hard resets it)"),
		inv.vmPowerCommand("shutdown", "Shut a virtual machine down (ACPI, then hard after the node's deadline; --hard powers it off at once)"),
		inv.vmDeleteCommand(),
		inv.vmConsoleCommand(),
	)
	return cmd
}

// metaFlags are --annotation, --label and --node of the create verbs.
type metaFlags struct {
	annotations []string
	labels      []string
	node        string
}

// register adds --annotation and --label, and --node when nodeHelp is set.
func (m *metaFlags) register(cmd *cobra.Command, nodeHelp string) {
	fs := cmd.Flags()
	fs.StringArrayVar(&m.annotations, "annotation", nil, "annotation KEY=VALUE (repeatable)")
	fs.StringArrayVar(&m.labels, "label", nil, "label KEY=VALUE (repeatable)")
	if nodeHelp != "" {
		fs.StringVar(&m.node, "node", "", nodeHelp)
	}
}

// parse returns the annotations (with --node stored under nodeKey) and
// labels; nil maps when none.
func (m *metaFlags) parse(nodeKey string) (ann, labels map[string]string, err error) {
	if ann, err = parseAnnotations(m.annotations); err != nil {
		return nil, nil, err
	}
	if labels, err = parseKeyValues("--label", m.labels); err != nil {
		return nil, nil, err
	}
	if m.node != "" {
		if strings.TrimSpace(m.node) != m.node {
			return nil, nil, usageErrorf("--node %q: surrounding spaces", m.node)
		}
		if v, ok := ann[nodeKey]; ok && v != m.node {
			return nil, nil, usageErrorf("--node %s contradicts --annotation %s=%s", m.node, nodeKey, v)
		}
		if ann == nil {
			ann = map[string]string{}
		}
		ann[nodeKey] = m.node
	}
	return ann, labels, nil
}

// requestOr returns the request flag's value, or limit when the request
// flag was not given: "--request-X defaults to --limit-X".
func requestOr[T uint32 | uint64](cmd *cobra.Command, flag string, request, limit T) T {
	if cmd.Flags().Changed(flag) {
		return request
	}
	return limit
}

// parseNIC parses --nic NETWORK[=IP[,IP]]: at most one IPv4 and one IPv6
// address, without prefix length.
func parseNIC(s string) (*provisioningv1.VirtualMachineNIC, error) {
	network, addrs, hasAddrs := strings.Cut(s, "=")
	if strings.TrimSpace(network) == "" || strings.TrimSpace(network) != network {
		return nil, usageErrorf("--nic %q: want NETWORK[=IP[,IP]]", s)
	}
	nic := &provisioningv1.VirtualMachineNIC{NetworkName: network}
	if !hasAddrs {
		return nic, nil
	}
	for _, a := range strings.Split(addrs, ",") {
		ip, err := netip.ParseAddr(a)
		if err != nil || ip.Zone() != "" {
			hint := ""
			if strings.Contains(a, "/") {
				hint = " (give the address without a prefix length; the network has the CIDR)"
			}
			return nil, usageErrorf("--nic %q: %q is not an IP address%s", s, a, hint)
		}
		ip = ip.Unmap()
		switch {
		case ip.Is4() && nic.Ipv4Address == "":
			nic.Ipv4Address = ip.String()
		case ip.Is6() && nic.Ipv6Address == "":
			nic.Ipv6Address = ip.String()
		case ip.Is4():
			return nil, usageErrorf("--nic %q: more than one IPv4 address", s)
		default:
			return nil, usageErrorf("--nic %q: more than one IPv6 address", s)
		}
	}
	return nic, nil
}

// readSSHKeyFile returns the public keys in an authorized_keys-style file:
// one per line, blank lines and # comments skipped. A file that cannot be
// read or holds no key is a usage error.
func readSSHKeyFile(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, usageErrorf("--ssh-key-file %s: no such file", path)
	case err != nil:
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, usageErrorf("--ssh-key-file %s: %v", path, err)
	}
	var keys []string
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "-----BEGIN") {
			return nil, usageErrorf("--ssh-key-file %s holds a private key; give the public key (.pub)", path)
		}
		keys = append(keys, line)
	}
	if len(keys) == 0 {
		return nil, usageErrorf("--ssh-key-file %s holds no key", path)
	}
	return keys, nil
}

// vmCreateCommand: corral vm create NAME --limit-cpu-milli-core N
// --limit-memory-bytes SIZE [--disk BS]... [--nic NETWORK[=IP]]... ...
func (inv *invocation) vmCreateCommand() *cobra.Command {
	var (
		meta               metaFlags
		output, login, id  string
		reqCPU, limCPU     uint32
		reqMem, limMem     uint64
		disks, nics, files []string
	)
	cmd := &cobra.Command{
		Use:   "create NAME --limit-cpu-milli-core N --limit-memory-bytes SIZE [--disk BS]... [--nic NETWORK[=IP]]... [flags]",
		Short: "Create a virtual machine and boot it, and print it",
		Long: `create books compute on a node (--node, else the node of its disks, else one
corrald schedules), attaches the block storages in --disk order (the first
boots), reserves an interface per --nic, and boots the VM with a cloud-init
seed (--login-user, --ssh-key-file). vCPUs = limit-cpu-milli-core/1000;
memory request must equal its limit. A --request-X flag defaults to its
--limit-X flag.`,
		Args: argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			ann, labels, err := meta.parse(annVMRequestNode)
			if err != nil {
				return err
			}
			req := &provisioningv1.CreateVirtualMachineRequest{
				Name:                args[0],
				Annotations:         ann,
				Labels:              labels,
				RequestCpuMilliCore: requestOr(cmd, "request-cpu-milli-core", reqCPU, limCPU),
				LimitCpuMilliCore:   limCPU,
				RequestMemoryBytes:  requestOr(cmd, "request-memory-bytes", reqMem, limMem),
				LimitMemoryBytes:    limMem,
				Uuid:                id,
				LoginUsername:       login,
			}
			if limCPU == 0 {
				return usageErrorf("--limit-cpu-milli-core must be positive (1000 per vCPU)")
			}
			if limMem == 0 {
				return usageErrorf("--limit-memory-bytes must be positive")
			}
			for _, d := range disks {
				if strings.TrimSpace(d) == "" {
					return usageErrorf("--disk needs a block storage name")
				}
				req.BlockStorageNames = append(req.BlockStorageNames, d)
			}
			for _, s := range nics {
				nic, err := parseNIC(s)
				if err != nil {
					return err
				}
				req.Nics = append(req.Nics, nic)
			}
			for _, f := range files {
				keys, err := readSSHKeyFile(f)
				if err != nil {
					return err
				}
				req.SshAuthorizedKeys = append(req.SshAuthorizedKeys, keys...)
			}
			var vm *provisioningv1.VirtualMachine
			if err := inv.rpc(cmd, "create "+virtualMachineKind.subject(args[0]), func(ctx context.Context, cc *grpc.ClientConn) (err error) {
				vm, err = provisioningv1.NewVirtualMachineServiceClient(cc).CreateVirtualMachine(ctx, req)
				return err
			}); err != nil {
				return err
			}
			return printRecord(cmd, virtualMachineKind, vm, output)
		},
	}
	fs := cmd.Flags()
	fs.Uint32Var(&limCPU, "limit-cpu-milli-core", 0, "CPU limit in thousandths of a core, a multiple of 1000 (vCPUs = limit/1000)")
	fs.Uint32Var(&reqCPU, "request-cpu-milli-core", 0, "CPU to book on the node (default: the limit)")
	fs.Var(sizeValue{&limMem}, "limit-memory-bytes", "memory: bytes or a size such as 512MiB, 4GiB, 4G (=4*10^9)")
	fs.Var(sizeValue{&reqMem}, "request-memory-bytes", "memory to book (default: the limit; must equal it)")
	fs.StringArrayVar(&disks, "disk", nil, "block storage to attach, in boot order (repeatable)")
	fs.StringArrayVar(&nics, "nic", nil, "interface on NETWORK, with a fixed address if =IP[,IP] is given (repeatable)")
	fs.StringVar(&login, "login-user", "", "user cloud-init creates with the --ssh-key-file keys")
	fs.StringArrayVar(&files, "ssh-key-file", nil, "authorized_keys-style file of public keys for the login user (repeatable)")
	fs.StringVar(&id, "uuid", "", "SMBIOS UUID (default: derived from the name)")
	meta.register(cmd, "node to run on (sets the "+annVMRequestNode+" annotation)")
	addOutputFlag(cmd, &output)
	markRequired(cmd, "limit-cpu-milli-core", "limit-memory-bytes")
	return cmd
}

// vmRecordCommand is a verb NAME that makes one call returning the VM and
// prints it.
func (inv *invocation) vmRecordCommand(use, short, what string,
	call func(ctx context.Context, c provisioningv1.VirtualMachineServiceClient, name string) (*provisioningv1.VirtualMachine, error)) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			var vm *provisioningv1.VirtualMachine
			if err := inv.rpc(cmd, what+" "+virtualMachineKind.subject(args[0]), func(ctx context.Context, cc *grpc.ClientConn) (err error) {
				vm, err = call(ctx, provisioningv1.NewVirtualMachineServiceClient(cc), args[0])
				return err
			}); err != nil {
				return err
			}
			return printRecord(cmd, virtualMachineKind, vm, output)
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

func (inv *invocation) vmBootCommand() *cobra.Command {
	return inv.vmRecordCommand("boot NAME", "Boot (start) a virtual machine and print it", "boot",
		func(ctx context.Context, c provisioningv1.VirtualMachineServiceClient, name string) (*provisioningv1.VirtualMachine, error) {
			return c.BootVirtualMachine(ctx, &provisioningv1.BootVirtualMachineRequest{Name: name})
		})
}

// vmPowerCommand is reboot or shutdown, with --hard.
func (inv *invocation) vmPowerCommand(verb, short string) *cobra.Command {
	var hard bool
	cmd := inv.vmRecordCommand(verb+" NAME [--hard]", short, verb,
		func(ctx context.Context, c provisioningv1.VirtualMachineServiceClient, name string) (*provisioningv1.VirtualMachine, error) {
			if verb == "reboot" {
				return c.RebootVirtualMachine(ctx, &provisioningv1.RebootVirtualMachineRequest{Name: name, Hard: hard})
			}
			return c.ShutdownVirtualMachine(ctx, &provisioningv1.ShutdownVirtualMachineRequest{Name: name, Hard: hard})
		})
	cmd.Flags().BoolVar(&hard, "hard", false, "skip ACPI: reset or power off at once")
	return cmd
}

func (inv *invocation) vmDeleteCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a virtual machine: stop it, free its compute and addresses, detach its disks (kept)",
		Args:  argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := inv.rpc(cmd, "delete "+virtualMachineKind.subject(args[0]), func(ctx context.Context, cc *grpc.ClientConn) error {
				_, err := provisioningv1.NewVirtualMachineServiceClient(cc).DeleteVirtualMachine(ctx, &provisioningv1.DeleteVirtualMachineRequest{Name: args[0]})
				return err
			}); err != nil {
				return err
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "%s/%s deleted\n", virtualMachineKind.name, args[0])
			return writeErr(err)
		},
	}
}

func (inv *invocation) vmConsoleCommand() *cobra.Command {
	var output string
	var readOnly, take, vnc bool
	cmd := &cobra.Command{
		Use:   "console NAME",
		Short: "Attach to a virtual machine's serial console (through its node and the appliance); ~. detaches",
		Long: `console attaches to a virtual machine's serial console. corrald keeps one
session per VM, its serial port reached through the node it runs on, shared
by several viewers: one writer at a time, the others read-only. It first
prints the VM's last output (up to 1 MiB kept by corrald), then what it
prints live.

When standard input is a terminal it is put in raw mode: every key goes to
the VM. Type ~. at the start of a line (after Enter) to detach, and ~~ to
send one ~. --read-only watches without typing; --take takes the write
side from the operator holding it. Needs the operator role; attach, take
and detach are recorded in the audit stream.

--vnc prints the VM's graphical console (VNC) endpoint on its node
instead, as the node reports it.`,
		Args: argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !vnc {
				if cmd.Flags().Changed("output") {
					return usageErrorf("-o is for --vnc: the serial console is a terminal")
				}
				if readOnly && take {
					return usageErrorf("--take is for a writer: drop --read-only")
				}
				return inv.runConsole(cmd, vmConsole(args[0]), readOnly, take)
			}
			if readOnly || take {
				return usageErrorf("--read-only and --take are for the serial console: drop --vnc")
			}
			if err := checkFormat(output); err != nil {
				return err
			}
			var resp *provisioningv1.OpenConsoleResponse
			if err := inv.rpc(cmd, "console of "+virtualMachineKind.subject(args[0]), func(ctx context.Context, cc *grpc.ClientConn) (err error) {
				resp, err = provisioningv1.NewVirtualMachineServiceClient(cc).OpenConsole(ctx, &provisioningv1.OpenConsoleRequest{Name: args[0]})
				return err
			}); err != nil {
				return err
			}
			if output != formatTable {
				return printRecords(cmd.OutOrStdout(), &kind{name: "console"}, []proto.Message{resp}, false, output)
			}
			if resp.GetConsoleUrl() == "" {
				return failf("console of %s: corrald returned no endpoint", virtualMachineKind.subject(args[0]))
			}
			_, err := fmt.Fprintln(cmd.OutOrStdout(), oneLine(resp.GetConsoleUrl()))
			return writeErr(err)
		},
	}
	addOutputFlag(cmd, &output)
	cmd.Flags().BoolVar(&readOnly, "read-only", false, "watch the serial console without typing")
	cmd.Flags().BoolVar(&take, "take", false, "take the serial console's write side from the operator holding it")
	cmd.Flags().BoolVar(&vnc, "vnc", false, "print the VNC endpoint on the node instead of attaching")
	return cmd
}
