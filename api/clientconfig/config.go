package clientconfig

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/renameio/v2"
	"sigs.k8s.io/yaml"
)

// FileMode is the permission Write gives the file: it contains a bearer
// token, so only the owner may read it.
const FileMode fs.FileMode = 0o600

// Config is one connection to corrald, and the file format corrald writes
// (admin.conf): YAML with exactly the keys endpoint, ca_cert and token. A
// File extends it with named contexts.
type Config struct {
	// Endpoint is the corrald gRPC address as host:port, or any target
	// accepted by grpc.NewClient.
	Endpoint string `json:"endpoint"`
	// CACert is the PEM text of the CA certificate(s) to trust. When
	// empty, the system trust store is used.
	CACert string `json:"ca_cert"`
	// Token is the bearer token sent with every RPC. When empty, no
	// authorization metadata is sent.
	Token string `json:"token"`
}

// Load reads and strictly parses the configuration file at path and
// returns the connection of its current context: the top-level endpoint,
// ca_cert and token (the context named "default"), or the entry of
// contexts that current_context names (see File). A file corrald wrote
// (admin.conf) has only the top-level keys and loads as before. It returns
// an error naming path if the file cannot be read, is not valid YAML,
// contains unknown or duplicate keys, has no endpoint, has a ca_cert
// containing no PEM certificate, or has a token containing whitespace.
func Load(path string) (*Config, error) {
	f, err := LoadFile(path)
	if err != nil {
		return nil, err
	}
	c, err := f.Context("")
	if err != nil {
		return nil, fmt.Errorf("clientconfig: %s: %w", path, err)
	}
	return c, nil
}

// Write stores c at path as YAML with exactly the keys endpoint, ca_cert
// and token, mode 0600, atomically: it writes a temporary file in the same
// directory and renames it over path, so an existing file (whatever its
// previous mode) is replaced by a 0600 one and readers never see a partial
// file. The directory must already exist. It returns an error naming path
// if c would not pass Load's checks or if any filesystem step fails; on
// error path is left untouched. Write replaces a file holding several
// contexts by this one connection: use File.Write to keep them.
func (c *Config) Write(path string) (err error) {
	if err := c.validate(); err != nil {
		return fmt.Errorf("clientconfig: %s: %w", path, err)
	}
	data, err := yaml.Marshal(c)
	if err != nil {
		return fmt.Errorf("clientconfig: encode %s: %w", path, err)
	}
	return writeAtomic(path, data)
}

// writeAtomic replaces path by data with mode FileMode through a synced
// temporary file in the same directory (renameio); on error path is left
// untouched.
func writeAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	f, err := renameio.NewPendingFile(path, renameio.WithTempDir(dir), renameio.WithStaticPermissions(FileMode))
	if err != nil {
		return fmt.Errorf("clientconfig: write %s: %w", path, err)
	}
	defer f.Cleanup()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("clientconfig: write %s: %w", path, err)
	}
	if err := f.CloseAtomicallyReplace(); err != nil {
		return fmt.Errorf("clientconfig: write %s: %w", path, err)
	}
	if d, derr := os.Open(dir); derr == nil {
		_ = d.Sync() // best effort: not every filesystem syncs directories
		_ = d.Close()
	}
	return nil
}

func (c *Config) validate() error {
	if c == nil {
		return errors.New("nil config")
	}
	if strings.TrimSpace(c.Endpoint) == "" {
		return errors.New("endpoint is required")
	}
	if c.CACert != "" {
		if _, err := c.certPool(); err != nil {
			return err
		}
	}
	if strings.ContainsFunc(c.Token, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return errors.New("token contains whitespace or control characters")
	}
	return nil
}
