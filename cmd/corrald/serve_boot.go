package main

import (
	"errors"

	"github.com/corralhq/corral/appliance"
	"github.com/corralhq/corral/boot/dhcp"
	"github.com/corralhq/corral/inventory"
	"github.com/spf13/cobra"
)

// addBootFlags registers the network-boot flags of `corrald serve`. Each
// also reads CORRAL_<NAME> and the --config file (flagconf).
func addBootFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.String("boot-interface", "", "network boot interface: DHCP and RA bind to it; empty turns network boot off (env CORRAL_BOOT_INTERFACE)")
	f.String("dhcp-mode", "proxy", "DHCP mode: full (hand out addresses), proxy (boot options beside another DHCP server) or off (env CORRAL_DHCP_MODE)")
	f.String("dhcp-range", "", "full mode: local pool START-END[/BITS], e.g. 10.0.0.100-10.0.0.199 (env CORRAL_DHCP_RANGE)")
	f.StringSlice("dhcp-router", nil, "full mode: router (option 3) for the local pool, repeatable (env CORRAL_DHCP_ROUTER)")
	f.StringSlice("dhcp-dns", nil, "full mode: DNS server (option 6), repeatable (env CORRAL_DHCP_DNS)")
	f.Duration("dhcp-lease-time", 0, "full mode: lease time (default 1h) (env CORRAL_DHCP_LEASE_TIME)")
	f.StringArray("dhcp-relay-range", nil, "full mode: pool for a relayed segment SUBNET=START-END[@ROUTER], repeatable (env CORRAL_DHCP_RELAY_RANGE, comma-separated)")
	f.String("http-listen", ":8080", "boot HTTP listen address: iPXE scripts and images (env CORRAL_HTTP_LISTEN)")
	f.String("tftp-listen", ":69", `TFTP listen address for the iPXE binaries, or "off" (env CORRAL_TFTP_LISTEN)`)
	f.Bool("no-ra", false, "do not answer IPv6 router solicitations on the boot interface (env CORRAL_NO_RA)")
	f.String("boot-kernel", "", "discover profile kernel to copy into the catalog (default: the image `corrald images build` registered, else a test stand-in) (env CORRAL_BOOT_KERNEL)")
	f.String("boot-initrd", "", "discover profile initramfs to copy into the catalog (default: the image `corrald images build` registered, else a test stand-in) (env CORRAL_BOOT_INITRD)")
	f.String("boot-hypervisor-initrd", "", "hypervisor profile initramfs to copy into the catalog (default: the image `corrald images build` registered, else none: hypervisor machines boot their local disk) (env CORRAL_BOOT_HYPERVISOR_INITRD)")
	f.String("boot-kernel-args", "", "extra kernel arguments (default console=tty0 console=ttyS0,115200n8) (env CORRAL_BOOT_KERNEL_ARGS)")
	f.Duration("boot-token-ttl", 0, "lifetime of the per-boot agent token on the kernel command line (default 1h) (env CORRAL_BOOT_TOKEN_TTL)")
	f.Int("max-discovered", inventory.DefaultMaxDiscovered, "most machines network-boot discovery may create for unknown MACs and leave unregistered; past it unknown MACs get an address but no record and no boot file; negative: no cap (env CORRAL_MAX_DISCOVERED)")
	f.Duration("discovered-gc-after", inventory.DefaultDiscoveredGCAfter, "delete a discovered machine that never registered, has no BMC, labels or other state, and has not booted for this long; negative: never (env CORRAL_DISCOVERED_GC_AFTER)")
	f.Duration("dhcp-decline-quarantine", dhcp.DefaultDeclineQuarantine, "full mode: how long an address a client DECLINEd is kept out of offers (still offered when nothing else is left) (env CORRAL_DHCP_DECLINE_QUARANTINE)")
}

// bootConfig reads the network-boot flags.
func bootConfig(cmd *cobra.Command) (appliance.BootConfig, error) {
	f := cmd.Flags()
	var c appliance.BootConfig
	c.Interface, _ = f.GetString("boot-interface")
	c.DHCPMode, _ = f.GetString("dhcp-mode")
	c.DHCPRange, _ = f.GetString("dhcp-range")
	c.DHCPRouter, _ = f.GetStringSlice("dhcp-router")
	c.DHCPDNS, _ = f.GetStringSlice("dhcp-dns")
	c.DHCPLeaseTime, _ = f.GetDuration("dhcp-lease-time")
	c.DHCPRelayRanges, _ = f.GetStringArray("dhcp-relay-range")
	c.HTTPListen, _ = f.GetString("http-listen")
	c.TFTPListen, _ = f.GetString("tftp-listen")
	c.NoRA, _ = f.GetBool("no-ra")
	c.Kernel, _ = f.GetString("boot-kernel")
	c.Initrd, _ = f.GetString("boot-initrd")
	c.HypervisorInitrd, _ = f.GetString("boot-hypervisor-initrd")
	c.KernelArgs, _ = f.GetString("boot-kernel-args")
	c.TokenTTL, _ = f.GetDuration("boot-token-ttl")
	c.MaxDiscovered, _ = f.GetInt("max-discovered")
	c.DiscoveredGCAfter, _ = f.GetDuration("discovered-gc-after")
	c.DHCPDeclineQuarantine, _ = f.GetDuration("dhcp-decline-quarantine")
	if c.MaxDiscovered == 0 {
		return c, errors.New("--max-discovered 0: give a positive cap, or a negative value for no cap")
	}
	if c.DiscoveredGCAfter == 0 {
		return c, errors.New("--discovered-gc-after 0: give a positive age, or a negative value to keep discovered machines")
	}
	if c.DHCPDeclineQuarantine <= 0 {
		return c, errors.New("--dhcp-decline-quarantine must be positive")
	}
	return c, nil
}

// GOMAXPROCS is left to the Go runtime: as many Ps as CPUs in corrald's
// affinity mask (and cgroup quota), so corrald pinned to one core runs one
// P, and an explicit GOMAXPROCS in the environment wins as usual. Until
// the third session of issue #14 network boot raised it to at least 4:
// with one P the DHCP path collapsed (DORA p99 0.2-2 s at 3,990/s),
// because the goroutine that came back from the journal's fdatasync found
// its P handed away and waited in the global run queue while holding the
// commit pipeline. The store now keeps the P through that flush and
// batches the writers queued behind it (store/bolt sync.go, commit.go);
// measured on one pinned core, 4 Ps then cost more CPU per lease than 1
// at 4,000 offered/s and above (the scheduler's spinning threads and
// hand-offs on one core; level at 2,000/s) and gave a longer DORA tail
// (bench/README.md, "third session"). On a core shared with other busy
// processes one P gets a smaller share of it than four: give corrald its
// own core, or set GOMAXPROCS.
