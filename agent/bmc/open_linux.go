package bmc

import (
	"context"
	"fmt"

	"github.com/u-root/u-root/pkg/ipmi"
)

// OpenDevice is a Device on /dev/ipmi0 through u-root's OpenIPMI ioctl
// client (chosen over go-ipmi's equivalent "open" interface because it
// adds ~40 KB to the agent instead of several MB). Each request waits at
// most 10 s for its answer (u-root's fixed receive deadline); ctx is
// checked before every request.
type OpenDevice struct {
	dev *ipmi.IPMI
}

// Open opens /dev/ipmi0. The caller must Close the device.
func Open(ctx context.Context) (*OpenDevice, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d, err := ipmi.OpenPath("/dev/ipmi0")
	if err != nil {
		return nil, err
	}
	return &OpenDevice{dev: d}, nil
}

const (
	netFnApp          = 0x06
	cmdGetChannelInfo = 0x42
)

// ChannelMedium implements Device (Get Channel Info: cc, channel, medium,
// protocol, ...).
func (d *OpenDevice) ChannelMedium(ctx context.Context, ch uint8) (uint8, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	r, err := d.dev.RawCmd([]byte{netFnApp, cmdGetChannelInfo, ch})
	if err != nil {
		return 0, err
	}
	if len(r) < 3 {
		return 0, fmt.Errorf("get channel info %d: short answer % x", ch, r)
	}
	return r[2], nil
}

// LanParam implements Device (Get LAN Configuration Parameters: cc,
// revision, data).
func (d *OpenDevice) LanParam(ctx context.Context, ch uint8, param uint8) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r, err := d.dev.GetLanConfig(ch, param)
	if err != nil {
		return nil, err
	}
	if len(r) < 2 {
		return nil, fmt.Errorf("get LAN parameter %d on channel %d: short answer % x", param, ch, r)
	}
	return r[2:], nil
}

// Close releases the device.
func (d *OpenDevice) Close(context.Context) error { return d.dev.Close() }
