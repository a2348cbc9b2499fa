package webhook

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
)

// ErrRefused means a receiver's URL or dialled address is not allowed
// without the flag that permits it.
var ErrRefused = errors.New("webhook: receiver refused")

// Range is an inclusive address range of the boot LAN.
type Range struct{ From, To netip.Addr }

// Contains reports whether a lies in r.
func (r Range) Contains(a netip.Addr) bool {
	a = a.Unmap()
	return r.From.BitLen() == a.BitLen() && r.From.Compare(a) <= 0 && a.Compare(r.To) <= 0
}

// PrefixRange is the range of p's addresses.
func PrefixRange(p netip.Prefix) Range {
	p = p.Masked()
	from := p.Addr()
	to := from.As16()
	bits := p.Bits()
	if from.Is4() {
		bits += 96
	}
	for i := bits; i < 128; i++ {
		to[i/8] |= 1 << (7 - i%8)
	}
	end := netip.AddrFrom16(to)
	if from.Is4() {
		end = end.Unmap()
	}
	return Range{From: from, To: end}
}

// Guard decides which addresses a receiver may be dialled at. The zero
// Guard knows no boot LAN and refuses loopback, link-local, unspecified
// and multicast addresses only.
type Guard struct {
	// BootLAN are the boot LAN's ranges: its DHCP ranges and the boot
	// listener's subnet.
	BootLAN []Range
}

// checkAddr refuses a on the boot LAN, loopback, link-local, unspecified
// or multicast unless allowBootLAN.
func (g Guard) checkAddr(a netip.Addr, allowBootLAN bool) error {
	a = a.Unmap()
	if allowBootLAN {
		return nil
	}
	switch {
	case a.IsLoopback():
		return fmt.Errorf("%w: %s is loopback (--allow-boot-lan permits it)", ErrRefused, a)
	case a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast():
		return fmt.Errorf("%w: %s is link-local (--allow-boot-lan permits it)", ErrRefused, a)
	case a.IsUnspecified(), a.IsMulticast():
		return fmt.Errorf("%w: %s is not a unicast address", ErrRefused, a)
	}
	for _, r := range g.BootLAN {
		if r.Contains(a) {
			return fmt.Errorf("%w: %s is on the boot LAN (--allow-boot-lan permits it)", ErrRefused, a)
		}
	}
	return nil
}

// Control is a net.Dialer Control hook: it runs on the address actually
// dialled, after name resolution, so a name that resolves (or is made to
// resolve, DNS rebinding) to a refused address is refused.
func (g Guard) Control(allowBootLAN bool) func(network, address string, _ syscall.RawConn) error {
	return func(_, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return fmt.Errorf("%w: dialled address %q", ErrRefused, address)
		}
		return g.checkAddr(ap.Addr(), allowBootLAN)
	}
}

// CheckURL validates a receiver's URL: http or https, a host, no user
// information; plain http only with allowInsecure; a literal address is
// checked as the dialler will check it. It returns the parsed URL.
func (g Guard) CheckURL(raw string, allowInsecure, allowBootLAN bool) (*url.URL, error) {
	if len(raw) > 2048 {
		return nil, fmt.Errorf("webhook URL longer than 2048 bytes")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("webhook URL: %w", err)
	}
	switch u.Scheme {
	case "https":
	case "http":
		if !allowInsecure {
			return nil, fmt.Errorf("%w: %s is plain http (--allow-insecure permits it)", ErrRefused, raw)
		}
	default:
		return nil, fmt.Errorf("webhook URL %q: want https:// (or http:// with --allow-insecure)", raw)
	}
	if u.Host == "" || u.Hostname() == "" {
		return nil, fmt.Errorf("webhook URL %q has no host", raw)
	}
	if u.User != nil {
		return nil, fmt.Errorf("webhook URL must not carry user information")
	}
	if u.Fragment != "" {
		return nil, fmt.Errorf("webhook URL must not carry a fragment")
	}
	host := u.Hostname()
	if a, err := netip.ParseAddr(host); err == nil {
		if err := g.checkAddr(a, allowBootLAN); err != nil {
			return nil, err
		}
	} else if strings.EqualFold(host, "localhost") || strings.HasSuffix(strings.ToLower(host), ".localhost") {
		if err := g.checkAddr(netip.MustParseAddr("127.0.0.1"), allowBootLAN); err != nil {
			return nil, err
		}
	}
	return u, nil
}

// ParseBootRange reads a DHCP range as corrald's flags write it:
// "START-END", "START-END/BITS", or a relayed "SUBNET=START-END@ROUTER"
// (the subnet is taken whole). It returns the ranges it names.
func ParseBootRange(s string) ([]Range, error) {
	var out []Range
	if sub, rest, ok := strings.Cut(s, "="); ok {
		p, err := netip.ParsePrefix(strings.TrimSpace(sub))
		if err != nil {
			return nil, err
		}
		out = append(out, PrefixRange(p))
		s = rest
	}
	s, _, _ = strings.Cut(s, "@")
	s, _, _ = strings.Cut(s, "/")
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		return nil, fmt.Errorf("range %q: want START-END", s)
	}
	from, err := netip.ParseAddr(strings.TrimSpace(a))
	if err != nil {
		return nil, err
	}
	to, err := netip.ParseAddr(strings.TrimSpace(b))
	if err != nil {
		return nil, err
	}
	return append(out, Range{From: from.Unmap(), To: to.Unmap()}), nil
}

// InterfaceRanges are the subnets of the named interface's addresses
// (nil when it has none or does not exist).
func InterfaceRanges(name string) []Range {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return nil
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return nil
	}
	var out []Range
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if p, err := netip.ParsePrefix(n.String()); err == nil {
				out = append(out, PrefixRange(p))
			}
		}
	}
	return out
}
