package pool

import (
	"regexp"
	"strings"
)

// Annotation keys understood by the pool. The n0stack names are kept so that
// n0stack `do` files keep working.
const (
	// AnnotationDisableDeletionLock on a reservation means it does not block
	// deleting its Node or Network.
	AnnotationNodeDisableDeletionLock    = "n0core/pool/node/disable_deletion_lock"
	AnnotationNetworkDisableDeletionLock = "n0core/pool/network/disable_deletion_lock"
	// AnnotationVLANID is n0stack's way of asking for a VLAN on a Network.
	AnnotationVLANID = "n0core/provisioning/virtual_machine/vlan_id"
)

var nameRE = regexp.MustCompile(`^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,126}[A-Za-z0-9])?$`)

// CheckName validates a resource or reservation name: 1-128 characters of
// letters, digits, '.', '_' and '-', starting and ending alphanumeric. Names
// become store keys, Linux device name inputs and QEMU ids, so no slashes or
// spaces. what names the field in the error, which wraps ErrInvalid. The
// appliance's VM, volume and image services validate their names with it
// too.
func CheckName(what, name string) error {
	if name == "" {
		return invalidf("%s is required", what)
	}
	if !nameRE.MatchString(name) {
		return invalidf("%s %q is malformed: use 1-128 letters, digits, '.', '_' or '-', starting and ending with a letter or digit", what, name)
	}
	return nil
}

// checkMeta validates annotation and label maps.
func checkMeta(what string, m map[string]string) error {
	for k, v := range m {
		if k == "" || len(k) > 253 || strings.ContainsAny(k, " \t\n") {
			return invalidf("%s key %q is malformed", what, k)
		}
		if len(v) > 4096 {
			return invalidf("%s %q value is longer than 4096 bytes", what, k)
		}
	}
	return nil
}
