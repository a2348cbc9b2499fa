// Package ovmfvars writes boot entries into an empty OVMF variable store,
// so an end-to-end test can make the firmware boot a chosen network path
// (UEFI HTTP boot over IPv4 or IPv6) first, as an operator would from the
// firmware's setup screen.
package ovmfvars

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"unicode/utf16"
)

// OVMF's variable store (the OVMF_VARS file) is a firmware volume whose
// body is an authenticated variable store: its header, then variables
// back to back, the free space erased to 0xFF. HTTPBootVars writes two
// variables into an empty one, as the firmware itself would: Boot0080, a
// load option for the UEFI HTTPv4 boot of one NIC, and BootNext = 0x0080,
// so the firmware's boot manager starts it before its BootOrder (UEFI
// 2.10 §3.1.2). The device path is the one EDK2's HttpBootDxe gives the
// NIC's HTTPv4 child (PciRoot/Pci/MAC/IPv4 all zeros/Uri empty), so the
// boot manager finds its LoadFile protocol by an exact match.

// authVarStoreGUID is gEfiAuthenticatedVariableGuid, the signature of the
// variable store header (MdeModulePkg/Include/Guid/VariableFormat.h).
var authVarStoreGUID = guidLE("aaf32c78-947b-439a-a180-2e144ec37792")

// efiGlobalVariable is EFI_GLOBAL_VARIABLE, the vendor GUID of Boot####.
var efiGlobalVariable = guidLE("8be4df61-93ca-11d2-aa0d-00e098032b8c")

// guidLE is a GUID in its mixed-endian in-memory layout.
func guidLE(s string) []byte {
	var a, b, c uint64
	var d [8]byte
	if _, err := fmt.Sscanf(s, "%08x-%04x-%04x-%02x%02x-%02x%02x%02x%02x%02x%02x", &a, &b, &c,
		&d[0], &d[1], &d[2], &d[3], &d[4], &d[5], &d[6], &d[7]); err != nil {
		panic(err)
	}
	out := binary.LittleEndian.AppendUint32(nil, uint32(a))
	out = binary.LittleEndian.AppendUint16(out, uint16(b))
	out = binary.LittleEndian.AppendUint16(out, uint16(c))
	return append(out, d[:]...)
}

func dpNode(typ, sub byte, body []byte) []byte {
	n := []byte{typ, sub, 0, 0}
	binary.LittleEndian.PutUint16(n[2:], uint16(4+len(body)))
	return append(n, body...)
}

// httpDevicePath is the device path of the HTTP boot of the NIC mac in
// PCI slot slot of the root bus, over IPv4 or (v6) IPv6, with its
// address and URI from DHCP, as OVMF's HttpBootDxe makes it.
func httpDevicePath(mac net.HardwareAddr, slot byte, v6 bool) []byte {
	var p []byte
	p = append(p, dpNode(2, 1, binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, 0x0a0341d0), 0))...) // PciRoot(0x0)
	p = append(p, dpNode(1, 1, []byte{0, slot})...)                                                                        // Pci(slot,0)
	macBody := make([]byte, 33)
	copy(macBody, mac)
	macBody[32] = 1                          // IfType: Ethernet
	p = append(p, dpNode(3, 11, macBody)...) // MAC(...)
	if v6 {
		ip6 := make([]byte, 56)
		ip6[39] = 64                         // PrefixLength, as HttpBootDxe sets it
		p = append(p, dpNode(3, 13, ip6)...) // IPv6(::): DHCPv6
	} else {
		p = append(p, dpNode(3, 12, make([]byte, 23))...) // IPv4(0.0.0.0): DHCP
	}
	p = append(p, dpNode(3, 24, nil)...)         // Uri(): from DHCP
	return append(p, dpNode(0x7f, 0xff, nil)...) // End
}

func ucs2z(s string) []byte {
	var b []byte
	for _, r := range utf16.Encode([]rune(s)) {
		b = binary.LittleEndian.AppendUint16(b, r)
	}
	return append(b, 0, 0)
}

// efiVariable is one variable as an authenticated store holds it: the
// 60-byte header (state VAR_ADDED, attributes NV|BS|RT, no time stamp),
// the name, the data, padded to the 4-byte header alignment with 0xFF.
func efiVariable(name string, data []byte) []byte {
	n := ucs2z(name)
	h := []byte{0xaa, 0x55, 0x3f, 0}
	h = binary.LittleEndian.AppendUint32(h, 7) // NON_VOLATILE|BOOTSERVICE_ACCESS|RUNTIME_ACCESS
	h = append(h, make([]byte, 8+16+4)...)     // monotonic count, time stamp, public key index
	h = binary.LittleEndian.AppendUint32(h, uint32(len(n)))
	h = binary.LittleEndian.AppendUint32(h, uint32(len(data)))
	h = append(h, efiGlobalVariable...)
	v := append(append(h, n...), data...)
	for len(v)%4 != 0 {
		v = append(v, 0xff)
	}
	return v
}

// HTTPBootVars returns a copy of the empty variable store base with
// Boot0080 (HTTPv4, or HTTPv6 when v6, of mac at PCI slot) and BootNext =
// 0x0080 in it.
func HTTPBootVars(base []byte, mac net.HardwareAddr, slot byte, v6 bool) ([]byte, error) {
	if len(base) < 0x1000 || !bytes.Equal(base[0x28:0x2c], []byte("_FVH")) {
		return nil, errors.New("not a firmware volume")
	}
	hdr := int(binary.LittleEndian.Uint16(base[0x30:]))
	if !bytes.Equal(base[hdr:hdr+16], authVarStoreGUID) {
		return nil, errors.New("no authenticated variable store after the volume header")
	}
	off := (hdr + 28 + 3) &^ 3
	path := httpDevicePath(mac, slot, v6)
	desc := "Corral test HTTPv4"
	if v6 {
		desc = "Corral test HTTPv6"
	}
	opt := binary.LittleEndian.AppendUint32(nil, 1) // LOAD_OPTION_ACTIVE
	opt = binary.LittleEndian.AppendUint16(opt, uint16(len(path)))
	opt = append(append(opt, ucs2z(desc)...), path...)
	vars := append(efiVariable("Boot0080", opt), efiVariable("BootNext", []byte{0x80, 0})...)
	if !bytes.Equal(base[off:off+len(vars)], bytes.Repeat([]byte{0xff}, len(vars))) {
		return nil, errors.New("the variable store is not empty")
	}
	out := bytes.Clone(base)
	copy(out[off:], vars)
	return out, nil
}
