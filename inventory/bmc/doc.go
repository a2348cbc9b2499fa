// Package bmc is BMC control for inventory's machines: enrolment (the
// credentials checked against the BMC before anything is stored, a
// Redfish certificate pinned), the sealed passwords, power state and
// actions, next-boot device, and the power poller's source (PowerTargets,
// RefreshPower), and how a machine's serial console is reached
// (ConsoleTarget: IPMI SOL, or SSH to a Redfish BMC with its host key
// pinned on first use). Every call to a BMC goes through a Driver (cmd wires the
// ipmi package to it) with its own deadline, and is recorded on the
// machine's boot timeline.
//
// It reaches machines only through the interfaces it declares (Machines,
// Events; *inventory.Inventory implements them) and keeps its own records
// in the store: the sealed passwords, and the claims of the BMC address
// index that inventory reads (inventory.BMCAddressKey). Service.Forget
// removes both when a machine is deleted (wired to Inventory.OnDelete).
// Every machine change is a compare-and-swap through
// Machines.UpdateMachine.
//
// It imports the api, the error classes, the store contract and inventory;
// inventory never imports it. It does not import ipmi: the types it
// shares with it (Target, Result, CertificateError) are mirrored and
// translated where cmd wires the two.
package bmc
