package cli

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

func init() { machineVerbs = append(machineVerbs, (*invocation).enrollCommand) }

// parseBMCProtocol maps --bmc-protocol to the API enum.
func parseBMCProtocol(s string) (inventoryv1.BmcProtocol, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "auto":
		return inventoryv1.BmcProtocol_BMC_PROTOCOL_AUTO, nil
	case "ipmi":
		return inventoryv1.BmcProtocol_BMC_PROTOCOL_IPMI, nil
	case "redfish":
		return inventoryv1.BmcProtocol_BMC_PROTOCOL_REDFISH, nil
	}
	return 0, usageErrorf("--bmc-protocol %q is not supported (valid: ipmi, redfish, auto)", s)
}

// providerProtocol names the protocol a BMC provider speaks: gofish is
// Redfish, the others (native-ipmi, ipmitool) IPMI.
func providerProtocol(provider string) string {
	if provider == "gofish" {
		return "Redfish"
	}
	return "IPMI"
}

// readPasswordFile reads a BMC password from path (one line; a trailing
// newline is dropped) and returns a warning when others may read the file.
func readPasswordFile(path string) (pw, warning string, err error) {
	if path == "" {
		return "", "", usageErrorf("--bmc-password-file is required (the password is never taken on the command line)")
	}
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", "", usageErrorf("--bmc-password-file %s: no such file", path)
	}
	if err != nil {
		return "", "", fileErrorf("--bmc-password-file", err)
	}
	if fi.IsDir() {
		return "", "", usageErrorf("--bmc-password-file %s is a directory", path)
	}
	if fi.Mode().Perm()&0o004 != 0 {
		warning = fmt.Sprintf("warning: BMC password file %s is world-readable (mode %04o); chmod 600 it", path, fi.Mode().Perm())
	} else if fi.Mode().Perm()&0o040 != 0 {
		warning = fmt.Sprintf("warning: BMC password file %s is group-readable (mode %04o); chmod 600 it", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", warning, fileErrorf("--bmc-password-file", err)
	}
	pw = strings.TrimRight(string(b), "\r\n")
	if pw == "" {
		return "", warning, usageErrorf("--bmc-password-file %s is empty", path)
	}
	if strings.ContainsAny(pw, "\r\n") {
		return "", warning, usageErrorf("--bmc-password-file %s holds more than one line", path)
	}
	return pw, warning, nil
}

// enrollCommand: corral machine enroll NAME --bmc ADDR[:PORT] ...
func (inv *invocation) enrollCommand() *cobra.Command {
	var bmc, user, pwFile, protocol, mac, output, tlsPin string
	var cipher uint32
	var insecure, rotate bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "enroll NAME --bmc ADDR[:PORT] --bmc-user USER --bmc-password-file FILE [--bmc-protocol ipmi|redfish] [--bmc-tls-sha256 HEX | --bmc-insecure] [--bmc-rotate]",
		Short: "Attach a BMC to a machine (created DISCOVERED if unknown); the credentials are checked against the BMC first",
		Long: `enroll checks the BMC credentials against the BMC, then stores them sealed.

A Redfish BMC's TLS certificate is pinned: its SHA-256 is stored on the
machine and every later call (power, boot device, the power poller) accepts
that certificate only. --bmc-tls-sha256 gives the certificate to expect
(checked before the password is sent; 'openssl x509 -noout -fingerprint
-sha256' prints it); without it, enrolling a machine again at the same BMC
address keeps its pin, and otherwise the certificate the BMC presents now is
trusted and pinned (trust on first use). --bmc-insecure skips the check, and
'corral describe machine NAME' says so. IPMI has no certificate.`,
		Args: argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			if bmc == "" {
				return usageErrorf("--bmc ADDR[:PORT] is required")
			}
			if user == "" {
				return usageErrorf("--bmc-user is required")
			}
			proto_, err := parseBMCProtocol(protocol)
			if err != nil {
				return err
			}
			if cipher > 17 {
				return usageErrorf("--bmc-cipher %d: IPMI cipher suites are 0-17 (0: try 17, then 3)", cipher)
			}
			if insecure && tlsPin != "" {
				return usageErrorf("--bmc-insecure and --bmc-tls-sha256 exclude each other: pin a certificate or opt out of checking it")
			}
			pw, warning, err := readPasswordFile(pwFile)
			if warning != "" {
				fmt.Fprintln(cmd.ErrOrStderr(), warning)
			}
			if err != nil {
				return err
			}
			req := &inventoryv1.EnrollMachineRequest{Name: args[0], BmcAddress: bmc, BmcProtocol: proto_, BmcUsername: user,
				BmcPassword: pw, BmcCipherSuite: cipher, BootMac: mac, TimeoutMs: uint32(timeout.Milliseconds()),
				BmcInsecure: insecure, BmcTlsSha256: tlsPin}
			var m *inventoryv1.Machine
			err = inv.rpc(cmd, fmt.Sprintf("enroll machine %q", args[0]), func(ctx context.Context, cc *grpc.ClientConn) error {
				var err error
				m, err = inventoryv1.NewMachineServiceClient(cc).EnrollMachine(ctx, req)
				return err
			})
			if err != nil {
				return err
			}
			if b := m.GetBmc(); b.GetProvider() != "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "machine %s: BMC %s answered over %s (provider %s)\n", m.GetName(), b.GetAddress(), providerProtocol(b.GetProvider()), b.GetProvider())
			}
			if rotate {
				if m, err = inv.rotateAfterEnroll(cmd, m); err != nil {
					return err
				}
			}
			return printRecords(cmd.OutOrStdout(), machineKind, []proto.Message{m}, false, output)
		},
	}
	f := cmd.Flags()
	f.StringVar(&bmc, "bmc", "", "BMC address: host, host:port or [v6]:port")
	f.StringVar(&user, "bmc-user", "", "BMC user name")
	f.StringVar(&pwFile, "bmc-password-file", "", "file holding the BMC password (one line; keep it mode 0600)")
	f.StringVar(&protocol, "bmc-protocol", "auto", "ipmi, redfish or auto (IPMI on 623, then Redfish on 443; a port in --bmc is used for both)")
	f.Uint32Var(&cipher, "bmc-cipher", 0, "IPMI cipher suite (0: try 17, then 3)")
	f.StringVar(&mac, "mac", "", "the machine's boot MAC, when known (binds its boot timeline)")
	f.DurationVar(&timeout, "bmc-timeout", 10*time.Second, "bound on the credential check")
	f.BoolVar(&rotate, "bmc-rotate", false, "then make Corral's own BMC account with a random password and use it (corral machine bmc rotate; IPMI)")
	f.StringVar(&tlsPin, "bmc-tls-sha256", "", "Redfish: SHA-256 of the BMC's certificate to pin, 64 hex digits (colons allowed); default: keep the machine's pin, else pin the certificate presented now")
	f.BoolVar(&insecure, "bmc-insecure", false, "Redfish: do not verify the BMC's certificate (explicit opt-out, shown by describe)")
	addOutputFlag(cmd, &output)
	return cmd
}
