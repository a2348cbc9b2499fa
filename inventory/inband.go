package inventory

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
)

// bmcAddrPrefix keys the BMC address index: which machine an enrolled BMC
// address (host:port) belongs to. BMC enrolment (inventory/bmc) writes it;
// identification reads it (a machine enrolled before it ever booted is
// found by the BMC LAN address its agent reads in-band).
const bmcAddrPrefix = store.BMCAddrsPrefix

// BMCAddressKey is the store key of the BMC address index record for
// host:port (inventory/bmc claims and releases it).
func BMCAddressKey(host string, port uint32) string {
	return bmcAddrPrefix + net.JoinHostPort(host, strconv.Itoa(int(port)))
}

// FlagBMCAddressMismatch starts a machine flag set when the agent reads a
// BMC LAN address in-band that differs from the enrolled one.
const FlagBMCAddressMismatch = "bmc-address-mismatch"

var bmcHostRE = regexp.MustCompile(`^(?i)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*$`)

// ParseBMCAddress splits "host", "host:port", "[v6]" or "[v6]:port" and
// validates the host (an IP address or a DNS name). port is 0 when absent.
func ParseBMCAddress(s string) (host string, port uint32, err error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return "", 0, apierr.Invalidf("a BMC address is required")
	}
	if strings.ContainsAny(s, "/@ \t") {
		return "", 0, apierr.Invalidf("BMC address %q is malformed: give host[:port] (no scheme, path or user)", s)
	}
	host = s
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		host = s[1 : len(s)-1]
	} else if strings.HasPrefix(s, "[") || strings.Count(s, ":") == 1 {
		h, p, e := net.SplitHostPort(s)
		if e != nil {
			return "", 0, apierr.Invalidf("BMC address %q is malformed: %v", s, e)
		}
		n, e := strconv.Atoi(p)
		if e != nil || n < 1 || n > 65535 {
			return "", 0, apierr.Invalidf("BMC address %q: port must be 1-65535", s)
		}
		host, port = h, uint32(n)
	}
	if ip := net.ParseIP(host); ip != nil {
		if ip.IsUnspecified() || ip.IsMulticast() {
			return "", 0, apierr.Invalidf("BMC address %q is not a unicast address", s)
		}
		return ip.String(), port, nil
	}
	if strings.Contains(host, ":") {
		return "", 0, apierr.Invalidf("BMC address %q is malformed: put an IPv6 address with a port in brackets", s)
	}
	if len(host) > 253 || !bmcHostRE.MatchString(host) || strings.Trim(host, "0123456789.") == "" {
		return "", 0, apierr.Invalidf("BMC address %q is neither an IP address nor a host name", s)
	}
	return strings.ToLower(host), port, nil
}

// ReconcileBMCAddress is the discovery hook: the agent read the BMC's LAN
// address in-band. A machine without a BMC address gets it filled (to be
// enrolled with credentials later); one enrolled at another address is
// flagged (FlagBMCAddressMismatch) and the mismatch recorded in its
// timeline; a match clears the flag.
func (i *Inventory) ReconcileBMCAddress(ctx context.Context, name, reported string) (*inventoryv1.Machine, error) {
	if strings.TrimSpace(reported) == "" {
		return i.GetMachine(ctx, name)
	}
	host, _, err := ParseBMCAddress(reported)
	if err != nil {
		return nil, err
	}
	var filled, mismatch bool
	m, err := i.UpdateMachine(ctx, name, func(m *inventoryv1.Machine) error {
		filled, mismatch = applyInbandBMC(m, host)
		return nil
	})
	if err != nil {
		return nil, err
	}
	i.inbandBMCEvents(m, host, filled, mismatch)
	return m, nil
}

// applyInbandBMC records the in-band BMC address on m: it fills an empty
// enrolled address, and sets or clears the mismatch flag.
func applyInbandBMC(m *inventoryv1.Machine, host string) (filled, mismatch bool) {
	if m.Bmc == nil {
		m.Bmc = &inventoryv1.Bmc{}
	}
	m.Bmc.InbandAddress = host
	if m.Bmc.GetAddress() == "" {
		m.Bmc.Address = host
		filled = true
	}
	m.Flags = BMCMismatchFlags(m.GetFlags(), m.Bmc)
	return filled, m.Bmc.GetAddress() != host
}

// inbandBMCEvents logs and records what applyInbandBMC did.
func (i *Inventory) inbandBMCEvents(m *inventoryv1.Machine, host string, filled, mismatch bool) {
	name, mac := m.GetName(), m.GetBootMac()
	switch {
	case filled:
		i.log.Info("BMC address filled from discovery", "machine", name, "bmc", host)
		if mac != "" {
			i.Event(mac, "bmc", "bmc-address-filled", "BMC LAN address "+host+" read in-band; enroll credentials to control it", nil)
		}
	case mismatch:
		i.log.Warn("BMC address mismatch", "machine", name, "bmc", m.GetBmc().GetAddress(), "inband", host)
		if mac != "" {
			i.Event(mac, "bmc", FlagBMCAddressMismatch, fmt.Sprintf("enrolled %s, agent reads %s in-band", m.GetBmc().GetAddress(), host), nil)
		}
	}
}

// BMCMismatchFlags sets or clears the mismatch flag for b.
func BMCMismatchFlags(flags []string, b *inventoryv1.Bmc) []string {
	out := make([]string, 0, len(flags)+1)
	for _, f := range flags {
		if !strings.HasPrefix(f, FlagBMCAddressMismatch) {
			out = append(out, f)
		}
	}
	if b.GetInbandAddress() != "" && b.GetAddress() != "" && b.GetInbandAddress() != b.GetAddress() {
		out = append(out, fmt.Sprintf("%s: enrolled %s, agent reads %s in-band", FlagBMCAddressMismatch, b.GetAddress(), b.GetInbandAddress()))
	}
	return out
}
