package appliance

import (
	"context"

	boothttp "github.com/corralhq/corral/boot/http"
)

// commissionOverlay tells the lifecycle where boot/http serves the
// commissioning overlay (lifecycle.CommissionOverlay), on the address the
// agent reached the appliance at, else the boot interface's.
type commissionOverlay struct {
	http *boothttp.Server
	ip   string
}

// CommissionOverlay implements lifecycle.CommissionOverlay.
func (c commissionOverlay) CommissionOverlay(_ context.Context, host, mac string) (string, string, int64, error) {
	if host == "" {
		host = c.ip
	}
	url, a, err := c.http.CommissionOverlay(host, mac)
	if err != nil {
		return "", "", 0, err
	}
	return url, a.SHA256, a.Size, nil
}
