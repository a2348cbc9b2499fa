// Package pki owns Corral's private certificate authority and the
// certificates it issues: the on-disk CA pair (ca.crt, ca.key), the corrald
// server certificate (server.crt, server.key), node certificates signed
// from a node's own request (SignNodeCSR), short client certificates (the
// appliance dialling its nodes), and helpers to fingerprint certificates
// and list the local host names and addresses a server certificate should
// cover.
//
// Who may pass as whom is decided here, by what the CA writes:
//   - the appliance's server certificate alone carries a URI SAN,
//     clientconfig.ApplianceURI, which every client of corrald requires
//     (clientconfig.VerifyAppliance); an older server.crt without it is
//     reissued;
//   - a node certificate's subject (CN = node name, O = corral:node), SANs
//     (one DNS SAN, the node name, which is never an IP address), usages
//     and validity (NodeValidity, 90 days) are the CA's; from a request it
//     takes only the public key, after checking its signature.
//
// All keys the CA makes are ECDSA P-256, except the boot CA's
// (boottls.go: RSA-2048, for UEFI HTTPS boot firmware that has no
// elliptic curves), and all cryptography comes from the standard library. The CA is never regenerated silently: if its files
// are half-present, unparsable or do not match, EnsureCA returns an error
// and the operator must repair or remove them. The server certificate, by
// contrast, is disposable and is reissued whenever it no longer fits.
//
// This package imports only the standard library and the leaf
// internal/nodeid: never Corral's store/, boot/ or ipmi/ packages, bbolt,
// or any other dependency that would drag daemon state along.
package pki
