package install

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/internal/nodeid"
)

// Files on the data partition, relative to its root (the hypervisor's
// data directory, /var/lib/corral-node): the layout internal/nodeid
// declares for both the installer and hypervisor/node.Enrol, which loads
// them.
const (
	IdentityDir   = nodeid.Dir
	NodeKeyFile   = nodeid.KeyFile  // PEM private key, mode 0600
	NodeCertFile  = nodeid.CertFile // PEM node certificate
	CACertFile    = nodeid.CAFile   // PEM appliance CA certificate
	ApplianceFile = nodeid.ApplianceFile
)

// Appliance is identity/appliance.json: which appliance installed the
// node, under which names.
type Appliance struct {
	Endpoint    string    `json:"endpoint"`  // appliance API host:port
	NodeName    string    `json:"node_name"` // the Node's name (certificate CN)
	MachineName string    `json:"machine_name"`
	InstallID   string    `json:"install_id"`
	InstalledAt time.Time `json:"installed_at"`
}

// Validate reports the first missing or malformed field.
func (a Appliance) Validate() error {
	if _, _, err := net.SplitHostPort(a.Endpoint); err != nil || a.Endpoint == "" {
		return fmt.Errorf("endpoint %q: want host:port", a.Endpoint)
	}
	if a.NodeName == "" {
		return errors.New("node_name is empty")
	}
	return nil
}

// ReadAppliance reads and validates dataDir/identity/appliance.json.
// A missing file wraps os.ErrNotExist.
func ReadAppliance(dataDir string) (Appliance, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, IdentityDir, ApplianceFile))
	if err != nil {
		return Appliance{}, err
	}
	var a Appliance
	if err := json.Unmarshal(b, &a); err != nil {
		return Appliance{}, fmt.Errorf("%s: %w", ApplianceFile, err)
	}
	if err := a.Validate(); err != nil {
		return Appliance{}, fmt.Errorf("%s: %w", ApplianceFile, err)
	}
	return a, nil
}

// CAFingerprint is the lowercase hex SHA-256 of the DER of the first
// certificate in caPEM, the form of corral.ca on the kernel command line.
func CAFingerprint(caPEM []byte) (string, error) {
	for rest := caPEM; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return "", errors.New("no PEM certificate")
		}
		if block.Type == "CERTIFICATE" {
			sum := sha256.Sum256(block.Bytes)
			return hex.EncodeToString(sum[:]), nil
		}
	}
}

// ErrBadIdentity: the plan's certificate, key or CA do not fit together.
var ErrBadIdentity = errors.New("install plan identity")

// checkIdentity verifies, before anything is written, that the plan's
// certificate matches its key and chains to its CA, and that the names the
// node needs are present.
func checkIdentity(plan *nodev1.InstallPlan) error {
	switch {
	case plan.GetHostname() == "":
		return fmt.Errorf("%w: hostname is empty", ErrBadIdentity)
	case plan.GetInstallId() == "":
		return fmt.Errorf("%w: install_id is empty", ErrBadIdentity)
	}
	if _, _, err := net.SplitHostPort(plan.GetApplianceEndpoint()); err != nil {
		return fmt.Errorf("%w: appliance endpoint %q: want host:port", ErrBadIdentity, plan.GetApplianceEndpoint())
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(plan.GetCaCertPem())) {
		return fmt.Errorf("%w: CA certificate: no PEM certificate", ErrBadIdentity)
	}
	kp, err := tls.X509KeyPair([]byte(plan.GetNodeCertPem()), []byte(plan.GetNodeKeyPem()))
	if err != nil {
		return fmt.Errorf("%w: node certificate and key: %w", ErrBadIdentity, err)
	}
	// Leaf is nil when the binary runs with GODEBUG x509keypairleaf=0
	// (gobusybox builds in the images take an older go directive).
	if kp.Leaf == nil {
		if kp.Leaf, err = x509.ParseCertificate(kp.Certificate[0]); err != nil {
			return fmt.Errorf("%w: node certificate: %w", ErrBadIdentity, err)
		}
	}
	if _, err := kp.Leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("%w: node certificate %q does not chain to the plan's CA: %w", ErrBadIdentity, kp.Leaf.Subject.CommonName, err)
	}
	return nil
}

// writeIdentity writes the identity files and appliance.json under
// dataDir/identity (directory 0700): key first (0600), each file written
// to a temporary name, synced and renamed, then the directory synced.
func writeIdentity(dataDir string, plan *nodev1.InstallPlan, now time.Time) error {
	// The partition root is the hypervisor's data directory (0700).
	if err := os.Chmod(dataDir, 0o700); err != nil {
		return err
	}
	dir := filepath.Join(dataDir, IdentityDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return err
	}
	app, err := json.MarshalIndent(Appliance{
		Endpoint: plan.GetApplianceEndpoint(), NodeName: plan.GetHostname(), MachineName: plan.GetMachineName(),
		InstallID: plan.GetInstallId(), InstalledAt: now.UTC(),
	}, "", "  ")
	if err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		data []byte
		mode os.FileMode
	}{
		{NodeKeyFile, []byte(plan.GetNodeKeyPem()), 0o600},
		{NodeCertFile, []byte(plan.GetNodeCertPem()), 0o644},
		{CACertFile, []byte(plan.GetCaCertPem()), 0o644},
		{ApplianceFile, append(app, '\n'), 0o644},
	} {
		if err := writeSynced(filepath.Join(dir, f.name), f.data, f.mode); err != nil {
			return fmt.Errorf("write %s: %w", f.name, err)
		}
	}
	return syncDir(dir)
}

func writeSynced(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
