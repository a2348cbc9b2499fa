package main

import (
	"github.com/corralhq/corral/appliance"
	"github.com/corralhq/corral/images/osimage"
	"github.com/spf13/pflag"
)

// addOSImageFlags registers the bound on operating-system images
// (appliance.New refuses a value outside 1..osimage.DefaultMaxBytes).
func addOSImageFlags(f *pflag.FlagSet, c *appliance.OSImagesConfig) {
	f.Int64Var(&c.MaxBytes, "os-image-max-bytes", osimage.DefaultMaxBytes, "largest operating-system image registered or uploaded, in bytes; larger ones are refused (FAILED or ResourceExhausted) and nothing is kept; at most the default, what a fleet peer fetch accepts (env CORRAL_OS_IMAGE_MAX_BYTES)")
}
