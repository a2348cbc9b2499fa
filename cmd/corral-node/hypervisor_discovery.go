//go:build corral_discovery

package main

import (
	"context"
	"errors"
	"io"
)

// runHypervisor is left out of the discovery image (built with the
// corral_discovery tag by images/discovery): the hypervisor runs from its
// own image, and its QEMU/volume code would cost ~0.5 MB of the discovery
// initramfs's 10 MB budget.
func runHypervisor(context.Context, []string, io.Writer, io.Writer) error {
	return errors.New("this corral-node is the discovery image's build: hypervisor mode is not included")
}
