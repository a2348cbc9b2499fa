// Package nodeid owns what the appliance and a node must agree on about a
// node's identity: the certificate Organization that makes a certificate a
// node's, and the layout of the identity files on the node's data
// partition (written by agent/install, read by hypervisor/node and
// agent/hvboot). It imports nothing of Corral's, so both sides of the
// node/appliance boundary may import it.
package nodeid

// Organization is the Subject.Organization entry of every node
// certificate the appliance issues. The appliance's interceptor makes a
// verified certificate carrying it a NODE principal; a node refuses
// callers presenting one (nodes must not drive each other).
//
// The API module's client configuration refuses a server presenting it
// (clientconfig.NodeOrganization, the same value: TestOrganization keeps
// them equal; this package stays a leaf).
const Organization = "corral:node"

// The identity files, relative to the node's data directory
// (/var/lib/corral-node, the root of the data partition).
const (
	// Dir holds the identity files (mode 0700).
	Dir = "identity"
	// KeyFile is the node's PEM private key (mode 0600).
	KeyFile = "node.key"
	// CertFile is the node's PEM certificate, signed by the appliance CA.
	CertFile = "node.crt"
	// CAFile is the appliance CA certificate (PEM) the node trusts.
	CAFile = "ca.crt"
	// ApplianceFile says which appliance installed the node, under which
	// names (JSON, agent/install.Appliance).
	ApplianceFile = "appliance.json"
)
