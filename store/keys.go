package store

// BackendPrefix holds a backend's own keys, which are not records
// (store/etcd's leader election, "/_election/"): a reader of every record
// skips them.
const BackendPrefix = "/_"

// The keys of Corral's records, declared once here so that every package
// spells them the same way, and so that one package can read another's
// records by prefix without importing it (fleet reads inventory's machines
// and boot's leases). Each prefix ends in "/" and holds one record per
// name below it; a name without the slash is a single key. Only the owner
// named beside a key writes it.
const (
	// Inventory (inventory): machines and their indexes and timeline.
	MachinesPrefix      = "/inventory/machines/"
	MACsPrefix          = "/inventory/macs/"
	SerialsPrefix       = "/inventory/serials/"
	UUIDsPrefix         = "/inventory/uuids/"
	EKsPrefix           = "/inventory/eks/"
	BMCAddrsPrefix      = "/inventory/bmc-addrs/"
	BMCSecretsPrefix    = "/inventory/bmc-secrets/"
	TimelinePrefix      = "/inventory/timeline/"
	TimelineIndexPrefix = "/inventory/timeline-index/"

	// Standby pools (lifecycle/standby), one per pool name.
	StandbyPoolsPrefix = "/inventory/standby-pools/"

	// The node pool (inventory/pool).
	NodesPrefix     = "/pool/nodes/"
	NetworksPrefix  = "/pool/networks/"
	NetworkIndexKey = "/pool/network-index"

	// VMs, volumes and images (hypervisor/appliance).
	BlockStoragesPrefix   = "/provisioning/block_storages/"
	VirtualMachinesPrefix = "/provisioning/virtual_machines/"
	ImagesPrefix          = "/deployment/images/"

	// Full-mode DHCP leases (boot/dhcp), one per address.
	LeasesPrefix = "/boot/leases/"
	// Each MAC's address in a subnet (boot/dhcp), one per MAC and subnet:
	// written with every binding, so a MAC holds one live lease a subnet
	// across the fleet.
	LeaseHoldersPrefix = "/boot/lease-holders/"
	// DHCPv6 leases (boot/dhcp6), one per address, each naming the DUID
	// and IAID it is bound to.
	Leases6Prefix = "/boot/leases6/"

	// Tokens, the boot-token key and node certificates (auth).
	TokensPrefix       = "/auth/tokens/"
	BootKeyKey         = "/auth/boot-key"
	IssuedCertsPrefix  = "/pki/issued/"
	RevokedCertsPrefix = "/pki/revoked/"

	// Several appliances (fleet).
	AppliancesPrefix  = "/fleet/appliances/"
	AssignmentsPrefix = "/fleet/assignments/"
	SessionsPrefix    = "/fleet/sessions/"
	ClusterSecretsKey = "/fleet/secrets"

	// The appliance itself (appliance): the audit log and the
	// shared image catalog.
	AuditPrefix   = "/audit/"
	CatalogPrefix = "/images/catalog/"

	// Operating-system images (images/osimage), one per name.
	OSImagesPrefix = "/images/os/"

	// Webhook receivers (appliance/webhook), one per name.
	WebhooksPrefix = "/webhooks/receivers/"
	// Webhook delivery cursors (appliance/webhook), one per receiver: the
	// store revision through which its events were delivered or given up.
	WebhookCursorsPrefix = "/webhooks/cursors/"
)
