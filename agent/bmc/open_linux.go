package bmc

import (
	"context"

	"github.com/bougou/go-ipmi/pkg/client"
	"github.com/bougou/go-ipmi/pkg/types"
)

// OpenDevice is a Device on /dev/ipmi0.
type OpenDevice struct {
	c *client.Client
}

// Open connects to /dev/ipmi0. The caller must Close the device.
func Open(ctx context.Context) (*OpenDevice, error) {
	c, err := client.NewOpenClient()
	if err != nil {
		return nil, err
	}
	if err := c.Connect(ctx); err != nil {
		return nil, err
	}
	return &OpenDevice{c: c}, nil
}

// ChannelMedium implements Device.
func (d *OpenDevice) ChannelMedium(ctx context.Context, ch uint8) (uint8, error) {
	r, err := d.c.GetChannelInfo(ctx, ch)
	if err != nil {
		return 0, err
	}
	return uint8(r.ChannelMedium), nil
}

// LanParam implements Device.
func (d *OpenDevice) LanParam(ctx context.Context, ch uint8, param uint8) ([]byte, error) {
	r, err := d.c.GetLanConfigParam(ctx, ch, types.LanConfigParamSelector(param), 0, 0)
	if err != nil {
		return nil, err
	}
	return r.ParamData, nil
}

// Close releases the device.
func (d *OpenDevice) Close(ctx context.Context) error { return d.c.Close(ctx) }
