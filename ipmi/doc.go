// Package ipmi owns BMC control: power state and power actions, the next
// boot device, and BMC info, over IPMI (a native RMCP+ provider built on
// github.com/bougou/go-ipmi, registered first, then bmclib's ipmitool
// provider when the binary exists) and Redfish (bmclib's gofish provider),
// with github.com/bmc-toolbox/bmclib/v2 as the provider framework.
//
// A Controller tries providers in order, each under its own share of the
// call's deadline, records which provider answered and what the others
// said (Answer), and makes semantics uniform across providers: "on" when
// already on succeeds, "cycle" or "reset" when off powers on, and power
// state strings are normalised to the PowerState enum.
//
// Redfish certificates are pinned (TLSMode, Target.TLSSHA256): every
// handshake's leaf certificate is checked against the pin before a request
// is sent, and a mismatch is a *CertificateError (ErrCertificate); a
// Redfish target with nothing pinned is not tried. Answer.TLSSHA256 says
// what was presented, which enrolment pins (TLSFirstUse).
//
// Sealed credentials live in ipmi/seal and the power poller in ipmi/poller.
// This package imports bmclib and go-ipmi, never store/ or inventory/ (cmd
// wires them), and must not be imported from anything reachable by
// cmd/corral-node.
package ipmi
