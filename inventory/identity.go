package inventory

import (
	"strings"
)

// placeholderSerials are values vendors ship in SMBIOS instead of a serial.
var placeholderSerials = map[string]bool{
	"to be filled by o.e.m.": true, "to be filled by oem": true, "default string": true,
	"0123456789": true, "123456789": true, "1234567890": true, "not specified": true,
	"not applicable": true, "none": true, "n/a": true, "na": true, "oem": true,
	"system serial number": true, "chassis serial number": true, "base board serial number": true,
	"serial number": true, "unknown": true, "invalid": true, "empty": true, "x": true,
}

// placeholderUUIDs are SMBIOS UUIDs that do not identify a machine.
var placeholderUUIDs = map[string]bool{
	"00000000-0000-0000-0000-000000000000": true,
	"ffffffff-ffff-ffff-ffff-ffffffffffff": true,
	"03000200-0400-0500-0006-000700080009": true, // common AMI firmware default
}

// RealSerial reports whether s is a serial number that identifies a
// machine: not empty, not a vendor placeholder, not one repeated character.
func RealSerial(s string) bool {
	s = strings.TrimSpace(s)
	if s == "" || placeholderSerials[strings.ToLower(s)] {
		return false
	}
	return !allSame(s)
}

// RealUUID reports whether u is a system UUID that identifies a machine.
func RealUUID(u string) bool {
	u = strings.ToLower(strings.TrimSpace(u))
	if u == "" || placeholderUUIDs[u] {
		return false
	}
	return !allSame(strings.ReplaceAll(u, "-", ""))
}

func allSame(s string) bool {
	for i := 1; i < len(s); i++ {
		if s[i] != s[0] {
			return false
		}
	}
	return true
}

// normUUID lower-cases a UUID for comparison and indexing.
func normUUID(u string) string { return strings.ToLower(strings.TrimSpace(u)) }
