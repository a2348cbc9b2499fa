// Package erase carries out an erase plan on the machine, in the discovery
// agent, when the appliance releases it: every disk the plan names is
// checked against sysfs (a whole block device under /dev, not a partition,
// RAID or device-mapper volume, not read-only, and holding nothing mounted
// or swapped on: the running system's boot media are never erased), then
// erased at the plan's level and read back:
//
//   - quick zeroes the first and last MiB of the disk and of every
//     partition the kernel lists or the disk's own MBR or GPT names, which
//     takes partition tables (MBR, both GPTs) and the signatures of
//     filesystems, LVM and MD RAID (0.90, 1.0, 1.1, 1.2) with it, and
//     asks the kernel to re-read the table (BLKRRPART);
//   - full discards the device where the queue supports it and keeps the
//     discard only when samples read back zero, else zeroes it with
//     BLKZEROOUT, else with plain writes;
//   - secure uses the device's own erase: NVMe Format NVM with Secure Erase
//     Settings = user data erase (or sanitize where only that is
//     supported), ATA SECURITY ERASE UNIT where the security feature set
//     is supported and not frozen, locked or enabled; any other device is
//     refused with the reason. Then it reads back as full does.
//
// The regions written are read back after the device's cache is written
// back and dropped: quick reads every region it zeroed, full and secure the
// first and last MiB and 64 random 4 KiB blocks. Ioctls go through
// golang.org/x/sys/unix; no kept Go library sends NVMe or ATA security
// commands, so the few structures are declared here.
//
// It runs on the machine: it imports only the API of ours, never store/,
// boot/, ipmi/, bbolt, etcd or bmclib.
package erase
