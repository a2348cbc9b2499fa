// Package osimage owns operating-system images: whole-disk images, raw or
// qcow2, that Corral writes to a machine's disk. An image is registered
// from an http(s) URL with its SHA-256 and declared format (the appliance
// downloads it in the background) or uploaded through the API; either way
// its bytes go to a temporary file, hashed as they arrive, and are renamed
// into the catalog's content store (images.ContentDir/<sha256>) only when
// their size, hash and declared format check out, so nothing half-written
// is ever kept. The format is never guessed: a declared qcow2 must carry a
// qcow2 header a machine can boot on its own (no backing file, no
// encryption). Records live in the store under store.OSImagesPrefix; the
// boot HTTP server serves READY images at /os-images/<sha256> (Open), and
// in a fleet each appliance fetches the READY images it lacks from a peer
// the way boot artifacts travel (ApplianceService.FetchArtifact).
//
// They are a kind of their own, not n0stack's Image (corral.deployment.v1):
// that names protected block storages on hypervisor nodes that VM volumes
// are cloned from, while an OS image is a file the appliance holds and
// serves to bare metal.
//
// It imports the images package (the content store's layout), the API,
// the store and the error vocabulary; never the appliance that wires it.
package osimage
