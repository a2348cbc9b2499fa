package cli

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"google.golang.org/grpc"

	"github.com/corralhq/corral/api/clientconfig"
	"github.com/corralhq/corral/internal/flagconf"
)

// DefaultPort is corrald's gRPC port, added to an endpoint given without
// one.
const DefaultPort = "20180"

// Environment variables of the global flags (flagconf's rule), named in
// messages.
var (
	envConfig   = flagconf.EnvName("config")
	envEndpoint = flagconf.EnvName("endpoint")
	envToken    = flagconf.EnvName("token")
)

// configPathFor returns the client configuration file: the one named by
// --config ($CORRAL_CONFIG), else ~/.config/corral/config.yaml ("" when
// there is no home directory), and whether it was named explicitly.
func (inv *invocation) configPathFor(flags interface{ Changed(string) bool }) (string, bool) {
	if flags.Changed("config") {
		return inv.configPath, true
	}
	home := inv.app.getenv("HOME")
	if home == "" {
		home, _ = os.UserHomeDir()
	}
	if home == "" {
		return "", false
	}
	return filepath.Join(home, ".config", "corral", "config.yaml"), false
}

// clientConfig resolves the client configuration: the context named by
// --context ($CORRAL_CONTEXT), else the current one, of the file named by
// --config ($CORRAL_CONFIG), else of ~/.config/corral/config.yaml (which
// may be absent); then --endpoint ($CORRAL_ENDPOINT) and --token
// ($CORRAL_TOKEN) override its endpoint and token. The root command's
// flagconf.Apply has already filled the flags from the environment and
// marked them Changed; a flag given explicitly wins over its environment
// variable, even when empty.
func (inv *invocation) clientConfig(flags interface{ Changed(string) bool }) (*clientconfig.Config, error) {
	path, explicit := inv.configPathFor(flags)

	var file *clientconfig.File
	switch {
	case path == "":
		// No home directory: rely on flags and environment only.
	case explicit:
		loaded, err := clientconfig.LoadFile(path)
		if err != nil {
			return nil, failf("%v", err)
		}
		file = loaded
	default:
		if _, err := os.Stat(path); err == nil {
			loaded, err := clientconfig.LoadFile(path)
			if err != nil {
				return nil, failf("%v", err)
			}
			file = loaded
		} else if !errors.Is(err, fs.ErrNotExist) {
			return nil, failf("config %s: %v", path, err)
		}
	}

	cfg := &clientconfig.Config{}
	switch {
	case file != nil:
		c, err := file.Context(inv.contextName)
		if err != nil {
			if inv.contextName != "" {
				return nil, usageErrorf("--context: %s: %v", displayPath(path), err)
			}
			return nil, failf("config %s: %v", displayPath(path), err)
		}
		cfg = c
	case inv.contextName != "":
		return nil, usageErrorf("--context %q: no configuration file %s (create one with 'corral config set-context')", inv.contextName, displayPath(path))
	}

	if flags.Changed("endpoint") {
		cfg.Endpoint = inv.endpoint
	}
	if flags.Changed("token") {
		cfg.Token = inv.token
	}

	cfg.Endpoint = withDefaultPort(strings.TrimSpace(cfg.Endpoint))
	if cfg.Endpoint == "" {
		return nil, usageErrorf("no endpoint: pass --endpoint, set %s, or write %s", envEndpoint, displayPath(path))
	}
	if strings.ContainsFunc(cfg.Token, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return nil, usageErrorf("token contains whitespace or control characters")
	}
	return cfg, nil
}

// connect returns the connection to corrald, dialling it on first use.
// grpc.NewClient does no I/O, so connection failures surface on the first
// RPC and are reported by callError.
func (inv *invocation) connect(flags interface{ Changed(string) bool }) (*grpc.ClientConn, error) {
	if inv.conn != nil {
		return inv.conn, nil
	}
	if inv.timeout <= 0 {
		return nil, usageErrorf("--timeout must be positive, got %v", inv.timeout)
	}
	cfg, err := inv.clientConfig(flags)
	if err != nil {
		return nil, err
	}
	dial := inv.app.Dial
	if dial == nil {
		dial = func(cfg *clientconfig.Config) (*grpc.ClientConn, error) { return clientconfig.Dial(cfg) }
	}
	conn, err := dial(cfg)
	if err != nil {
		return nil, failf("cannot reach corrald at %s: %v", cfg.Endpoint, err)
	}
	inv.conn, inv.connTarget = conn, cfg.Endpoint
	return conn, nil
}

// withDefaultPort appends DefaultPort to a bare host name or IPv4
// address. Targets with a scheme, a port or an IPv6 literal are kept.
func withDefaultPort(endpoint string) string {
	if endpoint == "" || strings.ContainsAny(endpoint, ":/") {
		return endpoint
	}
	return endpoint + ":" + DefaultPort
}

func displayPath(path string) string {
	if path == "" {
		return "~/.config/corral/config.yaml"
	}
	return path
}
