package appliance

import (
	"cmp"
	"context"
	"net"

	"github.com/corralhq/corral/boot/dhcp"
	"github.com/corralhq/corral/images/osimage"
	"github.com/corralhq/corral/lifecycle"
)

// initDeploy hands the lifecycle what OS deploys need of the boot side
// (docs/architecture.md, "Deploying an operating system"): the boot HTTP
// server's base URL on the address a machine's agent reached the
// appliance at (the boot interface's address when unknown: the image and
// the phone-home are fetched from there), the OS images' raw views, and,
// with the DHCP server in full mode (pins), the pinning of a machine's
// address. initBoot calls it once the boot servers exist.
func (s *Server) initDeploy(serverIP, httpPort string, ds *dhcp.Server, pins bool) {
	d := lifecycle.DeployServices{BootBase: func(host string) string {
		return "http://" + net.JoinHostPort(cmp.Or(host, serverIP), httpPort)
	}}
	if s.osImages != nil {
		d.Images = rawImages{s.osImages}
	}
	if ds != nil && pins {
		d.Addresses = ds
	}
	s.lifecycle.SetDeploy(d)
}

// rawImages is osimage's raw view as the lifecycle takes it.
type rawImages struct{ svc *osimage.Service }

func (r rawImages) Raw(ctx context.Context, name string) (lifecycle.RawImage, error) {
	im, err := r.svc.Raw(ctx, name)
	if err != nil {
		return lifecycle.RawImage{}, err
	}
	return lifecycle.RawImage{Name: im.Name, SHA256: im.SHA256, Size: im.Size, Map: im.Map, MapSHA256: im.MapSHA256, Path: im.Path}, nil
}
