// Package clientconfig owns the client configuration file: the YAML
// document that corrald writes as <data-dir>/admin.conf and that the corral
// CLI (and later the node agent) reads to reach corrald. It holds the
// endpoint, the PEM CA certificate to trust and the bearer token, and it
// turns them into gRPC dial options: TLS trusting only that CA, accepting
// only a server certificate that carries the appliance identity
// (VerifyAppliance: node certificates chain to the same CA but never
// carry it), plus per-RPC "authorization: Bearer <token>" metadata. A
// file may also hold named contexts (File): the top-level keys stay the
// context "default", so every earlier file loads unchanged.
//
// It belongs to the API module, which users import without the
// appliance: beyond the standard library it depends only on gRPC,
// renameio and sigs.k8s.io/yaml.
package clientconfig
