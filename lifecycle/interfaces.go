package lifecycle

import (
	"context"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/inventory"
)

// Machines is what the lifecycle needs of the machine inventory: read,
// list, change by compare-and-swap, delete, and apply a discovery report.
// Implemented by *inventory.Inventory.
type Machines interface {
	// GetMachine returns one machine (an error wrapping ErrNotFound for an
	// unknown one).
	GetMachine(ctx context.Context, name string) (*inventoryv1.Machine, error)
	// ListMachines returns the machines the request selects.
	ListMachines(ctx context.Context, req *inventoryv1.ListMachinesRequest) ([]*inventoryv1.Machine, error)
	// UpdateMachine changes one machine by compare-and-swap; mutate may
	// run more than once and its error aborts without writing.
	UpdateMachine(ctx context.Context, name string, mutate func(m *inventoryv1.Machine) error) (*inventoryv1.Machine, error)
	// DeleteMachine removes one machine (refused while INSTALLING or
	// DEPLOYED; an error wrapping ErrNotFound for an unknown one).
	DeleteMachine(ctx context.Context, name string) error
	// Register applies a discovery report in one mutation, running
	// opts.Hook inside it; opts.Admit may refuse the match first.
	Register(ctx context.Context, bootMAC string, facts *inventoryv1.Facts, opts inventory.RegisterOptions) (*inventoryv1.Machine, error)
}

// Events is the machines' boot timeline: append (never blocks) and read.
// Implemented by *inventory.Inventory.
type Events interface {
	Event(mac, source, event, detail string, attrs map[string]string)
	Timeline(ctx context.Context, name, mac string, limit int) ([]*inventoryv1.TimelineEntry, error)
}

// Nodes is what the lifecycle needs from the node pool (inventory/pool).
// GetNode returns an error wrapping ErrNotFound for an unknown node;
// DeleteNode refuses a node that holds reservations.
type Nodes interface {
	GetNode(ctx context.Context, name string) (*poolv1.Node, error)
	DeleteNode(ctx context.Context, name string) error
}

// NodeWatcher is optionally implemented by Nodes: names of nodes that
// changed, until ctx ends.
type NodeWatcher interface {
	WatchNodes(ctx context.Context) (<-chan string, error)
}

// Power reboots machines through their BMC. Implemented by
// *bmc.Service (inventory/bmc); each call has its own BMC deadline.
type Power interface {
	SetBootDevice(ctx context.Context, name string, req inventory.BootRequest) error
	SetPower(ctx context.Context, name string, a inventoryv1.PowerAction) (*inventoryv1.PowerStatus, error)
}

// NodeIdentity signs the node certificates of installs; appliance
// wires the appliance CA to it. The node key is made on the machine: only
// its certificate request reaches the appliance.
type NodeIdentity interface {
	// SignNode signs the PKCS#10 request csrPEM (already parsed and its
	// signature checked) as the certificate of node name, which the
	// appliance decides: the request's subject and SANs are ignored. It
	// returns the certificate PEM; it may write the issued serial to the
	// store, so it blocks on it.
	SignNode(ctx context.Context, name string, csrPEM []byte) (certPEM []byte, err error)
	// CACertPEM is the CA the node trusts and its certificate chains to.
	CACertPEM() []byte
}

// CertRevoker revokes every certificate issued for a node name (the
// appliance's revocation list); reprovision and delete call it.
type CertRevoker interface {
	RevokeNode(ctx context.Context, name, reason string) error
}
