package inventory

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
)

// The claim rules (docs/security.md, "Claims"). A discovery report claims
// an identity: its serial number, system UUID, baseboard serial and, when
// the machine has a TPM, the endorsement key it proved it holds. Anyone on
// the boot LAN can type a serial number into a report; only a TPM proves
// anything. So a report lands on an existing record only when
//
//   - every identifier the record holds is in the report, equal
//     (identity.mismatch), and
//   - it comes from a MAC the record boots from (its boot MAC or another
//     MAC bound to it), or from a MAC the record's own earlier report
//     listed (seen booting now, so confirmed), or it proves the endorsement
//     key the record has bound (evidence).
//
// A BMC address in a report never identifies a machine by itself.
// Anything else is a conflict: the report is parked as a record of its
// own in CONFLICT, both sides are on the timeline, and an operator adopts
// or rejects it (AdoptMachine, RejectMachine). Only the boot MAC is bound
// at Register; the other MACs of a report stay unconfirmed facts.

// identity is a report's identity, each part "" where it has none (not a
// real serial, not a real UUID, no TPM).
type identity struct {
	serial, uuid, board, ek string
}

// reportIdentity reads the identity of facts; ek is the verified
// endorsement key identity ("" without a TPM proof).
func reportIdentity(facts *inventoryv1.Facts, ek string) identity {
	id := identity{ek: ek}
	if s := strings.TrimSpace(facts.GetSystem().GetSerial()); RealSerial(s) {
		id.serial = s
	}
	if u := normUUID(facts.GetSystem().GetUuid()); RealUUID(u) {
		id.uuid = u
	}
	if b := strings.TrimSpace(facts.GetBaseboard().GetSerial()); RealSerial(b) {
		id.board = b
	}
	return id
}

// held is the identity a machine record holds.
func held(m *inventoryv1.Machine) identity {
	return identity{serial: m.GetSerial(), uuid: normUUID(m.GetSystemUuid()), board: m.GetBaseboardSerial(), ek: m.GetEkIdentity()}
}

func (id identity) empty() bool { return id == identity{} }

// mismatch says why a report of identity id may not land on m, or "":
// every identifier m holds must be in the report, equal.
func (id identity) mismatch(m *inventoryv1.Machine) string {
	h := held(m)
	var bad []string
	check := func(what, have, got string) {
		switch {
		case have == "":
		case got == "":
			bad = append(bad, fmt.Sprintf("the report carries no %s (the machine has %s)", what, quoteID(have)))
		case got != have:
			bad = append(bad, fmt.Sprintf("%s %s is not the recorded %s", what, quoteID(got), quoteID(have)))
		}
	}
	check("serial", h.serial, id.serial)
	check("system UUID", h.uuid, id.uuid)
	check("baseboard serial", h.board, id.board)
	check("TPM endorsement key", h.ek, id.ek)
	return strings.Join(bad, "; ")
}

func quoteID(s string) string { return fmt.Sprintf("%q", s) }

// describe names an identity for the timeline.
func (id identity) describe() string {
	if id.empty() {
		return "no real serial, system UUID or TPM"
	}
	var p []string
	if id.serial != "" {
		p = append(p, fmt.Sprintf("serial %q", id.serial))
	}
	if id.uuid != "" {
		p = append(p, "system UUID "+id.uuid)
	}
	if id.board != "" {
		p = append(p, fmt.Sprintf("baseboard serial %q", id.board))
	}
	if id.ek != "" {
		p = append(p, "TPM key "+shortEK(id.ek))
	}
	return strings.Join(p, ", ")
}

func shortEK(ek string) string {
	if len(ek) > 16 {
		return ek[:16] + "…"
	}
	return ek
}

// evidence says whether a report from boot with identity id shows it is
// machine m beyond the identifiers anyone can type: it comes from a MAC m
// boots from or listed itself, or proves m's endorsement key.
func (id identity) evidence(m *inventoryv1.Machine, boot string) bool {
	if m.GetEkIdentity() != "" && id.ek == m.GetEkIdentity() {
		return true
	}
	if hasMAC(m, boot) {
		return true
	}
	return slices.ContainsFunc(m.GetFacts().GetNics(), func(n *inventoryv1.Facts_Nic) bool {
		mac, err := NormalizeMAC(n.GetMac())
		return err == nil && mac == boot
	})
}

// apply records the report's identity on m: what m holds already is equal
// (mismatch), what it lacks is filled.
func (id identity) apply(m *inventoryv1.Machine) {
	m.Serial = cmp.Or(m.GetSerial(), id.serial)
	if m.GetSystemUuid() == "" {
		m.SystemUuid = id.uuid
	}
	m.BaseboardSerial = cmp.Or(m.GetBaseboardSerial(), id.board)
	m.EkIdentity = cmp.Or(m.GetEkIdentity(), id.ek)
}

// ConflictName is the name of the record a report from mac is parked on:
// one per boot MAC, so a machine that keeps reporting updates one record.
func ConflictName(mac string) string {
	return "conflict-" + strings.ReplaceAll(mac, ":", "")
}
