// Package cmdline is the contract between the appliance's iPXE scripts and
// the agent on the machine: the kernel command-line parameters that carry
// the appliance endpoints (this appliance first, then its peers, so the
// agent can fail over), the per-boot token, the CA fingerprint, the boot
// MAC and the agent mode, and the length budget of the line. It is the one
// place they are declared: boot/http formats them; corral-node parses them.
// It imports nothing of Corral's (only the standard library), so both sides
// may use it.
package cmdline

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Parameter names on the kernel command line.
const (
	KeyEndpoint = "corral.endpoint" // host:port[,host:port...] of the appliances' gRPC API, in the order to try them
	KeyToken    = "corral.token"    // per-boot ROLE_AGENT bearer token
	KeyCA       = "corral.ca"       // SHA-256 of the CA certificate (DER), hex, optionally "sha256:"-prefixed
	KeyMAC      = "corral.mac"      // boot MAC, aa:bb:cc:dd:ee:ff
	KeyMode     = "corral.mode"     // agent mode: ModeDiscover (default) or ModeHypervisor
	// KeyBOOTIF is pxelinux's boot interface parameter (01-aa-bb-...),
	// accepted as a fallback for the boot MAC.
	KeyBOOTIF = "BOOTIF"
	// KeyLLDP is how long the discovery agent may wait for its NICs' LLDP
	// neighbours once they are up (a Go duration such as 35s; 0 turns
	// listening off). It is not one of Params: the appliance's scripts do
	// not write it, an operator adds it to the boot kernel arguments
	// (corrald --boot-kernel-args); LLDPWindow reads it.
	KeyLLDP = "corral.lldp"
)

// MaxLLDPWindow bounds KeyLLDP's value: a switch sends every 30 s by
// default, and discovery must not hang on a typo.
const MaxLLDPWindow = 2 * time.Minute

// LLDPWindow reads KeyLLDP from a kernel command line: ok is false when
// it is absent, err non-nil when it is not a duration between 0 and
// MaxLLDPWindow. The last occurrence wins.
func LLDPWindow(line string) (d time.Duration, ok bool, err error) {
	var v string
	for _, f := range strings.Fields(line) {
		if k, val, found := strings.Cut(f, "="); found && k == KeyLLDP {
			v, ok = val, true
		}
	}
	if !ok {
		return 0, false, nil
	}
	d, err = time.ParseDuration(v)
	if err != nil || d < 0 || d > MaxLLDPWindow {
		return 0, true, fmt.Errorf("%s=%q: want a duration from 0 to %v", KeyLLDP, clip(v), MaxLLDPWindow)
	}
	return d, true, nil
}

// Values of KeyMode. An absent corral.mode means ModeDiscover.
const (
	ModeDiscover   = "discover"
	ModeHypervisor = "hypervisor"
)

// MaxLen is the kernel command-line budget Corral allows itself (Linux
// accepts 2048 bytes on x86).
const MaxLen = 2048

// MaxEndpoints bounds the appliance endpoints corral.endpoint may list.
const MaxEndpoints = 8

// Params are the values the agent needs to reach the appliance.
type Params struct {
	// Endpoints are the appliances' API host:port, in the order the agent
	// tries them (the appliance that rendered the line first): 1 to
	// MaxEndpoints, each distinct.
	Endpoints     []string
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
	if err := checkEndpoints(p.Endpoints); err != nil {
		return err
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
		KeyEndpoint + "=" + strings.Join(p.Endpoints, ","),
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

// ErrMissing means the command line carries no Corral parameters at all.
var ErrMissing = errors.New("cmdline: no corral.* parameters")

// Parse reads Params from a kernel command line (/proc/cmdline). Unknown
// parameters are ignored; the last occurrence of a key wins. BOOTIF
// supplies the MAC when corral.mac is absent.
func Parse(line string) (Params, error) {
	var p Params
	var epErr error
	found := false
	for _, f := range strings.Fields(line) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			continue
		}
		switch k {
		case KeyEndpoint:
			found = true
			if p.Endpoints, epErr = ParseEndpoints(v); epErr != nil {
				epErr = fmt.Errorf("%s: %w", KeyEndpoint, epErr)
			}
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
	if epErr != nil {
		return p, epErr
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

// ParseEndpoints splits a corral.endpoint value (host:port, comma-separated)
// and checks every element. A repeated endpoint is kept once, in its first
// place. The error names each element refused: an empty one, one that is
// not host:port, and the count when there are more than MaxEndpoints.
func ParseEndpoints(v string) ([]string, error) {
	if v == "" {
		return nil, errors.New("empty: want host:port[,host:port...]")
	}
	parts := strings.Split(v, ",")
	var out []string
	var refused []string
	for i, e := range parts {
		if err := CheckEndpoint(e); err != nil {
			refused = append(refused, fmt.Sprintf("element %d: %v", i+1, err))
			continue
		}
		if !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	if len(parts) > MaxEndpoints {
		refused = append([]string{fmt.Sprintf("%d endpoints, at most %d", len(parts), MaxEndpoints)}, refused...)
	}
	if len(refused) > 0 {
		return nil, fmt.Errorf("%q refused: %s", clip(v), strings.Join(refused, "; "))
	}
	return out, nil
}

// IPv6Only reports whether every endpoint names an IPv6 address: the
// appliances are reached over IPv6 only, so the agent's network comes from
// DHCPv6 (netup.Config.IPv6). A host name, or any IPv4 address, says no.
func IPv6Only(endpoints []string) bool {
	for _, e := range endpoints {
		h, _, err := net.SplitHostPort(e)
		a, perr := netip.ParseAddr(h)
		if err != nil || perr != nil || !a.Is6() || a.Is4In6() {
			return false
		}
	}
	return len(endpoints) > 0
}

// checkEndpoints checks a list as Params carries it.
func checkEndpoints(eps []string) error {
	switch {
	case len(eps) == 0:
		return fmt.Errorf("%s: no endpoint: want host:port", KeyEndpoint)
	case len(eps) > MaxEndpoints:
		return fmt.Errorf("%s: %d endpoints, at most %d", KeyEndpoint, len(eps), MaxEndpoints)
	}
	for i, e := range eps {
		if err := CheckEndpoint(e); err != nil {
			return fmt.Errorf("%s element %d: %w", KeyEndpoint, i+1, err)
		}
		if slices.Contains(eps[:i], e) {
			return fmt.Errorf("%s element %d: %q is listed twice", KeyEndpoint, i+1, e)
		}
	}
	return nil
}

// maxHost is the longest DNS name (RFC 1035).
const maxHost = 253

var (
	labelRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$`)
	zoneRE  = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,15}$`)
)

// CheckEndpoint reports whether e is one appliance endpoint: host:port with
// an IP address (IPv6 in brackets) or a DNS name as host and a port
// 1-65535. Nothing else may travel in the list: no spaces, commas or
// quotes reach the kernel command line or the iPXE script.
func CheckEndpoint(e string) error {
	if e == "" {
		return errors.New("empty: want host:port")
	}
	host, port, err := net.SplitHostPort(e)
	if err != nil {
		return fmt.Errorf("%q: want host:port", clip(e))
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != port {
		return fmt.Errorf("%q: port %q: want 1-65535", clip(e), clip(port))
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if z := a.Zone(); z != "" && !zoneRE.MatchString(z) {
			return fmt.Errorf("%q: IPv6 zone %q: want an interface name", clip(e), clip(z))
		}
		return nil
	}
	if strings.Contains(e, "[") {
		return fmt.Errorf("%q: %q is not an IP address", clip(e), clip(host))
	}
	if host == "" || len(host) > maxHost {
		return fmt.Errorf("%q: host: want an IP address or a DNS name of 1-%d bytes", clip(e), maxHost)
	}
	for _, l := range strings.Split(strings.TrimSuffix(host, "."), ".") {
		if !labelRE.MatchString(l) {
			return fmt.Errorf("%q: host %q: want an IP address or a DNS name (letters, digits, '-', '.')", clip(e), clip(host))
		}
	}
	return nil
}

// clip shortens what an error quotes from the command line.
func clip(s string) string {
	const limit = 80
	if len(s) <= limit {
		return s
	}
	return s[:limit] + "…"
}
