// Package deploy will own the n0cli-compatible `do` DAG executor and the
// install workflow that puts the hypervisor agent on accepted machines.
package deploy
