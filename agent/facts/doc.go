// Package facts collects the hardware facts a discovery agent reports
// (inventoryv1.Facts) from a root directory: SMBIOS identity through
// /sys/class/dmi and /sys/firmware/dmi/tables, CPU, memory and DIMMs, disks
// with serial and WWN (sysfs fallbacks, since the discovery image has no
// udev), NICs and PCI devices named from pci.ids when present.
//
// Collect is a pure function of the files under its root, so tests run it
// on captured and hand-written fixtures (testdata/*.txtar, unpacked by
// Unpack). It uses github.com/jaypipes/ghw with tools disabled and
// u-root's smbios parser; it must not import store/, boot/, ipmi/ or
// anything of the appliance.
package facts
