// Package fleet runs several appliances as one: every appliance heartbeats
// as a runner (Runner), the leader dispatches per-machine work — BMC power
// polling, power actions of the automation, the boot watchdog — to live
// runners (Dispatcher), and each appliance follows what it was given
// (Owner). It is the cluster-checks pattern of Datadog's cluster agent,
// kept in the store instead of in the leader's memory: runner records
// under /fleet/appliances/, one assignment per machine under
// /fleet/assignments/, every write a compare-and-swap. It works on any
// store: on bbolt an appliance is alone and owns everything; on etcd the
// fleet shares the records.
//
// It imports the API, the store contract and its record codec, and the
// internal leaves apierr and lograte; it reads inventory's machine records
// and boot's DHCP leases through the store by their documented prefixes,
// never through those packages.
package fleet

import (
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"time"

	fleetv1 "github.com/corralhq/corral/api/fleet/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
)

// Store key prefixes.
const (
	// AppliancePrefix holds one fleetv1.Appliance per appliance, written
	// by the appliance itself.
	AppliancePrefix = store.AppliancesPrefix
	// AssignmentPrefix holds one fleetv1.Assignment per machine, written
	// only by the leader.
	AssignmentPrefix = store.AssignmentsPrefix
	// MachinePrefix is where inventory keeps its machine records
	// (inventoryv1.Machine); a test checks it against inventory.
	MachinePrefix = store.MachinesPrefix
	// LeasePrefix is where boot/dhcp keeps its full-mode leases
	// (bootv1.Lease); a test checks it against boot/dhcp.
	LeasePrefix = store.LeasesPrefix
)

// Defaults of the cluster-checks pattern (docs/DESIGN.md §7).
const (
	// DefaultInterval is how often a runner heartbeats.
	DefaultInterval = 10 * time.Second
	// DefaultExpiry is how long a runner stays live after its last
	// heartbeat.
	DefaultExpiry = 30 * time.Second
	// DefaultDispatchInterval is how often the dispatcher re-checks
	// runners' liveness when nothing else wakes it.
	DefaultDispatchInterval = 5 * time.Second
	// DefaultMaxMachines bounds the machines (and assignments) a
	// dispatcher or an owner keeps in memory: ten times the design load
	// of one appliance.
	DefaultMaxMachines = 50_000
	// maxAppliances bounds the runner records a dispatcher keeps.
	maxAppliances = 1024
)

var nameRE = regexp.MustCompile(`^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,126}[A-Za-z0-9])?$`)

// CheckName validates an appliance name (--appliance-name): 1-128 letters,
// digits, '.', '_' or '-', starting and ending with a letter or digit, the
// rule machine names follow.
func CheckName(name string) error {
	if name == "" {
		return apierr.Invalidf("appliance name is required (--appliance-name)")
	}
	if !nameRE.MatchString(name) {
		return apierr.Invalidf("appliance name %q is malformed: use 1-128 letters, digits, '.', '_' or '-', starting and ending with a letter or digit", name)
	}
	return nil
}

// CheckAppliance validates the spec fields an appliance writes in its
// runner record: its name, its API endpoint (host:port, when set) and its
// networks (CIDRs).
func CheckAppliance(a *fleetv1.Appliance) error {
	if a == nil {
		return apierr.Invalidf("appliance record is required")
	}
	if err := CheckName(a.GetName()); err != nil {
		return err
	}
	if ep := a.GetApiEndpoint(); ep != "" {
		if h, p, err := splitEndpoint(ep); err != nil || h == "" || p == "" {
			return apierr.Invalidf("appliance %s: API endpoint %q is not host:port", a.GetName(), ep)
		}
	}
	if err := checkNets(a.GetBootSegments()); err != nil {
		return apierr.Invalidf("appliance %s: boot segment %v", a.GetName(), err)
	}
	if err := checkNets(a.GetDhcpSegments()); err != nil {
		return apierr.Invalidf("appliance %s: DHCP segment %v", a.GetName(), err)
	}
	if err := checkNets(a.GetBmcNetworks()); err != nil {
		return apierr.Invalidf("appliance %s: BMC network (--bmc-network) %v", a.GetName(), err)
	}
	return nil
}

func splitEndpoint(ep string) (host, port string, err error) {
	i := strings.LastIndexByte(ep, ':')
	if i < 0 {
		return "", "", fmt.Errorf("no port")
	}
	host, port = strings.TrimSuffix(strings.TrimPrefix(ep[:i], "["), "]"), ep[i+1:]
	return host, port, nil
}

// checkNets checks that each of ss is a CIDR; an error names the bad one.
func checkNets(ss []string) error {
	for _, s := range ss {
		if _, err := netip.ParsePrefix(strings.TrimSpace(s)); err != nil {
			return fmt.Errorf("%q is not a CIDR (e.g. 10.0.0.0/24)", s)
		}
	}
	return nil
}

// Live reports whether a runner record heartbeated within expiry of now.
func Live(a *fleetv1.Appliance, now time.Time, expiry time.Duration) bool {
	hb := a.GetLastHeartbeat()
	if hb == nil {
		return false
	}
	return now.Sub(hb.AsTime()) <= expiry
}
