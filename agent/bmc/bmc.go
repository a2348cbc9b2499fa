// Package bmc reads the machine's BMC LAN address and MAC in-band,
// through the OpenIPMI device (/dev/ipmi0, loaded by ipmi_si and
// ipmi_devintf): it scans the IPMI channels for 802.3 LAN ones and reads
// their LAN configuration parameters (3 = IP address, 5 = MAC address).
// The device access goes through github.com/bougou/go-ipmi's local "open"
// interface. It must not import store/, boot/, ipmi/ or bmclib.
package bmc

import (
	"context"
	"errors"
	"fmt"
	"net"

	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
)

// Device is the IPMI access Read needs.
type Device interface {
	// ChannelMedium returns the medium type of channel ch (4 = 802.3 LAN).
	ChannelMedium(ctx context.Context, ch uint8) (uint8, error)
	// LanParam returns the data of LAN configuration parameter param on
	// channel ch (without completion code and revision).
	LanParam(ctx context.Context, ch uint8, param uint8) ([]byte, error)
}

const (
	mediumLAN = 0x04
	paramIP   = 3
	paramMAC  = 5
)

// ErrNoLAN means no channel with an 802.3 LAN medium answered.
var ErrNoLAN = errors.New("bmc: no LAN channel")

// Read scans channels 1-11 and returns the first LAN channel with a
// non-zero IPv4 address, else the first LAN channel found. Channels that
// fail to answer are skipped; ctx bounds the whole scan.
func Read(ctx context.Context, dev Device) (*inventoryv1.Facts_BmcLan, error) {
	var first *inventoryv1.Facts_BmcLan
	var errs []error
	for ch := uint8(1); ch <= 11; ch++ {
		if err := ctx.Err(); err != nil {
			return first, err
		}
		medium, err := dev.ChannelMedium(ctx, ch)
		if err != nil {
			errs = append(errs, fmt.Errorf("channel %d: %w", ch, err))
			continue
		}
		if medium&0x7f != mediumLAN {
			continue
		}
		lan := &inventoryv1.Facts_BmcLan{Channel: uint32(ch)}
		if ip, err := dev.LanParam(ctx, ch, paramIP); err == nil && len(ip) >= 4 {
			if v4 := net.IP(ip[:4]); !v4.Equal(net.IPv4zero) {
				lan.Ipv4Address = v4.String()
			}
		}
		if mac, err := dev.LanParam(ctx, ch, paramMAC); err == nil && len(mac) >= 6 {
			lan.Mac = net.HardwareAddr(mac[:6]).String()
		}
		if lan.Ipv4Address != "" {
			return lan, nil
		}
		if first == nil {
			first = lan
		}
	}
	if first != nil {
		return first, nil
	}
	return nil, fmt.Errorf("%w: %w", ErrNoLAN, errors.Join(errs...))
}
