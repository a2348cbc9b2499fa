// Package osimagev1 is the generated corral.osimage.v1 API: operating-system
// images (raw or qcow2) registered from a URL or uploaded, stored by content
// and served by the boot HTTP server, and OSImageService. Generated code
// lives beside this file (buf generate); it imports only protobuf and gRPC.
package osimagev1
