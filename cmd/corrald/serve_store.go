package main

import (
	"github.com/corralhq/corral/appliance"
	"github.com/corralhq/corral/store/etcd"
	"github.com/spf13/cobra"
)

// addStoreFlags registers the store and fleet flags: where records live
// (the bbolt file, or an etcd cluster shared by several appliances) and
// what this appliance is called among them.
func addStoreFlags(cmd *cobra.Command) {
	addStoreAccessFlags(cmd)
	f := cmd.Flags()
	f.String("cluster-key", "", "the fleet's cluster key, which seals the CA and BMC seal key in etcd; the first appliance creates it, the others need a copy (default DATA_DIR/cluster.key) (env CORRAL_CLUSTER_KEY)")
	f.Duration("leader-lease-ttl", etcd.DefaultLeaseTTL, "leader lease: a leader that dies or is cut off is replaced within it (whole seconds, at least 2s) (env CORRAL_LEADER_LEASE_TTL)")
	f.String("appliance-name", "", "this appliance's name in the fleet (default the host name) (env CORRAL_APPLIANCE_NAME)")
	f.StringSlice("bmc-network", nil, "network (CIDR) from which this appliance reaches BMCs, repeatable; the leader gives it the per-machine work of machines whose BMC is there (default any) (env CORRAL_BMC_NETWORK)")
}

// addStoreAccessFlags registers the flags that say where the store is.
func addStoreAccessFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.String("store", appliance.StoreBolt, "where records live: bolt (the data directory's corral.db, one appliance) or etcd (a cluster several appliances share) (env CORRAL_STORE)")
	f.StringSlice("etcd-endpoints", nil, "etcd members' client URLs, http:// or https://, comma-separated (env CORRAL_ETCD_ENDPOINTS)")
	f.String("etcd-prefix", etcd.DefaultPrefix, "key prefix of this fleet in etcd (env CORRAL_ETCD_PREFIX)")
	f.String("etcd-ca", "", "CA certificate file that verifies the etcd members (env CORRAL_ETCD_CA)")
	f.String("etcd-cert", "", "client certificate file for etcd (env CORRAL_ETCD_CERT)")
	f.String("etcd-key", "", "client key file for etcd (env CORRAL_ETCD_KEY)")
}

// storeConfig reads the store and fleet flags (server validates them).
func storeConfig(cmd *cobra.Command, c *appliance.Config) {
	f := cmd.Flags()
	c.Store = storeAccessConfig(cmd)
	c.Store.ClusterKeyFile, _ = f.GetString("cluster-key")
	c.Store.LeaseTTL, _ = f.GetDuration("leader-lease-ttl")
	c.Fleet.Name, _ = f.GetString("appliance-name")
	c.Fleet.BMCNetworks, _ = f.GetStringSlice("bmc-network")
}

// storeAccessConfig reads the flags of addStoreAccessFlags.
func storeAccessConfig(cmd *cobra.Command) appliance.StoreConfig {
	f := cmd.Flags()
	var c appliance.StoreConfig
	c.Kind, _ = f.GetString("store")
	c.Etcd.Endpoints, _ = f.GetStringSlice("etcd-endpoints")
	c.Etcd.Prefix, _ = f.GetString("etcd-prefix")
	c.Etcd.CAFile, _ = f.GetString("etcd-ca")
	c.Etcd.CertFile, _ = f.GetString("etcd-cert")
	c.Etcd.KeyFile, _ = f.GetString("etcd-key")
	return c
}
