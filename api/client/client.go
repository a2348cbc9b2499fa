// Package client is the small Go client of corrald's API: one gRPC
// connection, made from a client configuration file (the admin.conf
// corrald writes, or the corral CLI's ~/.config/corral/config.yaml with
// its contexts), and a stub for each operator-facing service on it.
//
// It belongs to the API module (github.com/corralhq/corral/api), which
// depends on gRPC, protobuf and two small libraries only: importing it
// does not pull in the appliance.
package client

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"google.golang.org/grpc"

	adminv1 "github.com/corralhq/corral/api/admin/v1"
	auditv1 "github.com/corralhq/corral/api/audit/v1"
	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/api/clientconfig"
	deploymentv1 "github.com/corralhq/corral/api/deployment/v1"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	osimagev1 "github.com/corralhq/corral/api/osimage/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
)

// EnvConfig names the environment variable that overrides the default
// configuration file, as it does for the corral CLI.
const EnvConfig = "CORRAL_CONFIG"

// Client is a connection to corrald and the services on it. Its fields
// share Conn; Close closes it.
type Client struct {
	// Conn is the underlying connection, for services without a field
	// here.
	Conn *grpc.ClientConn

	Machines        inventoryv1.MachineServiceClient
	Commissioning   inventoryv1.CommissionServiceClient
	StandbyPools    inventoryv1.StandbyPoolServiceClient
	BMCCredentials  inventoryv1.BmcCredentialServiceClient
	BMCRedfish      inventoryv1.BmcRedfishServiceClient
	Nodes           poolv1.NodeServiceClient
	Networks        poolv1.NetworkServiceClient
	VirtualMachines provisioningv1.VirtualMachineServiceClient
	BlockStorages   provisioningv1.BlockStorageServiceClient
	Images          deploymentv1.ImageServiceClient
	OSImages        osimagev1.OSImageServiceClient
	Tokens          authv1.TokenServiceClient
	Audit           auditv1.AuditServiceClient
	Backup          adminv1.BackupServiceClient
}

// New connects to cfg's endpoint (clientconfig.Dial: TLS trusting only
// cfg's CA and requiring the appliance's certificate, the bearer token on
// every call). No I/O happens before the first call. extra options follow
// the configuration's.
func New(cfg *clientconfig.Config, extra ...grpc.DialOption) (*Client, error) {
	conn, err := clientconfig.Dial(cfg, extra...)
	if err != nil {
		return nil, err
	}
	return &Client{
		Conn:            conn,
		Machines:        inventoryv1.NewMachineServiceClient(conn),
		Commissioning:   inventoryv1.NewCommissionServiceClient(conn),
		StandbyPools:    inventoryv1.NewStandbyPoolServiceClient(conn),
		BMCCredentials:  inventoryv1.NewBmcCredentialServiceClient(conn),
		BMCRedfish:      inventoryv1.NewBmcRedfishServiceClient(conn),
		Nodes:           poolv1.NewNodeServiceClient(conn),
		Networks:        poolv1.NewNetworkServiceClient(conn),
		VirtualMachines: provisioningv1.NewVirtualMachineServiceClient(conn),
		BlockStorages:   provisioningv1.NewBlockStorageServiceClient(conn),
		Images:          deploymentv1.NewImageServiceClient(conn),
		OSImages:        osimagev1.NewOSImageServiceClient(conn),
		Tokens:          authv1.NewTokenServiceClient(conn),
		Audit:           auditv1.NewAuditServiceClient(conn),
		Backup:          adminv1.NewBackupServiceClient(conn),
	}, nil
}

// Open loads the configuration file at path (DefaultConfigPath when path
// is empty) and connects to its context named context (the file's current
// context when empty).
func Open(path, context string, extra ...grpc.DialOption) (*Client, error) {
	if path == "" {
		var err error
		if path, err = DefaultConfigPath(); err != nil {
			return nil, err
		}
	}
	file, err := clientconfig.LoadFile(path)
	if err != nil {
		return nil, err
	}
	cfg, err := file.Context(context)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return New(cfg, extra...)
}

// DefaultConfigPath is the corral CLI's configuration file: $CORRAL_CONFIG
// when set, else ~/.config/corral/config.yaml.
func DefaultConfigPath() (string, error) {
	if p := os.Getenv(EnvConfig); p != "" {
		return p, nil
	}
	home, err := os.UserHomeDir()
	if err != nil || home == "" {
		return "", errors.New("client: no home directory: name the configuration file")
	}
	return filepath.Join(home, ".config", "corral", "config.yaml"), nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.Conn.Close() }
