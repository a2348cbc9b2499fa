package inventory

import (
	"errors"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"google.golang.org/protobuf/proto"
)

// FactCaps bound what one machine's reports may hold of the appliance: a
// report's encoded size and its lists, and the fact history kept per
// machine. They are corrald flags (docs/security.md, "Report caps"); a
// zero field takes its default (DefaultFactCaps), a negative one is no cap.
type FactCaps struct {
	// ReportBytes caps a report's encoded (protobuf) size.
	ReportBytes int
	// Disks, DIMMs, NICs and PCIDevices cap a report's lists: disks,
	// memory modules, network interfaces, and PCI devices (pci_devices and
	// missing_drivers each).
	Disks, DIMMs, NICs, PCIDevices int
	// HistoryEntries and HistoryBytes cap a machine's fact history (the
	// oldest changes go first; TrimFactHistory).
	HistoryEntries, HistoryBytes int
}

// DefaultFactCaps are the caps of a zero FactCaps. A real report is a few
// KiB (a 2-socket server with 24 DIMMs, 12 disks and 6 NICs: about 8 KiB);
// the list caps sit above the largest servers sold (a 90-bay storage
// chassis, 48 DIMM slots, a host with SR-IOV functions listed as PCI
// devices) and below what would let one machine weigh on the inventory.
var DefaultFactCaps = FactCaps{
	ReportBytes:    256 << 10,
	Disks:          256,
	DIMMs:          256,
	NICs:           128,
	PCIDevices:     1024,
	HistoryEntries: 500,
	HistoryBytes:   256 << 10,
}

// withDefaults fills c's zero fields from DefaultFactCaps.
func (c FactCaps) withDefaults() FactCaps {
	d := DefaultFactCaps
	for _, f := range []struct {
		v   *int
		def int
	}{
		{&c.ReportBytes, d.ReportBytes}, {&c.Disks, d.Disks}, {&c.DIMMs, d.DIMMs}, {&c.NICs, d.NICs},
		{&c.PCIDevices, d.PCIDevices}, {&c.HistoryEntries, d.HistoryEntries}, {&c.HistoryBytes, d.HistoryBytes},
	} {
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	return c
}

// Reasons a report is refused, the bounded label values of the refusal
// counter (Config.ReportRefused, corral_report_refusals_total).
const (
	RefusedReportBytes = "report_bytes"
	RefusedDisks       = "disks"
	RefusedDIMMs       = "dimms"
	RefusedNICs        = "nics"
	RefusedPCIDevices  = "pci_devices"
	RefusedString      = "string"  // too long, or not UTF-8
	RefusedControl     = "control" // control characters (internal/termsafe)
	RefusedInvalid     = "invalid" // anything else: no facts, a malformed MAC
	// RefusedUnacceptedCap: a report that would make a new machine while
	// Config.MaxUnaccepted machines wait to be accepted.
	RefusedUnacceptedCap = "unaccepted_cap"
)

// RefusalReasons lists every reason, for a counter to register them all.
var RefusalReasons = []string{RefusedReportBytes, RefusedDisks, RefusedDIMMs, RefusedNICs, RefusedPCIDevices, RefusedString, RefusedControl, RefusedInvalid, RefusedUnacceptedCap}

// ReportError is a report refused by a cap or a check: its class is
// apierr.ErrInvalid (InvalidArgument at the API edge), Reason is one of
// RefusalReasons, and the message names the cap and its flag.
type ReportError struct {
	Reason string
	err    error
}

func (e *ReportError) Error() string { return e.err.Error() }
func (e *ReportError) Unwrap() error { return e.err }

func reportErr(reason, format string, a ...any) error {
	return &ReportError{Reason: reason, err: apierr.Invalidf(format, a...)}
}

// Check returns a *ReportError when f is over one of c's caps (zero fields
// meaning the defaults), or fails CheckFacts's checks of strings and
// MACs. It never modifies f.
func (c FactCaps) Check(f *inventoryv1.Facts) error {
	if f == nil {
		return reportErr(RefusedInvalid, "facts are required")
	}
	c = c.withDefaults()
	if n := proto.Size(f); over(n, c.ReportBytes) {
		return reportErr(RefusedReportBytes, "the report is %d bytes, over the %d-byte cap (corrald --max-report-bytes)", n, c.ReportBytes)
	}
	for _, l := range []struct {
		reason, what, flag string
		n, limit           int
	}{
		{RefusedDisks, "disks", "--max-report-disks", len(f.GetDisks()), c.Disks},
		{RefusedDIMMs, "memory modules (DIMMs)", "--max-report-dimms", len(f.GetMemory().GetDimms()), c.DIMMs},
		{RefusedNICs, "NICs", "--max-report-nics", len(f.GetNics()), c.NICs},
		{RefusedPCIDevices, "PCI devices", "--max-report-pci-devices", len(f.GetPciDevices()), c.PCIDevices},
		{RefusedPCIDevices, "PCI devices without a driver", "--max-report-pci-devices", len(f.GetMissingDrivers()), c.PCIDevices},
	} {
		if over(l.n, l.limit) {
			return reportErr(l.reason, "the report lists %d %s, over the cap of %d (corrald %s)", l.n, l.what, l.limit, l.flag)
		}
	}
	if err := checkStrings("facts", f.ProtoReflect()); err != nil {
		return err
	}
	if _, ok := inventoryv1.Facts_SecureBoot_name[int32(f.GetSecureBoot())]; !ok {
		return reportErr(RefusedInvalid, "secure_boot %d is not a known state", int32(f.GetSecureBoot()))
	}
	switch f.GetLockdown() {
	case "", "none", "integrity", "confidentiality":
	default:
		return reportErr(RefusedInvalid, "lockdown %q is not none, integrity or confidentiality", f.GetLockdown())
	}
	if err := checkLLDP(f); err != nil { // lldp.go
		return err
	}
	for i, n := range f.GetNics() {
		if n.GetMac() == "" {
			continue
		}
		if _, err := NormalizeMAC(n.GetMac()); err != nil {
			return reportErr(RefusedInvalid, "nics[%d].mac %q is not a MAC address", i, n.GetMac())
		}
	}
	return nil
}

func over(n, limit int) bool { return limit > 0 && n > limit }

// CheckReport is the check Register makes of a report: FactCaps.Check
// with the caps of Config.FactCaps. A refusal is counted
// (Config.ReportRefused, by reason) and logged at a bounded rate; nothing
// is stored. Safe for concurrent use.
func (i *Inventory) CheckReport(bootMAC string, f *inventoryv1.Facts) error {
	err := i.cfg.FactCaps.Check(f)
	if err == nil {
		return nil
	}
	reason := RefusedInvalid
	var re *ReportError
	if errors.As(err, &re) {
		reason = re.Reason
	}
	if i.cfg.ReportRefused != nil {
		i.cfg.ReportRefused(reason)
	}
	if n, ok := i.refusals.Allow(); ok {
		i.log.Warn("report refused", "mac", bootMAC, "reason", reason, "err", err, "suppressed", n)
	}
	return err
}

// TrimFactHistory returns h with its oldest entries dropped until at most
// maxEntries remain and their encoded sizes add up to at most maxBytes (a
// non-positive maximum is no cap). The newest entry is dropped too when it
// alone is over maxBytes. h's backing array is reused.
func TrimFactHistory(h []*inventoryv1.FactChange, maxEntries, maxBytes int) []*inventoryv1.FactChange {
	if maxEntries > 0 && len(h) > maxEntries {
		h = h[len(h)-maxEntries:]
	}
	if maxBytes <= 0 {
		return h
	}
	total, start := 0, len(h)
	for start > 0 {
		n := proto.Size(h[start-1])
		if total+n > maxBytes {
			break
		}
		total += n
		start--
	}
	return h[start:]
}

// trimHistory keeps a fact history within the configured caps.
func (i *Inventory) trimHistory(h []*inventoryv1.FactChange) []*inventoryv1.FactChange {
	return TrimFactHistory(h, i.cfg.FactCaps.HistoryEntries, i.cfg.FactCaps.HistoryBytes)
}
