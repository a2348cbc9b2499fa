// Package auth decides who is calling corrald and whether they may call the
// method they asked for. It owns three things:
//
//   - bearer tokens (Tokens): created as crl_<id>_<secret>, stored under
//     /auth/tokens/<id> as a corral.auth.v1.Token holding only the SHA-256
//     of the whole token, its role and its timestamps;
//   - per-boot agent tokens (IssueBoot, boottokens.go): bound to a boot
//     MAC and machine, one live per MAC, derived by HMAC from a boot key
//     kept in the store (BootKeyKey: every appliance on one store derives
//     the same tokens), so that re-rendering a script returns the live
//     token without a write;
//   - the authorization rule (Allowed) that matches a Principal's role
//     against a method's corral.auth.v1.access option;
//   - the gRPC server interceptor (Interceptor) that authenticates every
//     call (bearer token, or a verified node client certificate, checked
//     for expiry and revocation on every call) and applies the rule,
//     looking the option up in the protobuf registry;
//   - TokenService (tokenservice.go), the admin API over Tokens, with
//     bound and single-use tokens (tokens_node.go);
//   - the node certificate records and revocation list (Revocations:
//     /pki/issued/<name>, /pki/revoked/<serial>) that the interceptor and
//     the appliance's dialer check.
//
// The certificate authority lives in the
// sub-package auth/pki; the client configuration (admin.conf) is the API
// module's api/clientconfig.
//
// This package may import the store contract, store/record, the generated
// API and the leaf internal/nodeid; it must not import a store backend
// (bbolt), boot/ or ipmi/.
package auth
