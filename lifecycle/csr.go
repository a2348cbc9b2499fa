package lifecycle

import (
	"context"

	nodev1 "github.com/corralhq/corral/api/node/v1"
)

// onCSR answers a discovery agent's CertificateRequest on its session.
// (#11: the install flow that signs it lands with the CSR work.)
func (l *Lifecycle) onCSR(ctx context.Context, machine string, req *nodev1.CertificateRequest) {
	l.sess.send(machine, &nodev1.ApplianceMessage{Cmd: &nodev1.ApplianceMessage_Certificate{Certificate: &nodev1.NodeCertificate{
		InstallId: req.GetInstallId(), Error: "this appliance does not sign certificate requests yet",
	}}})
}
