package server

import (
	"context"
	"errors"
	"sync"

	nodev1 "github.com/corralhq/corral/api/node/v1"
	boothttp "github.com/corralhq/corral/boot/http"
)

// kexecBoot renders the hypervisor boot the lifecycle sends a discovery
// agent to kexec after its install (lifecycle.HypervisorBoot) through
// boot/http's rendering of the hypervisor script. initLifecycle makes it
// before the boot servers exist; initBoot hands it the boot HTTP server
// and the boot interface's address (used when the address the agent
// reached the appliance at is unknown). Without network boot it refuses,
// and the lifecycle reboots machines the old way.
type kexecBoot struct {
	mu   sync.Mutex
	http *boothttp.Server
	ip   string
}

func (k *kexecBoot) set(hs *boothttp.Server, ip string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.http, k.ip = hs, ip
}

// KexecPlan implements lifecycle.HypervisorBoot.
func (k *kexecBoot) KexecPlan(ctx context.Context, machine, mac, host string) (*nodev1.KexecPlan, error) {
	k.mu.Lock()
	hs, ip := k.http, k.ip
	k.mu.Unlock()
	if hs == nil {
		return nil, errors.New("network boot is off on this appliance")
	}
	if host == "" {
		host = ip
	}
	hb, err := hs.HypervisorBoot(ctx, machine, mac, host)
	if err != nil {
		return nil, err
	}
	return &nodev1.KexecPlan{
		KernelUrl: hb.KernelURL, KernelSha256: hb.Kernel.SHA256, KernelSize: hb.Kernel.Size,
		InitrdUrl: hb.InitrdURL, InitrdSha256: hb.Initrd.SHA256, InitrdSize: hb.Initrd.Size,
		Cmdline: hb.Cmdline,
	}, nil
}
