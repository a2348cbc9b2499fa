// Package install turns a discovery agent's install plan into a data disk
// a hypervisor node can boot from: it chooses the target disk (sysfs under
// Config.Root), refuses one that already holds a partition table or a
// filesystem unless the plan says wipe, writes a GPT with one partition
// named "corral-data", formats it ext4 (label "corral-data") with mke2fs,
// makes the node key (ECDSA P-256) on the machine, has the appliance sign
// its certificate request (the caller's sign function: agent/session sends
// it on the session), checks the certificate against the plan (CA, public
// key, name), and writes the node identity the hypervisor agent loads
// (identity/node.key, node.crt, ca.crt) plus identity/appliance.json, which
// names every appliance of the fleet the node may fail over to (the plan's
// appliance_endpoint first, then its appliance_endpoints). The
// key never leaves the machine, and a plan that carries key material (an
// appliance from before 2026-11-23) is refused. Wipe erases partition tables and
// filesystem signatures (reprovisioning).
//
// The on-disk contract (partition name, label, file names, appliance.json)
// is shared with agent/hvboot, which finds and mounts the partition when
// the machine boots the hypervisor image.
//
// It runs on the machine: it must not import store/, boot/, ipmi/, bbolt,
// etcd or bmclib.
package install
