package ipmi

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Sentinel errors. Controller errors wrap one of them (or a context error)
// so callers can classify with errors.Is.
var (
	// ErrInvalid: the request itself is malformed (address, protocol,
	// cipher suite, action); nothing was sent.
	ErrInvalid = errors.New("invalid BMC request")
	// ErrAuth: the BMC rejected the credentials.
	ErrAuth = errors.New("BMC authentication failed")
	// ErrUnreachable: no provider could talk to the BMC (no answer, refused,
	// or the call deadline passed).
	ErrUnreachable = errors.New("BMC unreachable")
	// ErrProtocol: the BMC answered something no provider understood.
	ErrProtocol = errors.New("BMC answered garbage")
	// ErrFailed: the BMC understood and refused or failed the operation.
	ErrFailed = errors.New("BMC operation failed")
)

// PowerState is a machine's normalised power state.
type PowerState int

// The power states: PowerUnknown when a BMC's answer could not be read
// or normalised.
const (
	PowerUnknown PowerState = iota
	PowerOn
	PowerOff
)

func (s PowerState) String() string {
	switch s {
	case PowerOn:
		return "on"
	case PowerOff:
		return "off"
	default: // PowerUnknown and values outside the enum
		return "unknown"
	}
}

// NormalizePowerState maps a provider's power state string to a
// PowerState: "on", "On", "Chassis Power is on", "PoweringOn" are on;
// "off", "Off", "Chassis Power is off", "PoweringOff" are off (a
// transition counts as its destination); anything else is unknown.
func NormalizePowerState(s string) PowerState {
	s = strings.ToLower(strings.TrimSpace(s))
	s = strings.TrimPrefix(s, "chassis power is ")
	switch s {
	case "on", "poweringon", "powering on":
		return PowerOn
	case "off", "poweringoff", "powering off":
		return PowerOff
	}
	return PowerUnknown
}

// PowerAction is a power operation.
type PowerAction int

const (
	// ActionOn powers on; success when already on.
	ActionOn PowerAction = iota + 1
	// ActionOff powers off hard; success when already off.
	ActionOff
	// ActionSoftOff asks the OS to shut down (ACPI); success when already off.
	ActionSoftOff
	// ActionCycle powers off then on; when off it powers on.
	ActionCycle
	// ActionReset resets (warm); when off it powers on.
	ActionReset
)

func (a PowerAction) String() string {
	switch a {
	case ActionOn:
		return "on"
	case ActionOff:
		return "off"
	case ActionSoftOff:
		return "soft"
	case ActionCycle:
		return "cycle"
	case ActionReset:
		return "reset"
	}
	return fmt.Sprintf("action(%d)", int(a))
}

// ParsePowerAction parses on, off, soft, cycle or reset.
func ParsePowerAction(s string) (PowerAction, error) {
	for _, a := range []PowerAction{ActionOn, ActionOff, ActionSoftOff, ActionCycle, ActionReset} {
		if strings.EqualFold(s, a.String()) {
			return a, nil
		}
	}
	return 0, fmt.Errorf("%w: power action %q: use on, off, soft, cycle or reset", ErrInvalid, s)
}

// BootDevice is a next-boot device.
type BootDevice int

// The next-boot devices a BMC is asked for; the zero value is none.
const (
	BootPXE BootDevice = iota + 1
	BootDisk
	BootBIOS
)

func (d BootDevice) String() string {
	switch d {
	case BootPXE:
		return "pxe"
	case BootDisk:
		return "disk"
	case BootBIOS:
		return "bios"
	}
	return fmt.Sprintf("bootdevice(%d)", int(d))
}

// ParseBootDevice parses pxe, disk or bios.
func ParseBootDevice(s string) (BootDevice, error) {
	for _, d := range []BootDevice{BootPXE, BootDisk, BootBIOS} {
		if strings.EqualFold(s, d.String()) {
			return d, nil
		}
	}
	return 0, fmt.Errorf("%w: boot device %q: use pxe, disk or bios", ErrInvalid, s)
}

// BootOptions qualify SetBootDevice.
type BootOptions struct {
	// Persistent keeps the device for every boot; otherwise next boot only.
	Persistent bool
	// EFI asks for a UEFI boot (otherwise legacy BIOS).
	EFI bool
}

// Protocol selects which providers are tried.
type Protocol int

const (
	// ProtocolAuto tries IPMI providers first, then Redfish, each on
	// its own port (Target.PortFor).
	ProtocolAuto Protocol = iota
	// ProtocolIPMI speaks only IPMI (RMCP+ or ipmitool).
	ProtocolIPMI
	// ProtocolRedfish speaks only Redfish over HTTPS.
	ProtocolRedfish
)

func (p Protocol) String() string {
	switch p {
	case ProtocolIPMI:
		return "ipmi"
	case ProtocolRedfish:
		return "redfish"
	default: // ProtocolAuto and values outside the enum
		return "auto"
	}
}

// ParseProtocol parses auto (or ""), ipmi or redfish.
func ParseProtocol(s string) (Protocol, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "auto":
		return ProtocolAuto, nil
	case "ipmi":
		return ProtocolIPMI, nil
	case "redfish":
		return ProtocolRedfish, nil
	}
	return 0, fmt.Errorf("%w: protocol %q is not supported: use auto, ipmi or redfish", ErrInvalid, s)
}

// Default ports.
const (
	DefaultIPMIPort    = 623
	DefaultRedfishPort = 443
)

// DefaultPort is the port a protocol uses when none is given (auto: IPMI's;
// Target.PortFor gives the port each protocol is tried on under auto).
func (p Protocol) DefaultPort() int {
	if p == ProtocolRedfish {
		return DefaultRedfishPort
	}
	return DefaultIPMIPort
}

// Target says how to reach one BMC. The password only ever lives in
// memory; Target's String and LogValue never include it.
type Target struct {
	Host     string
	Port     int // 0: the protocol's default
	Protocol Protocol
	Username string
	Password string
	// CipherSuite is the RMCP+ cipher suite; 0 tries 17, then 3.
	CipherSuite int
	// Timeout bounds each call (default Config.CallTimeout).
	Timeout time.Duration
	// TLSMode and TLSSHA256 say how a Redfish BMC's certificate is
	// checked (see TLSMode); IPMI ignores them. TLSSHA256 is the pin
	// (Fingerprint of the leaf certificate) and is only valid with
	// TLSPinned. The zero value refuses Redfish: nothing is pinned.
	TLSMode   TLSMode
	TLSSHA256 string
}

// Addr is host:port with the protocol's default port filled in.
func (t Target) Addr() string {
	p := t.Port
	if p == 0 {
		p = t.Protocol.DefaultPort()
	}
	return net.JoinHostPort(t.Host, strconv.Itoa(p))
}

// PortFor is the port the providers of protocol p (ProtocolIPMI or
// ProtocolRedfish) dial for t. A given port is used as it is, except that
// under ProtocolAuto the IPMI port 623 (what callers fill in for "none
// given") sends Redfish to 443: IPMI is RMCP+ on UDP 623 and Redfish is
// HTTPS, so one port never serves both, and a Redfish-only BMC must be
// found where it listens.
func (t Target) PortFor(p Protocol) int {
	switch {
	case t.Port == 0:
		return p.DefaultPort()
	case p == ProtocolRedfish && t.Protocol == ProtocolAuto && t.Port == DefaultIPMIPort:
		return DefaultRedfishPort
	}
	return t.Port
}

// String names the protocol and address; under auto with the default
// ports, both ports tried.
func (t Target) String() string {
	if t.Protocol == ProtocolAuto {
		if ip, rf := t.PortFor(ProtocolIPMI), t.PortFor(ProtocolRedfish); ip != rf {
			return fmt.Sprintf("auto://%s (ipmi :%d, redfish :%d)", t.Host, ip, rf)
		}
	}
	return t.Protocol.String() + "://" + t.Addr()
}

// Validate checks the target without contacting it.
func (t Target) Validate() error {
	if err := checkHost(t.Host); err != nil {
		return err
	}
	if t.Port < 0 || t.Port > 65535 {
		return fmt.Errorf("%w: port %d out of range", ErrInvalid, t.Port)
	}
	if t.Protocol < ProtocolAuto || t.Protocol > ProtocolRedfish {
		return fmt.Errorf("%w: protocol %d", ErrInvalid, int(t.Protocol))
	}
	if t.Username == "" {
		return fmt.Errorf("%w: a BMC user name is required", ErrInvalid)
	}
	if len(t.Username) > 16 && t.Protocol == ProtocolIPMI {
		return fmt.Errorf("%w: IPMI user names are at most 16 bytes", ErrInvalid)
	}
	if t.CipherSuite < 0 || t.CipherSuite > 17 {
		return fmt.Errorf("%w: cipher suite %d: IPMI defines 0-17 (0 here means try 17, then 3)", ErrInvalid, t.CipherSuite)
	}
	switch t.TLSMode {
	case TLSPinned:
		if t.TLSSHA256 != "" {
			return checkFingerprint(t.TLSSHA256)
		}
	case TLSFirstUse, TLSInsecure:
		if t.TLSSHA256 != "" {
			return fmt.Errorf("%w: a TLS pin is only used with TLS mode pinned, not %s", ErrInvalid, t.TLSMode)
		}
	default:
		return fmt.Errorf("%w: TLS mode %d", ErrInvalid, int(t.TLSMode))
	}
	return nil
}

var hostnameRE = regexp.MustCompile(`^(?i)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*$`)

func checkHost(h string) error {
	if h == "" {
		return fmt.Errorf("%w: a BMC address is required", ErrInvalid)
	}
	if ip := net.ParseIP(h); ip != nil {
		if ip.IsUnspecified() || ip.IsMulticast() {
			return fmt.Errorf("%w: BMC address %s is not a unicast address", ErrInvalid, h)
		}
		return nil
	}
	if len(h) > 253 || !hostnameRE.MatchString(h) {
		return fmt.Errorf("%w: BMC address %q is neither an IP address nor a host name", ErrInvalid, h)
	}
	// All-numeric dotted names that are not IPs (999.1.1.1) are mistakes.
	if strings.Trim(h, "0123456789.") == "" {
		return fmt.Errorf("%w: BMC address %q is not a valid IPv4 address", ErrInvalid, h)
	}
	return nil
}

// ParseAddress splits "host", "host:port", "[v6]" or "[v6]:port". Port is 0
// when absent. Schemes, paths and user info are refused.
func ParseAddress(s string) (host string, port int, err error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return "", 0, fmt.Errorf("%w: a BMC address is required", ErrInvalid)
	}
	if strings.ContainsAny(s, "/@ ") {
		return "", 0, fmt.Errorf("%w: BMC address %q: give host[:port] (no scheme, path or user)", ErrInvalid, s)
	}
	host = s
	switch {
	case strings.HasPrefix(s, "["):
		if strings.HasSuffix(s, "]") {
			host = s[1 : len(s)-1]
			break
		}
		h, p, e := net.SplitHostPort(s)
		if e != nil {
			return "", 0, fmt.Errorf("%w: BMC address %q: %v", ErrInvalid, s, e)
		}
		host = h
		if port, err = parsePort(p); err != nil {
			return "", 0, err
		}
	case strings.Count(s, ":") == 1:
		h, p, e := net.SplitHostPort(s)
		if e != nil {
			return "", 0, fmt.Errorf("%w: BMC address %q: %v", ErrInvalid, s, e)
		}
		host = h
		if port, err = parsePort(p); err != nil {
			return "", 0, err
		}
	case strings.Count(s, ":") > 1:
		// A bare IPv6 address.
		if net.ParseIP(s) == nil {
			return "", 0, fmt.Errorf("%w: BMC address %q: put IPv6 addresses with a port in brackets", ErrInvalid, s)
		}
	}
	if err := checkHost(host); err != nil {
		return "", 0, err
	}
	return strings.ToLower(host), port, nil
}

func parsePort(p string) (int, error) {
	n, err := strconv.Atoi(p)
	if err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("%w: port %q must be 1-65535", ErrInvalid, p)
	}
	return n, nil
}

// Attempt is what one provider answered to one call.
type Attempt struct {
	Provider string
	// Err is empty when the provider answered.
	Err  string
	Took time.Duration
}

// Answer records a call: which provider answered (empty when none did)
// and every provider tried, in order.
type Answer struct {
	Provider string
	Attempts []Attempt
	// Note says when uniform semantics changed the operation (for example
	// "already on" or "off: cycle became on").
	Note string
	// TLSSHA256 is the Fingerprint of the leaf certificate a Redfish BMC
	// presented in this call, whatever the TLS mode (empty when no TLS
	// handshake got that far). With TLSFirstUse it is the one to pin.
	TLSSHA256 string
}

func (a Answer) String() string {
	var b strings.Builder
	if a.Provider != "" {
		b.WriteString("answered by " + a.Provider)
	} else {
		b.WriteString("no provider answered")
	}
	for _, at := range a.Attempts {
		if at.Err != "" {
			fmt.Fprintf(&b, "; %s: %s", at.Provider, at.Err)
		}
	}
	if a.Note != "" {
		b.WriteString("; " + a.Note)
	}
	return b.String()
}

// Info is what a BMC says about itself.
type Info struct {
	Provider string
	// Vendor and Model when the provider knows them.
	Vendor, Model string
	// Firmware is the BMC firmware revision when known.
	Firmware string
}
