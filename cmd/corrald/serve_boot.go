package main

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/corralhq/corral/appliance"
	"github.com/corralhq/corral/boot/dhcp"
	"github.com/corralhq/corral/images"
	"github.com/corralhq/corral/inventory"
	"github.com/corralhq/corral/ipmi"
)

// addBootFlags registers the network-boot and DHCP flags of `corrald
// serve`. Each also reads CORRAL_<NAME> and the --config file (flagconf).
func addBootFlags(groups *flagGroups, sf *serveFlags) {
	c := &sf.cfg.Boot
	f, d := groups.set(groupBoot), groups.set(groupDHCP)
	f.StringVar(&c.Interface, "boot-interface", "", "network boot interface: DHCP and RA bind to it; empty turns network boot off (env CORRAL_BOOT_INTERFACE)")
	d.StringVar(&c.DHCPMode, "dhcp-mode", string(dhcp.ModeProxy), "DHCP mode: full (hand out addresses), proxy (boot options beside another DHCP server) or off (env CORRAL_DHCP_MODE)")
	d.StringVar(&c.DHCPRange, "dhcp-range", "", "full mode: local pool START-END[/BITS], e.g. 10.0.0.100-10.0.0.199 (env CORRAL_DHCP_RANGE)")
	d.StringSliceVar(&c.DHCPRouter, "dhcp-router", nil, "full mode: router (option 3) for the local pool, repeatable (env CORRAL_DHCP_ROUTER)")
	d.StringSliceVar(&c.DHCPDNS, "dhcp-dns", nil, "full mode: DNS server (option 6), repeatable (env CORRAL_DHCP_DNS)")
	d.DurationVar(&c.DHCPLeaseTime, "dhcp-lease-time", 0, "full mode: lease time (default 1h) (env CORRAL_DHCP_LEASE_TIME)")
	d.StringArrayVar(&c.DHCPRelayRanges, "dhcp-relay-range", nil, "full mode: pool for a relayed segment SUBNET=START-END[@ROUTER], repeatable (env CORRAL_DHCP_RELAY_RANGE, comma-separated)")
	d.StringVar(&c.DHCP6Range, "dhcp6-range", "", "DHCPv6: local IPv6 pool START-END[/BITS] (stateful, with PXEv6/HTTPv6 boot URLs); without an IPv4 address on the boot interface the appliance is IPv6-only (env CORRAL_DHCP6_RANGE)")
	d.StringArrayVar(&c.DHCP6RelayRanges, "dhcp6-relay-range", nil, "DHCPv6: pool for a relayed IPv6 link PREFIX=START-END, repeatable (env CORRAL_DHCP6_RELAY_RANGE, comma-separated)")
	d.StringSliceVar(&c.DHCP6RelayFrom, "dhcp6-relay-from", nil, "DHCPv6: prefix or address the relays' Relay-Forward messages may come from, repeatable; others are dropped and counted (default: from anywhere) (env CORRAL_DHCP6_RELAY_FROM)")
	d.StringSliceVar(&c.DHCP6DNS, "dhcp6-dns", nil, "DHCPv6: DNS server (option 23), repeatable (env CORRAL_DHCP6_DNS)")
	d.DurationVar(&c.DHCP6LeaseTime, "dhcp6-lease-time", 0, "DHCPv6: valid lifetime of a lease (default 1h) (env CORRAL_DHCP6_LEASE_TIME)")
	f.DurationVar(&c.RARouterLifetime, "ra-router-lifetime", 0, "router lifetime of the IPv6 router advertisements (0: not a default router; at most 2h30m) (env CORRAL_RA_ROUTER_LIFETIME)")
	f.StringVar(&c.HTTPListen, "http-listen", ":8080", "boot HTTP listen address: iPXE scripts and images (env CORRAL_HTTP_LISTEN)")
	f.StringVar(&c.TFTPListen, "tftp-listen", ":69", `TFTP listen address for the iPXE binaries, or "off" (env CORRAL_TFTP_LISTEN)`)
	f.StringVar(&c.HTTPBootBase, "http-boot-base", "", "base URL (http:// or https://host[:port]) that UEFI HTTP boot firmware fetches the iPXE binary from, as /images/<name>; default this appliance's boot HTTP. For HTTPS boot behind a TLS front the firmware trusts (boot/README.md, \"UEFI HTTP boot\") (env CORRAL_HTTP_BOOT_BASE)")
	f.StringVar(&c.HTTPSBootListen, "https-boot-listen", "", "serve the boot profile's files over HTTPS on this address (e.g. :8443) with the boot CA's RSA certificate, and give UEFI HTTP boot firmware https:// URLs on it (unless --http-boot-base says otherwise); the firmware must trust the boot CA (\"corrald boot-ca\"); off by default (env CORRAL_HTTPS_BOOT_LISTEN)")
	f.BoolVar(&c.SecureBoot, "secure-boot", false, "serve x64 UEFI PXE firmware the Secure Boot chain (Debian's signed shim, network GRUB and kernel, all over TFTP) instead of iPXE; it boots with Secure Boot on or off; UEFI HTTP boot clients of x64 then get no boot file (docs/architecture.md, \"Secure Boot\") (env CORRAL_SECURE_BOOT)")
	f.BoolVar(&c.NoRA, "no-ra", false, "do not answer IPv6 router solicitations on the boot interface (env CORRAL_NO_RA)")
	// A word in backquotes in a usage string is taken as the flag's
	// value name by pflag: name commands in plain quotes.
	f.StringVar(&c.Kernel, "boot-kernel", "", `discover profile kernel to copy into the catalog (default: the image "corrald images build" registered) (env CORRAL_BOOT_KERNEL)`)
	f.StringVar(&c.Initrd, "boot-initrd", "", `discover profile initramfs to copy into the catalog (default: the image "corrald images build" registered) (env CORRAL_BOOT_INITRD)`)
	f.StringVar(&c.HypervisorInitrd, "boot-hypervisor-initrd", "", `hypervisor profile initramfs to copy into the catalog (default: the image "corrald images build" registered, else none: hypervisor machines boot their local disk) (env CORRAL_BOOT_HYPERVISOR_INITRD)`)
	f.BoolVar(&sf.allowTestImages, "allow-test-images", false, "with network boot on and no discovery image built or given, serve the built-in test stand-ins (iPXE's ipxe.lkrn as the kernel, a tiny initramfs) instead of refusing to start; for tests and labs only: real machines boot them and are never discovered (env CORRAL_ALLOW_TEST_IMAGES)")
	f.StringVar(&c.KernelArgs, "boot-kernel-args", "", "extra kernel arguments (default console=tty0 console=ttyS0,115200n8; arm64 machines get these, or none when unset, then console=ttyAMA0,115200) (env CORRAL_BOOT_KERNEL_ARGS)")
	f.DurationVar(&c.TokenTTL, "boot-token-ttl", 0, "lifetime of the per-boot agent token on the kernel command line (default 1h) (env CORRAL_BOOT_TOKEN_TTL)")
	f.IntVar(&c.MaxDiscovered, "max-discovered", inventory.DefaultMaxDiscovered, "most machines network-boot discovery may create for unknown MACs and leave unregistered; past it unknown MACs get an address but no record and no boot file; negative: no cap (env CORRAL_MAX_DISCOVERED)")
	f.IntVar(&c.MaxUnaccepted, "max-unaccepted", 0, "most machines that may be registered and not accepted (INVENTORIED, or parked in CONFLICT); past it a report that would make a new machine is refused; 0: the value of --max-discovered; negative: no cap (env CORRAL_MAX_UNACCEPTED)")
	f.DurationVar(&c.DiscoveredGCAfter, "discovered-gc-after", inventory.DefaultDiscoveredGCAfter, "delete a discovered machine that never registered, has no BMC, labels or other state, and has not booted for this long; negative: never (env CORRAL_DISCOVERED_GC_AFTER)")
	d.Uint16Var(&c.DHCPBalanceMaxSecs, "dhcp-balance-max-secs", 3, "full mode in a fleet (--store etcd): the appliances serving a segment split its DISCOVERs by MAC, one answering each, and every appliance answers a client that says it has waited this many seconds or more (the DISCOVER's secs field), so a dead peer costs its share of machines that wait, not their boot; 0: every appliance answers every DISCOVER (env CORRAL_DHCP_BALANCE_MAX_SECS)")
	d.DurationVar(&c.DHCPDeclineQuarantine, "dhcp-decline-quarantine", dhcp.DefaultDeclineQuarantine, "full mode: how long an address a client DECLINEd is kept out of offers (still offered when nothing else is left) (env CORRAL_DHCP_DECLINE_QUARANTINE)")
}

// checkBootConfig checks the network-boot settings.
func checkBootConfig(c appliance.BootConfig) error {
	if c.MaxDiscovered == 0 {
		return errors.New("--max-discovered 0: give a positive cap, or a negative value for no cap")
	}
	if c.DiscoveredGCAfter == 0 {
		return errors.New("--discovered-gc-after 0: give a positive age, or a negative value to keep discovered machines")
	}
	if c.DHCPDeclineQuarantine <= 0 {
		return errors.New("--dhcp-decline-quarantine must be positive")
	}
	return nil
}

// checkEnums refuses a value outside its setting's fixed set, whether or
// not the part that uses it is on (dhcp-mode with network boot off):
// a mistyped setting is found when written, not when it is first needed.
func (sf *serveFlags) checkEnums() error {
	c := &sf.cfg
	if err := checkEnum("dhcp-mode", c.Boot.DHCPMode, []string{string(dhcp.ModeFull), string(dhcp.ModeProxy), string(dhcp.ModeOff)}); err != nil {
		return err
	}
	if err := checkEnum("store", c.Store.Kind, []string{appliance.StoreBolt, appliance.StoreEtcd}); err != nil {
		return err
	}
	for _, p := range c.BMC.Providers {
		if err := checkEnum("bmc-providers", p, ipmi.DefaultProviders); err != nil {
			return err
		}
	}
	return nil
}

// checkTestImages refuses network boot with the catalog's test stand-ins
// (iPXE's ipxe.lkrn as the kernel, a tiny generated initramfs) unless
// --allow-test-images: real machines would boot them and never be
// discovered. It reads the data directory's image manifest and writes
// nothing. An appliance of a fleet (store etcd) may boot the images a
// peer built, so it is not checked here.
func (sf *serveFlags) checkTestImages(c appliance.Config) error {
	if c.Boot.Interface == "" || sf.allowTestImages || c.Store.Kind == appliance.StoreEtcd {
		return nil
	}
	ic := images.Config{Dir: filepath.Join(c.DataDir, appliance.ImagesDir), Kernel: c.Boot.Kernel, Initrd: c.Boot.Initrd}.WithBuiltDiscover()
	if !ic.UsesTestImages() {
		return nil
	}
	return fmt.Errorf("network boot is on (--boot-interface %s) but %s has no discovery image: machines would boot the test stand-ins and never be discovered; "+
		"run \"corrald images build --data-dir %s\" (or give --boot-kernel and --boot-initrd), or pass --allow-test-images in a test or lab",
		c.Boot.Interface, ic.Dir, c.DataDir)
}
