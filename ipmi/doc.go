// Package ipmi will own BMC control (power and boot device over IPMI and
// Redfish, with bmclib v2 inside), sealed BMC credentials and the power
// poller. It must not be imported from anything reachable by cmd/corral-node.
package ipmi
