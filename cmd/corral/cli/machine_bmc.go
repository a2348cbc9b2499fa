package cli

import (
	"fmt"
	"io"
	"strings"
	"time"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// powerCell renders a machine's power state with how long ago it was read:
// "ON 42s", "OFF 3m", "UNKNOWN 2h"; just the state when never read.
func powerCell(st inventoryv1.PowerState, at *timestamppb.Timestamp, now time.Time) string {
	s := stateName(st.String(), "POWER_STATE_")
	if at == nil {
		return s
	}
	return s + " " + shortAge(now.Sub(at.AsTime()))
}

// shortAge is a duration in its largest whole unit: 9s, 42m, 3h, 12d.
func shortAge(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// powerStatusLine is the human answer of power verbs.
func powerStatusLine(name string, ps *inventoryv1.PowerStatus) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: power %s", name, stateName(ps.GetState().String(), "POWER_STATE_"))
	if ps.GetProvider() != "" {
		fmt.Fprintf(&b, " (via %s)", ps.GetProvider())
	}
	if ps.GetNote() != "" {
		fmt.Fprintf(&b, "; %s", ps.GetNote())
	}
	return b.String()
}

// bmcCertificate says how a machine's BMC certificate is checked: "pinned
// sha256 HEX", "insecure (not verified)", "not pinned ..." for a Redfish
// BMC enrolled before pinning (its calls are refused), and "" when the
// machine has no Redfish BMC (IPMI has no certificate).
func bmcCertificate(m *inventoryv1.Machine) string {
	b := m.GetBmc()
	switch {
	case b.GetTlsInsecure():
		return "insecure (not verified)"
	case b.GetTlsSha256() != "":
		return "pinned sha256 " + b.GetTlsSha256()
	// "gofish" is the provider the appliance records for Redfish
	// (inventory.RedfishProviderName; the CLI does not link inventory).
	case b.GetUsername() != "" && (b.GetProtocol() == inventoryv1.BmcProtocol_BMC_PROTOCOL_REDFISH || b.GetProvider() == "gofish"):
		return "not pinned (enrolled before BMC certificates were pinned: enroll it again)"
	}
	return ""
}

// describeNotes follows a described record's YAML with what its fields do
// not say plainly, as YAML comments (the output stays valid YAML): for a
// machine, how its BMC certificate is checked.
func describeNotes(w io.Writer, m proto.Message) error {
	mm, ok := m.(*inventoryv1.Machine)
	if !ok {
		return nil
	}
	if c := bmcCertificate(mm); c != "" {
		if _, err := fmt.Fprintf(w, "# bmc certificate: %s\n", c); err != nil {
			return writeErr(err)
		}
	}
	if k := mm.GetBmc().GetConsoleHostKey(); k != "" {
		if _, err := fmt.Fprintf(w, "# bmc console host key: pinned %s\n", k); err != nil {
			return writeErr(err)
		}
	}
	if f := mm.GetFacts(); f != nil {
		if _, err := fmt.Fprintf(w, "# secure boot: %s\n", secureBootNote(f)); err != nil {
			return writeErr(err)
		}
	}
	if err := commissionNotes(w, mm, true); err != nil { // machine_commission.go
		return err
	}
	if e := eraseNote(mm); e != "" { // machine_alloc.go
		_, err := fmt.Fprintf(w, "# erase: %s\n", e)
		return writeErr(err)
	}
	return nil
}

// secureBootNote is the machine's Secure Boot state as its agent last
// reported it (facts.secure_boot, facts.lockdown).
func secureBootNote(f *inventoryv1.Facts) string {
	var s string
	switch f.GetSecureBoot() {
	case inventoryv1.Facts_SECURE_BOOT_ENABLED:
		s = "enabled"
	case inventoryv1.Facts_SECURE_BOOT_DISABLED:
		s = "disabled"
	case inventoryv1.Facts_SECURE_BOOT_UNSPECIFIED:
		s = "unknown (not reported: BIOS boot, or the agent could not tell)"
	default:
		s = "unknown"
	}
	if l := f.GetLockdown(); l != "" {
		s += ", kernel lockdown " + l
	}
	return s
}
