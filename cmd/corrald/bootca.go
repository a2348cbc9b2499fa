package main

import (
	"encoding/pem"
	"fmt"
	"path/filepath"

	"github.com/corralhq/corral/appliance"
	"github.com/corralhq/corral/auth/pki"
	"github.com/spf13/cobra"
)

// newBootCACmd is `corrald boot-ca`: the boot CA that UEFI HTTPS boot
// firmware must trust (--https-boot-listen), printed for enrolment.
func newBootCACmd(g *globals) *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "boot-ca",
		Short: "Print the boot CA that UEFI HTTPS boot firmware must trust (made the first time)",
		Long: `Print the boot CA, the RSA certificate authority of the HTTPS boot
listener (--https-boot-listen), for enrolment in each machine's firmware:
its setup menu's TLS certificate page, a BMC's HTTP boot certificate API,
EDK2's TlsCaCertificate variable, or QEMU's fw_cfg file
etc/edk2/https/cacerts for OVMF. It is made in the data directory the
first time (pki/boot) and kept; it is a CA of its own, not the
appliance's (firmware TLS has no elliptic curves), and it signs only the
HTTPS boot certificate.

--format pem (default), der, or esl (an EFI_SIGNATURE_LIST, binary: the
form the variable and fw_cfg take). der and esl are binary: redirect them
to a file.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var out func(der []byte) []byte
			switch format {
			case "pem":
				out = func(der []byte) []byte { return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}) }
			case "der":
				out = func(der []byte) []byte { return der }
			case "esl":
				out = pki.EFISignatureList
			default:
				return fmt.Errorf("--format %q: want pem, der or esl", format)
			}
			ca, err := pki.EnsureBootCA(filepath.Join(g.dataDir, appliance.BootCADir))
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(out(ca.CertDER()))
			return err
		},
	}
	cmd.Flags().StringVar(&format, "format", "pem", "pem, der or esl (EFI_SIGNATURE_LIST)")
	return cmd
}
