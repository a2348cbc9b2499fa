// Package safename owns the rule for the names the node agent turns into
// file and directory names (volumes, VMs, networks): a name that passes
// Check cannot escape its directory or hide a file. It imports nothing of
// Corral's but the error vocabulary (internal/apierr, a leaf), so the node
// agent may use it.
package safename

import (
	"regexp"
	"strings"

	"github.com/corralhq/corral/internal/apierr"
)

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// Check refuses names that could escape a directory or hide a file: a name
// is 1-128 characters of letters, digits, '_', '.', '-', starting with a
// letter or digit and never containing "..". The error is of class
// apierr.ErrInvalid and names kind ("volume", "vm", "network").
func Check(kind, name string) error {
	if !nameRE.MatchString(name) || strings.Contains(name, "..") {
		return apierr.Invalidf("%s name %q: want 1-128 of [A-Za-z0-9_.-] starting with a letter or digit", kind, name)
	}
	return nil
}
