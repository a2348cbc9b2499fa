package http

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"

	"github.com/corralhq/corral/agent/cmdline"
	"github.com/corralhq/corral/images"
)

// HypervisorBoot is a machine's hypervisor boot as its iPXE script gives
// it, for the discovery agent to boot with kexec after an install (since 2026-11-24):
// the kernel and initrd (catalog artifacts with their size and SHA-256,
// and the URLs the script fetches them from) and the kernel command line.
type HypervisorBoot struct {
	Kernel, Initrd       images.Artifact
	KernelURL, InitrdURL string
	Cmdline              string
}

// HypervisorBoot renders the hypervisor boot of machine (boot MAC mac) as
// the hypervisor script would for a client that reached this server at
// host (an address or name, no port: where the machine's agent reached
// the appliance): the same files, URLs and kernel command line (endpoints,
// the CA fingerprint, the MAC, corral.mode=hypervisor and no token: the
// hypervisor boot authenticates with its node certificate). It fails when
// the catalog has no hypervisor image. arch "arm64" renders the arm64
// hypervisor image (ARM64Kernel, ARM64HypervisorInitrd, the arm64 command
// line GRUB's config would give); anything else amd64's. It records nothing on the timeline
// (the lifecycle does) and spends no script budget.
func (s *Server) HypervisorBoot(ctx context.Context, machine, mac, host, arch string) (HypervisorBoot, error) {
	mac, err := normalizeMAC(mac)
	if err != nil {
		return HypervisorBoot{}, err
	}
	if host == "" {
		return HypervisorBoot{}, errors.New("boot/http: hypervisor boot: no host to fetch the image from")
	}
	_, port, err := net.SplitHostPort(s.lis.Addr().String())
	if err != nil {
		return HypervisorBoot{}, fmt.Errorf("boot/http: listener address: %w", err)
	}
	base := "http://" + net.JoinHostPort(host, port)
	d := ScriptData{Intent: "hypervisor", Machine: machine, MAC: mac, Base: base, Kernel: images.DiscoverKernel, Initrd: images.HypervisorInitrd}
	if arch == "arm64" {
		d.Arch, d.Kernel, d.Initrd = "arm64", images.ARM64Kernel, images.ARM64HypervisorInitrd
	}
	var hb HypervisorBoot
	var ok bool
	if hb.Kernel, ok = s.cfg.Catalog.Lookup(d.Kernel); !ok {
		return HypervisorBoot{}, errors.New("the catalog has no hypervisor kernel")
	}
	if hb.Initrd, ok = s.cfg.Catalog.Lookup(d.Initrd); !ok {
		return HypervisorBoot{}, errors.New("the catalog has no hypervisor image (run corrald images build)")
	}
	// The script's own rendering, for a request to this base.
	r, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/boot.ipxe", nil)
	if err != nil {
		return HypervisorBoot{}, fmt.Errorf("boot/http: hypervisor boot: %w", err)
	}
	if hb.Cmdline, _, _, err = s.cmdline(r, d, NoToken, cmdline.ModeHypervisor); err != nil {
		return HypervisorBoot{}, fmt.Errorf("kernel command line: %w", err)
	}
	q := "?mac=" + mac // as the script writes it
	hb.KernelURL = base + "/images/" + d.Kernel + q
	hb.InitrdURL = base + "/images/" + d.Initrd + q
	return hb, nil
}

// CommissionOverlay is the commissioning overlay as a discovery agent
// fetches it when a commissioning plan reaches it booted without it: its
// URL on host (where the agent reached the appliance) and its size and
// SHA-256 from the catalog. It fails when the catalog has none.
func (s *Server) CommissionOverlay(host, mac string) (url string, a images.Artifact, err error) {
	if host == "" {
		return "", images.Artifact{}, errors.New("boot/http: commissioning overlay: no host to fetch it from")
	}
	_, port, err := net.SplitHostPort(s.lis.Addr().String())
	if err != nil {
		return "", images.Artifact{}, fmt.Errorf("boot/http: listener address: %w", err)
	}
	a, ok := s.cfg.Catalog.Lookup(images.CommissionOverlay)
	if !ok {
		return "", images.Artifact{}, errors.New("the catalog has no commissioning overlay (run corrald images build with smartmontools, memtester, stress-ng, fio and ethtool installed)")
	}
	url = "http://" + net.JoinHostPort(host, port) + "/images/" + images.CommissionOverlay
	if mac, err := normalizeMAC(mac); err == nil {
		url += "?mac=" + mac
	}
	return url, a, nil
}
