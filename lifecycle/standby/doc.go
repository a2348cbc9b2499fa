// Package standby keeps standby pools (kip's standby nodes,
// docs/architecture.md "Standby pools"): the StandbyPool records in the
// store and their StandbyPoolService, and the controller that holds each
// pool's min_ready machines READY in its readiness — accepting matching
// INVENTORIED machines of the pool and powering machines on into discovery
// or off through the lifecycle's compare-and-swap power paths. The
// controller runs on the fleet's leader only.
//
// It reaches machines and power through interfaces it declares
// (implemented by *inventory.Inventory and *lifecycle.Lifecycle) and
// never imports the appliance.
package standby
