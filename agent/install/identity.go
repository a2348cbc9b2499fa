package install

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/corralhq/corral/agent/cmdline"
	nodev1 "github.com/corralhq/corral/api/node/v1"
	"github.com/corralhq/corral/internal/nodeid"
	"github.com/google/renameio/v2"
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
// node, under which names, and the fleet's appliances the node may dial.
type Appliance struct {
	Endpoint string `json:"endpoint"` // API host:port of the appliance that installed the node
	// Endpoints are every appliance API host:port the node may dial, in
	// the order to try them, Endpoint first (at most
	// cmdline.MaxEndpoints). Absent in files written before the fleet
	// (2026-11-24): then Endpoint alone (Appliances).
	Endpoints   []string  `json:"endpoints,omitempty"`
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
	if len(a.Endpoints) > cmdline.MaxEndpoints {
		return fmt.Errorf("endpoints: %d, at most %d", len(a.Endpoints), cmdline.MaxEndpoints)
	}
	for i, e := range a.Endpoints {
		if err := cmdline.CheckEndpoint(e); err != nil {
			return fmt.Errorf("endpoints[%d]: %w", i, err)
		}
	}
	if a.NodeName == "" {
		return errors.New("node_name is empty")
	}
	return nil
}

// Appliances are the endpoints the node dials, in order: Endpoints, or
// Endpoint alone when the file has none.
func (a Appliance) Appliances() []string {
	if len(a.Endpoints) > 0 {
		return a.Endpoints
	}
	return []string{a.Endpoint}
}

// PlanEndpoints are the appliances an install plan names, in the order
// the node tries them: appliance_endpoint first, then
// appliance_endpoints (empty from appliances before the fleet, 2026-11-24), each once. It
// refuses an invalid element and more than cmdline.MaxEndpoints in all.
func PlanEndpoints(plan *nodev1.InstallPlan) ([]string, error) {
	first := plan.GetApplianceEndpoint()
	if err := cmdline.CheckEndpoint(first); err != nil {
		return nil, fmt.Errorf("appliance endpoint: %w", err)
	}
	out := []string{first}
	for i, e := range plan.GetApplianceEndpoints() {
		if err := cmdline.CheckEndpoint(e); err != nil {
			return nil, fmt.Errorf("appliance_endpoints[%d]: %w", i, err)
		}
		if !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	if len(out) > cmdline.MaxEndpoints {
		return nil, fmt.Errorf("%d appliance endpoints, at most %d", len(out), cmdline.MaxEndpoints)
	}
	return out, nil
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

// ErrBadIdentity means the plan's identity fields are missing or malformed,
// or the node certificate the appliance signed does not fit the plan (CA,
// name) or the key made here.
var ErrBadIdentity = errors.New("install plan identity")

// Field numbers of InstallPlan that carried an appliance-made node
// certificate and private key before 2026-11-23; reserved in api/node/v1.
const (
	oldNodeCertField = 4
	oldNodeKeyField  = 5
)

// checkPlan verifies, before anything is written, that the plan names
// what the node needs, that its CA parses, and that it carries no key
// material: a plan with the old certificate or key fields (an appliance
// older than this agent) is refused, since node keys are made on the
// machine.
func checkPlan(plan *nodev1.InstallPlan) error {
	switch {
	case plan.GetHostname() == "":
		return fmt.Errorf("%w: hostname is empty", ErrBadIdentity)
	case plan.GetInstallId() == "":
		return fmt.Errorf("%w: install_id is empty", ErrBadIdentity)
	}
	if _, err := PlanEndpoints(plan); err != nil {
		return fmt.Errorf("%w: %w", ErrBadIdentity, err)
	}
	if _, err := caPool(plan.GetCaCertPem()); err != nil {
		return err
	}
	if f := keyMaterialField(plan); f != 0 {
		return fmt.Errorf("%w: the plan carries a node certificate or private key (field %d, from an appliance older than this agent): refused; this agent makes the node key on the machine and sends a certificate request", ErrBadIdentity, f)
	}
	return nil
}

// keyMaterialField returns the number of the old certificate or key field
// when the plan carries one (as an unknown field), else 0.
func keyMaterialField(plan *nodev1.InstallPlan) protowire.Number {
	b := plan.ProtoReflect().GetUnknown()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0
		}
		if num == oldNodeCertField || num == oldNodeKeyField {
			return num
		}
		b = b[n:]
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return 0
		}
		b = b[n:]
	}
	return 0
}

func caPool(caPEM string) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(caPEM)) {
		return nil, fmt.Errorf("%w: CA certificate: no PEM certificate", ErrBadIdentity)
	}
	return pool, nil
}

// nodeKey is the node's private key: made on the machine, written only to
// the data partition, never sent.
type nodeKey struct {
	key *ecdsa.PrivateKey
	pem []byte // PKCS#8 "PRIVATE KEY"
}

// newNodeKey makes an ECDSA P-256 key.
func newNodeKey() (*nodeKey, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate the node key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	return &nodeKey{key: k, pem: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})}, nil
}

// readNodeKey loads dataDir's identity/node.key when it is an ECDSA key
// (one this installer made).
func readNodeKey(dataDir string) (*nodeKey, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, IdentityDir, NodeKeyFile))
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("%s: no PEM PRIVATE KEY block", NodeKeyFile)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", NodeKeyFile, err)
	}
	ek, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%s: %T, want an ECDSA key", NodeKeyFile, k)
	}
	return &nodeKey{key: ek, pem: b}, nil
}

// request is a PKCS#10 certificate request for the key, CN = hostname
// (the appliance decides the name and SANs itself and ignores both).
func (k *nodeKey) request(hostname string) ([]byte, error) {
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: hostname}}, k.key)
	if err != nil {
		return nil, fmt.Errorf("certificate request: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

// KeyFingerprint is "sha256:" and the lowercase hex SHA-256 of the
// public key's DER SubjectPublicKeyInfo: how the agent's progress and the
// appliance's timeline name a node key.
func KeyFingerprint(pub crypto.PublicKey) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(der)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// checkNodeCert verifies the certificate the appliance signed: the first
// PEM certificate of certPEM chains to the plan's CA, carries our public
// key and is issued to the plan's hostname (CN). It returns the parsed
// certificate.
func checkNodeCert(plan *nodev1.InstallPlan, certPEM []byte, pub crypto.PublicKey) (*x509.Certificate, error) {
	pool, err := caPool(plan.GetCaCertPem())
	if err != nil {
		return nil, err
	}
	var block *pem.Block
	for rest := certPEM; ; {
		block, rest = pem.Decode(rest)
		if block == nil {
			return nil, fmt.Errorf("%w: node certificate from the appliance: no PEM certificate", ErrBadIdentity)
		}
		if block.Type == "CERTIFICATE" {
			break
		}
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: node certificate from the appliance: %w", ErrBadIdentity, err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, fmt.Errorf("%w: node certificate %q does not chain to the plan's CA: %w", ErrBadIdentity, cert.Subject.CommonName, err)
	}
	if k, ok := cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool }); !ok || !k.Equal(pub) {
		return nil, fmt.Errorf("%w: node certificate %q is for another key than the one made on this machine", ErrBadIdentity, cert.Subject.CommonName)
	}
	if cert.Subject.CommonName != plan.GetHostname() {
		return nil, fmt.Errorf("%w: node certificate is for %q, want the plan's hostname %q", ErrBadIdentity, cert.Subject.CommonName, plan.GetHostname())
	}
	return cert, nil
}

// writeIdentity writes the node key made here, its certificate, the
// plan's CA and appliance.json under dataDir/identity (directory 0700):
// key first (0600), each file written to a temporary name, synced and
// renamed, then the directory synced.
func writeIdentity(dataDir string, plan *nodev1.InstallPlan, keyPEM, certPEM []byte, now time.Time) error {
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
	eps, err := PlanEndpoints(plan)
	if err != nil {
		return err
	}
	app, err := json.MarshalIndent(Appliance{
		Endpoint: plan.GetApplianceEndpoint(), Endpoints: eps, NodeName: plan.GetHostname(), MachineName: plan.GetMachineName(),
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
		{NodeKeyFile, keyPEM, 0o600},
		{NodeCertFile, certPEM, 0o644},
		{CACertFile, []byte(plan.GetCaCertPem()), 0o644},
		{ApplianceFile, append(app, '\n'), 0o644},
	} {
		if err := writeSynced(filepath.Join(dir, f.name), f.data, f.mode); err != nil {
			return fmt.Errorf("write %s: %w", f.name, err)
		}
	}
	return syncDir(dir)
}

// writeSynced replaces path with data of the given mode through a synced
// temporary file in the same directory (renameio); the caller syncs the
// directory.
func writeSynced(path string, data []byte, mode os.FileMode) error {
	f, err := renameio.NewPendingFile(path, renameio.WithTempDir(filepath.Dir(path)), renameio.WithStaticPermissions(mode))
	if err != nil {
		return err
	}
	defer f.Cleanup()
	if _, err := f.Write(data); err != nil {
		return err
	}
	return f.CloseAtomicallyReplace()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
