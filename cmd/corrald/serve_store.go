package main

import (
	"github.com/corralhq/corral/appliance"
	"github.com/corralhq/corral/store/etcd"
	"github.com/spf13/pflag"
)

// addStoreFlags registers the store and fleet flags: where records live
// (the bbolt file, or an etcd cluster shared by several appliances) and
// what this appliance is called among them (server validates them).
func addStoreFlags(f *pflag.FlagSet, c *appliance.Config) {
	addStoreAccessFlags(f, &c.Store)
	f.StringVar(&c.Store.ClusterKeyFile, "cluster-key", "", "the fleet's cluster key, which seals the CA and BMC seal key in etcd; the first appliance creates it, the others need a copy (default DATA_DIR/cluster.key) (env CORRAL_CLUSTER_KEY)")
	f.DurationVar(&c.Store.LeaseTTL, "leader-lease-ttl", etcd.DefaultLeaseTTL, "leader lease: a leader that dies or is cut off is replaced within it (whole seconds, at least 2s) (env CORRAL_LEADER_LEASE_TTL)")
	f.IntVar(&c.Store.Etcd.MaxInFlight, "etcd-max-in-flight", etcd.DefaultMaxInFlight, "etcd admission: most requests this appliance has at etcd at once; the bound adapts below it to etcd's pace (docs/architecture.md, \"A storm queues in the appliance\") (env CORRAL_ETCD_MAX_IN_FLIGHT)")
	f.IntVar(&c.Store.Etcd.MaxQueued, "etcd-max-queued", etcd.DefaultMaxQueued, "etcd admission: most requests waiting for a turn; more are refused at once with a retry hint (env CORRAL_ETCD_MAX_QUEUED)")
	f.DurationVar(&c.Store.Etcd.AdmitWait, "etcd-admit-wait", 0, "etcd admission: how long a request waits for its turn before it is refused with a retry hint (0: the request timeout, 5s) (env CORRAL_ETCD_ADMIT_WAIT)")
	f.StringVar(&c.Fleet.Name, "appliance-name", "", "this appliance's name in the fleet (default the host name) (env CORRAL_APPLIANCE_NAME)")
	f.StringSliceVar(&c.Fleet.BMCNetworks, "bmc-network", nil, "network (CIDR) from which this appliance reaches BMCs, repeatable; the leader gives it the per-machine work of machines whose BMC is there (default any) (env CORRAL_BMC_NETWORK)")
}

// addStoreAccessFlags registers the flags that say where the store is.
func addStoreAccessFlags(f *pflag.FlagSet, c *appliance.StoreConfig) {
	f.StringVar(&c.Kind, "store", appliance.StoreBolt, "where records live: bolt (the data directory's corral.db, one appliance) or etcd (a cluster several appliances share) (env CORRAL_STORE)")
	f.StringSliceVar(&c.Etcd.Endpoints, "etcd-endpoints", nil, "etcd members' client URLs, http:// or https://, comma-separated (env CORRAL_ETCD_ENDPOINTS)")
	f.StringVar(&c.Etcd.Prefix, "etcd-prefix", etcd.DefaultPrefix, "key prefix of this fleet in etcd (env CORRAL_ETCD_PREFIX)")
	f.StringVar(&c.Etcd.CAFile, "etcd-ca", "", "CA certificate file that verifies the etcd members (env CORRAL_ETCD_CA)")
	f.StringVar(&c.Etcd.CertFile, "etcd-cert", "", "client certificate file for etcd (env CORRAL_ETCD_CERT)")
	f.StringVar(&c.Etcd.KeyFile, "etcd-key", "", "client key file for etcd (env CORRAL_ETCD_KEY)")
}
