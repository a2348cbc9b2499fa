// Package cli implements the corral command line: global flags and client
// configuration, the verbs (get, describe, apply, delete, do, the node and
// network pool verbs, the machine verbs, the hypervisor verbs vm, bs and
// image, version, config, completion) and their table, wide, name, JSON and
// YAML output. `do` runs n0cli DAG files through package deploy. `get -w`
// and `machine timeline -f` follow the Watch RPCs and resume a cut stream
// (watch.go); `get events` reads the audit stream; `config` edits the
// client file's named contexts.
//
// The hypervisor verbs drive the appliance's VirtualMachineService (vm
// create, boot, reboot, shutdown, delete, console), BlockStorageService
// (bs create, fetch, copy, resize, delete, undelete, purge) and
// ImageService (image apply, delete, register, unregister, tag, untag,
// generate); get and describe show their records (kinds vm, bs, image).
// Sizes are human (512MiB, 20GiB, 10G); --node sets n0stack's
// request_node_name annotation.
//
// Run is the only entry point; it never panics on bad input and maps
// every failure to one line on stderr and an exit code: 0 success, 1 an
// API, connection or I/O failure, 2 a usage error. The gRPC connection is
// made through App.Dial so tests can substitute a bufconn dialer.
//
// The package talks to corrald only through the generated clients under
// api/ (with api/clientconfig) and deploy; it must not import the server-side
// packages (inventory, store, boot, ipmi, hypervisor).
package cli
