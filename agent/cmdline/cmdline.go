// Package cmdline is the contract between the appliance's iPXE scripts and
// the agent on the machine: the kernel command-line parameters that carry
// the appliance endpoint, the per-boot token, the CA fingerprint, the boot
// MAC and the agent mode, and the length budget of the line. It is the one
// place they are declared: boot/http formats them; corral-node parses them.
// It imports nothing of Corral's (only the standard library), so both sides
// may use it.
package cmdline

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
)

// Parameter names on the kernel command line.
const (
	KeyEndpoint = "corral.endpoint" // host:port of the appliance gRPC API
	KeyToken    = "corral.token"    // per-boot ROLE_AGENT bearer token
	KeyCA       = "corral.ca"       // SHA-256 of the CA certificate (DER), hex, optionally "sha256:"-prefixed
	KeyMAC      = "corral.mac"      // boot MAC, aa:bb:cc:dd:ee:ff
	KeyMode     = "corral.mode"     // agent mode: ModeDiscover (default) or ModeHypervisor
	// KeyBOOTIF is pxelinux's boot interface parameter (01-aa-bb-...),
	// accepted as a fallback for the boot MAC.
	KeyBOOTIF = "BOOTIF"
)

// Values of KeyMode. An absent corral.mode means ModeDiscover.
const (
	ModeDiscover   = "discover"
	ModeHypervisor = "hypervisor"
)

// MaxLen is the kernel command-line budget Corral allows itself (Linux
// accepts 2048 bytes on x86).
const MaxLen = 2048

// Params are the values the agent needs to reach the appliance.
type Params struct {
	Endpoint      string
	Token         string
	CAFingerprint string
	MAC           string
	Mode          string
}

var (
	fpRE    = regexp.MustCompile(`^[0-9a-f]{64}$`)
	tokenRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,256}$`)
)

// Validate reports the first problem with p.
func (p Params) Validate() error {
	if _, _, err := net.SplitHostPort(p.Endpoint); err != nil || p.Endpoint == "" {
		return fmt.Errorf("%s=%q: want host:port", KeyEndpoint, p.Endpoint)
	}
	if !tokenRE.MatchString(p.Token) {
		return fmt.Errorf("%s: missing or malformed", KeyToken)
	}
	if !fpRE.MatchString(p.CAFingerprint) {
		return fmt.Errorf("%s=%q: want 64 lowercase hex digits", KeyCA, p.CAFingerprint)
	}
	if hw, err := net.ParseMAC(p.MAC); err != nil || len(hw) != 6 {
		return fmt.Errorf("%s=%q: want a MAC address", KeyMAC, p.MAC)
	}
	switch p.Mode {
	case "", ModeDiscover, ModeHypervisor:
	default:
		return fmt.Errorf("%s=%q: want %s or %s", KeyMode, p.Mode, ModeDiscover, ModeHypervisor)
	}
	return nil
}

// Format renders p as space-separated key=value parameters. It fails when
// p is invalid or the result would not fit MaxLen.
func (p Params) Format() (string, error) {
	if err := p.Validate(); err != nil {
		return "", err
	}
	parts := []string{
		KeyEndpoint + "=" + p.Endpoint,
		KeyToken + "=" + p.Token,
		KeyCA + "=" + p.CAFingerprint,
		KeyMAC + "=" + strings.ToLower(p.MAC),
	}
	if p.Mode != "" {
		parts = append(parts, KeyMode+"="+p.Mode)
	}
	s := strings.Join(parts, " ")
	if len(s) > MaxLen {
		return "", fmt.Errorf("kernel command line would be %d bytes, over %d", len(s), MaxLen)
	}
	return s, nil
}

// ErrMissing: the command line carries no Corral parameters at all.
var ErrMissing = errors.New("cmdline: no corral.* parameters")

// Parse reads Params from a kernel command line (/proc/cmdline). Unknown
// parameters are ignored; the last occurrence of a key wins. BOOTIF
// supplies the MAC when corral.mac is absent.
func Parse(line string) (Params, error) {
	var p Params
	found := false
	for _, f := range strings.Fields(line) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			continue
		}
		switch k {
		case KeyEndpoint:
			p.Endpoint, found = v, true
		case KeyToken:
			p.Token, found = v, true
		case KeyCA:
			// "sha256:" names the digest; the bare hex form is the same.
			p.CAFingerprint, found = strings.TrimPrefix(strings.ToLower(v), "sha256:"), true
		case KeyMAC:
			p.MAC, found = strings.ToLower(v), true
		case KeyMode:
			p.Mode = v
		case KeyBOOTIF:
			if p.MAC == "" {
				p.MAC = bootifMAC(v)
			}
		}
	}
	if !found {
		return p, ErrMissing
	}
	return p, p.Validate()
}

// bootifMAC turns pxelinux's "01-aa-bb-cc-dd-ee-ff" into "aa:bb:cc:dd:ee:ff".
func bootifMAC(v string) string {
	v = strings.ToLower(v)
	if len(v) == 20 && strings.HasPrefix(v, "01-") {
		v = v[3:]
	}
	return strings.ReplaceAll(v, "-", ":")
}
