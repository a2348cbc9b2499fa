package coldplug

import (
	"github.com/u-root/u-root/pkg/kmodule"
)

// KernelLoader loads modules into the running kernel with u-root's
// kmodule (modules.dep under RootDir/lib/modules/$(uname -r)).
type KernelLoader struct {
	Opts kmodule.ProbeOpts
}

// Load probes name and its dependencies. The prober is rebuilt per call
// so /proc/modules is re-read and loaded dependencies are skipped.
func (k KernelLoader) Load(name string) error {
	p, err := kmodule.NewProber(k.Opts)
	if err != nil {
		return err
	}
	return p.Probe(name, "")
}
