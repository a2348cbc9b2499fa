package appliance

import (
	"context"

	nodev1 "github.com/corralhq/corral/api/node/v1"
	boothttp "github.com/corralhq/corral/boot/http"
)

// kexecBoot renders the hypervisor boot the lifecycle sends a discovery
// agent to kexec after its install (lifecycle.HypervisorBoot) through
// boot/http's rendering of the hypervisor script. initBoot hands it to the
// lifecycle (SetKexec) once the boot HTTP server exists, with the boot
// interface's address (used when the address the agent reached the
// appliance at is unknown). Without network boot the lifecycle has none
// and reboots machines the old way.
type kexecBoot struct {
	http *boothttp.Server
	ip   string
}

// KexecPlan implements lifecycle.HypervisorBoot.
func (k kexecBoot) KexecPlan(ctx context.Context, machine, mac, host, arch string) (*nodev1.KexecPlan, error) {
	if host == "" {
		host = k.ip
	}
	hb, err := k.http.HypervisorBoot(ctx, machine, mac, host, arch)
	if err != nil {
		return nil, err
	}
	return &nodev1.KexecPlan{
		KernelUrl: hb.KernelURL, KernelSha256: hb.Kernel.SHA256, KernelSize: hb.Kernel.Size,
		InitrdUrl: hb.InitrdURL, InitrdSha256: hb.Initrd.SHA256, InitrdSize: hb.Initrd.Size,
		Cmdline: hb.Cmdline,
	}, nil
}
