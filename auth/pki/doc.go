// Package pki owns Corral's private certificate authority and the
// certificates it issues: the on-disk CA pair (ca.crt, ca.key), the corrald
// server certificate (server.crt, server.key), client certificates for
// future node identities, and helpers to fingerprint certificates and list
// the local host names and addresses a server certificate should cover.
//
// All keys are ECDSA P-256 and all cryptography comes from the standard
// library. The CA is never regenerated silently: if its files are
// half-present, unparsable or do not match, EnsureCA returns an error and
// the operator must repair or remove them. The server certificate, by
// contrast, is disposable and is reissued whenever it no longer fits.
//
// This package is shared with the node agent, so it must import only the
// standard library: never Corral's store/, boot/ or ipmi/ packages, bbolt,
// or any other dependency that would drag daemon state into the agent.
package pki
