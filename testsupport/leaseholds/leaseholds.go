// Package leaseholds keeps what DHCP test clients hold (address → MAC, from
// each ACK until its RELEASE) and reports an address ACKed to a second MAC
// while the first still holds it: the duplicate-address check of the
// shared-segment tests. Test support only; it imports nothing of Corral's.
package leaseholds

import (
	"maps"
	"net"
	"sync"
)

// Holds is safe for concurrent use.
type Holds struct {
	mu sync.Mutex
	m  map[string]string
}

// New returns an empty Holds.
func New() *Holds { return &Holds{m: map[string]string{}} }

// Ack records ip as hw's and returns the other MAC holding it, if any (then
// nothing is recorded: the address is a duplicate).
func (h *Holds) Ack(ip net.IP, hw net.HardwareAddr) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if o := h.m[ip.String()]; o != "" && o != hw.String() {
		return o
	}
	h.m[ip.String()] = hw.String()
	return ""
}

// Release forgets ip if hw holds it.
func (h *Holds) Release(ip net.IP, hw net.HardwareAddr) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m[ip.String()] == hw.String() {
		delete(h.m, ip.String())
	}
}

// Snapshot copies the holds: address → MAC.
func (h *Holds) Snapshot() map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.m)
}
