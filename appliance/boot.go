package appliance

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/corralhq/corral/auth/pki"
	"github.com/corralhq/corral/boot/dhcp"
	"github.com/corralhq/corral/boot/dhcp6"
	boothttp "github.com/corralhq/corral/boot/http"
	"github.com/corralhq/corral/boot/ra"
	"github.com/corralhq/corral/boot/tftp"
	"github.com/corralhq/corral/fleet"
	"github.com/corralhq/corral/images"
)

// ImagesDir is the catalog directory inside the data directory.
const ImagesDir = "images"

// BootConfig configures network boot: DHCP, TFTP, HTTP and RA (docs/architecture.md,
// steps 2-4; boot/README.md). Network boot runs only when Interface is set; the
// zero value leaves it off (tests and API-only appliances).
type BootConfig struct {
	// Interface is the boot interface (--boot-interface). DHCP and RA bind
	// to it; its first IPv4 address is the address clients are sent to.
	Interface string
	// DHCPMode is full, proxy or off (default proxy).
	DHCPMode string
	// DHCPRange is "START-END" of the local pool (full mode); the subnet is
	// the boot interface's network containing it, or "START-END/BITS".
	DHCPRange string
	// DHCPRouter and DHCPDNS are options 3 and 6 for the local range
	// (DNS also for relayed ranges).
	DHCPRouter []string
	DHCPDNS    []string
	// DHCPLeaseTime is option 51 (default 1h).
	DHCPLeaseTime time.Duration
	// DHCPRelayRanges are pools for relayed segments,
	// "SUBNET=START-END[@ROUTER]", e.g. 10.9.0.0/24=10.9.0.100-10.9.0.200@10.9.0.1.
	DHCPRelayRanges []string
	// HTTPListen is boot/http's address (default ":8080").
	HTTPListen string
	// TFTPListen is boot/tftp's address (default ":69"; "off" disables).
	TFTPListen string
	// HTTPBootBase is the http(s)://host[:port] UEFI HTTP boot clients
	// fetch the iPXE binary from (dhcp.Config.HTTPBootBase; default this
	// appliance's boot HTTP).
	HTTPBootBase string
	// HTTPSBootListen, when set, serves the boot profile's artifacts over
	// TLS with the boot CA's RSA certificate (pki.EnsureBootCA, kept in
	// DATA_DIR/pki/boot) for firmware that has that CA enrolled; UEFI HTTP
	// boot clients then get an https:// URL on this listener unless
	// HTTPBootBase says otherwise.
	HTTPSBootListen string
	// SecureBoot serves x64 UEFI firmware PXE clients the signed chain
	// (Debian's shim → Debian's network GRUB → the signed kernel, over
	// TFTP) instead of iPXE (docs/architecture.md, "Secure Boot"). The
	// catalog must hold both loaders and TFTP must be on.
	SecureBoot bool
	// RA answers IPv6 router solicitations with lifetime 0 (default on;
	// set NoRA to disable); with DHCPv6 on it sets the managed and other
	// flags and advertises the local DHCPv6 prefix on-link.
	NoRA bool
	// RARouterLifetime is the advertised router lifetime (0: not a
	// default router; at most 9000 s).
	RARouterLifetime time.Duration
	// DHCP6Range is "START-END[/BITS]" of the local DHCPv6 pool (boot/dhcp6;
	// empty: no DHCPv6). BITS defaults to the boot interface's prefix
	// containing START, else 64. With no IPv4 address on the boot
	// interface the appliance is IPv6-only: DHCPv4 stays off and boot
	// URLs name the interface's IPv6 address.
	DHCP6Range string
	// DHCP6RelayRanges are pools for relayed IPv6 links,
	// "PREFIX=START-END", e.g. fd00:9::/64=fd00:9::100-fd00:9::1ff.
	DHCP6RelayRanges []string
	// DHCP6DNS are option 23's servers; DHCP6LeaseTime the valid lifetime
	// (default 1h).
	DHCP6DNS       []string
	DHCP6LeaseTime time.Duration
	// DHCP6RelayFrom are the prefixes DHCPv6 Relay-Forward messages may
	// come from (empty: any).
	DHCP6RelayFrom []string
	// Kernel and Initrd are the discover profile's files (default: the
	// test stand-ins, see images.Config).
	Kernel, Initrd string
	// HypervisorInitrd is the hypervisor profile's initramfs, booted with
	// Kernel (default: the one `corrald images build` registered, if it
	// matches the discovery kernel in use; else none).
	HypervisorInitrd string
	// KernelArgs are extra kernel arguments for booted machines.
	KernelArgs string
	// TokenTTL is the per-boot agent token lifetime (default 1h).
	TokenTTL time.Duration
	// Scripts rate-limit /boot.ipxe per MAC and per source address
	// (--boot-script-*; zero fields take boot/http's defaults). In full
	// DHCP mode a MAC's script also goes only to the address leased to it.
	Scripts boothttp.ScriptLimits
	// IPXEDirs are where iPXE binaries are copied from (default Debian's).
	IPXEDirs []string
	// MaxDiscovered caps the placeholder machines DHCP and HTTP discovery
	// create for unknown MACs (inventory.Config.MaxDiscovered; 0: 10,000,
	// negative: no cap); DiscoveredGCAfter is the age at which a
	// never-registered one is deleted (0: 24h, negative: never;
	// placeholders.go). DHCPDeclineQuarantine is how long a DECLINEd
	// address is kept out of offers (0: 10 min). MaxUnaccepted caps the
	// machines registered and not accepted (inventory.Config.MaxUnaccepted;
	// 0: MaxDiscovered's value, negative: no cap).
	MaxDiscovered         int
	MaxUnaccepted         int
	DiscoveredGCAfter     time.Duration
	DHCPDeclineQuarantine time.Duration
	// DHCPBalanceMaxSecs: in a fleet, appliances serving one segment in
	// full mode split its DISCOVERs by MAC, and answer every one whose
	// secs field is at least this (fleet.Balance); 0 turns the split off
	// (every appliance answers every DISCOVER).
	DHCPBalanceMaxSecs uint16
}

// initBoot wires the boot servers into s (s.addComponent) after the store,
// CA and inventory exist.
func (s *Server) initBoot() error {
	bc := s.cfg.Boot
	s.initPlaceholderGC()
	if bc.Interface == "" {
		s.log.Info("network boot is off: set --boot-interface to serve DHCP/TFTP/HTTP")
		return nil
	}
	mode, err := dhcp.ParseMode(cmp.Or(bc.DHCPMode, string(dhcp.ModeProxy)))
	if err != nil {
		return err
	}
	serverIP, err := dhcp.InterfaceIPv4(bc.Interface)
	v6only := false
	if err != nil {
		if bc.DHCP6Range == "" {
			return fmt.Errorf("--boot-interface: %w", err)
		}
		// IPv6-only: boot URLs name the interface's IPv6 address, and
		// there is no DHCPv4 to serve.
		ip6, err6 := dhcp6.InterfaceIPv6(bc.Interface)
		if err6 != nil {
			return fmt.Errorf("--boot-interface: %w; %w", err, err6)
		}
		if mode == dhcp.ModeFull {
			return fmt.Errorf("--dhcp-mode full: --boot-interface %s has no IPv4 address (IPv6-only: use --dhcp-mode off with --dhcp6-range)", bc.Interface)
		}
		serverIP, v6only, mode = ip6, true, dhcp.ModeOff
	}
	ranges, err := parseRanges(bc, mode, serverIP)
	if err != nil {
		return err
	}
	icfg := images.Config{Dir: filepath.Join(s.cfg.DataDir, ImagesDir), IPXEDirs: bc.IPXEDirs, Kernel: bc.Kernel, Initrd: bc.Initrd, HypervisorInitrd: bc.HypervisorInitrd}
	if bc.SecureBoot {
		icfg.LoaderFiles = images.DebianLoaderFiles
	}
	if s.cfg.Store.Kind == StoreEtcd {
		// In a fleet every appliance serves every boot: publish what this
		// one built, fetch what the fleet's manifest names and this one
		// lacks from a peer, and boot the fleet's files.
		icfg = icfg.WithFleet(s.fleetArtifacts())
	}
	cat, err := images.Open(icfg.WithBuiltDiscover())
	if err != nil {
		return err
	}
	for _, a := range cat.List() {
		s.log.Debug("catalog", "file", a.Name, "kind", string(a.Kind), "bytes", a.Size, "sha256", a.SHA256)
	}
	if bc.SecureBoot {
		if !cat.Has(images.ShimX64EFI) || !cat.Has(images.GrubX64EFI) {
			return fmt.Errorf("--secure-boot: the catalog has no %s and %s (install Debian's shim-signed and grub-efi-amd64-signed)", images.ShimX64EFI, images.GrubX64EFI)
		}
		if bc.TFTPListen == "off" {
			return errors.New("--secure-boot needs TFTP (--tftp-listen): the signed GRUB fetches its configuration, kernel and initramfs over TFTP")
		}
	}
	if !cat.Has(images.HypervisorInitrd) {
		s.log.Warn("the catalog has no hypervisor image: machines with the hypervisor intent boot their local disk (run corrald images build)")
	}
	fp, err := pki.Fingerprint(s.ca.CertPEM())
	if err != nil {
		return err
	}
	_, apiPort, _ := net.SplitHostPort(s.lis.Addr().String())
	apiEndpoint, warn, err := scriptEndpoint(s.cfg.APIListen, apiPort, s.cfg.Lifecycle.APIAdvertise, bc.Interface, interfaceAddrs(bc.Interface))
	if err != nil {
		return err
	}
	if warn != "" {
		s.log.Warn(warn, "api_listen", s.cfg.APIListen, "interface", bc.Interface, "endpoint", apiEndpoint)
	}
	var ranges6 []dhcp6.Range
	var serverIP6 netip.Addr
	if bc.DHCP6Range != "" {
		if serverIP6, err = dhcp6.InterfaceIPv6(bc.Interface); err != nil {
			return fmt.Errorf("--dhcp6-range: %w", err)
		}
		if ranges6, err = parseRanges6(bc, serverIP6); err != nil {
			return err
		}
	} else if len(bc.DHCP6RelayRanges) > 0 || len(bc.DHCP6DNS) > 0 {
		return errors.New("--dhcp6-relay-range and --dhcp6-dns need --dhcp6-range")
	}
	var leases boothttp.Leases
	if mode == dhcp.ModeFull || len(ranges6) > 0 {
		// A MAC's script only to the address leased to that MAC, for
		// each address family corrald leases.
		leases = storeLeases{st: s.store, now: time.Now, v4: mode == dhcp.ModeFull, v6: len(ranges6) > 0}
	}
	hs, err := boothttp.New(boothttp.Config{
		Leases: leases,
		Listen: cmp.Or(bc.HTTPListen, ":8080"), Catalog: cat, Inventory: s.inv, Tokens: s.tokens, Timeline: s.inv,
		CreateUnknown: mode == dhcp.ModeOff && len(ranges6) == 0, APIEndpoint: apiEndpoint, PeerEndpoints: s.peerEndpoints, CAFingerprint: fp,
		TokenTTL: bc.TokenTTL, KernelArgs: bc.KernelArgs, Logger: s.log.With("component", "boot-http"),
		Limits: s.cfg.Limits.HTTP, Scripts: bc.Scripts, Observer: s.obs.HTTP(), OSImages: s.osImages,
		PhoneHome: s.lifecycle.PhoneHome(),
	})
	if err != nil {
		return err
	}
	s.bootHTTP = hs
	// Release what is bound if a later part fails.
	var closers []func() error
	ok := false
	defer func() {
		if !ok {
			for _, c := range closers {
				_ = c() // best effort: the error that made the start fail is returned
			}
		}
	}()
	closers = append(closers, hs.Close)
	s.lifecycle.SetKexec(kexecBoot{http: hs, ip: serverIP.String()})
	s.lifecycle.SetCommissionOverlay(commissionOverlay{http: hs, ip: serverIP.String()}) // commission.go
	_, httpPort, _ := net.SplitHostPort(hs.Addr().String())
	httpBase := "http://" + net.JoinHostPort(serverIP.String(), httpPort)
	bootBase := bc.HTTPBootBase
	if bc.HTTPSBootListen != "" {
		hh, err := s.httpsBoot(hs, bc.HTTPSBootListen, serverIP)
		if err != nil {
			return err
		}
		closers = append(closers, hh.Close)
		s.addComponent("boot-https", hh.Run)
		if bootBase == "" {
			_, port, _ := net.SplitHostPort(hh.Addr().String())
			bootBase = "https://" + net.JoinHostPort(serverIP.String(), port)
		}
	}

	var ds *dhcp.Server
	if mode != dhcp.ModeOff {
		ds, err = dhcp.New(context.Background(), dhcp.Config{
			Mode: mode, Interface: bc.Interface, ServerIP: serverIP, Ranges: ranges, Alone: s.cfg.Store.Kind != StoreEtcd, LeaseTime: bc.DHCPLeaseTime, DeclineQuarantine: bc.DHCPDeclineQuarantine,
			HTTPBase: httpBase, HTTPBootBase: bootBase, SecureBoot: bc.SecureBoot, Catalog: cat, Store: s.store, Inventory: s.inv, Timeline: s.inv,
			Logger: s.log.With("component", "dhcp"), Observer: s.obs.DHCP(), Balance: s.dhcpBalance(mode, ranges),
		})
		if err != nil {
			return err
		}
		closers = append(closers, ds.Close)
		s.addComponent("dhcp", ds.Run)
		if mode == dhcp.ModeFull {
			s.obs.DHCPRanges(ds.RangeUsage)
		}
	}
	var ds6 *dhcp6.Server
	relayFrom6, err := parseRelayFrom6(bc.DHCP6RelayFrom)
	if err != nil {
		return err
	}
	if len(ranges6) > 1 && len(relayFrom6) == 0 {
		s.log.Warn("DHCPv6 relayed ranges are served to a Relay-Forward from any source: a host on the boot LAN can claim any MAC in option 79; give the relays' addresses with --dhcp6-relay-from")
	}
	if len(ranges6) > 0 {
		ds6, err = dhcp6.New(context.Background(), dhcp6.Config{
			Interface: bc.Interface, ServerIP: serverIP6, Ranges: ranges6, LeaseTime: bc.DHCP6LeaseTime, DeclineQuarantine: bc.DHCPDeclineQuarantine,
			HTTPBase: "http://" + net.JoinHostPort(serverIP6.String(), httpPort), Catalog: cat, Store: s.store, Inventory: s.inv, Timeline: s.inv,
			Logger: s.log.With("component", "dhcp6"), Observer: s.obs.DHCP6(), RelayFrom: relayFrom6,
			// In a fleet every appliance answers every SOLICIT: Rapid
			// Commit would bind one client on each (RFC 8415 §18.3.1 lets
			// a server ignore it), so the client's REQUEST picks one.
			NoRapidCommit: s.cfg.Store.Kind == StoreEtcd,
		})
		if err != nil {
			return err
		}
		s.obs.DHCP6Leases(ds6.LeaseStats)
		closers = append(closers, ds6.Close)
		s.addComponent("dhcp6", ds6.Run)
	}
	if l := cmp.Or(bc.TFTPListen, ":69"); l != "off" && ds6 != nil {
		// PXEv6 fetches tftp://[addr]/...: a second, IPv6-only socket
		// beside the IPv4 one.
		_, port, err := net.SplitHostPort(l)
		if err != nil {
			return fmt.Errorf("--tftp-listen %q: %w", l, err)
		}
		c6, err := net.ListenPacket("udp6", net.JoinHostPort("::", port))
		if err != nil {
			return fmt.Errorf("tftp over IPv6: %w", err)
		}
		t6, err := tftp.New(tftp.Config{Conn: c6, Catalog: cat, Timeline: s.inv, MACs: ds6, Logger: s.log.With("component", "tftp6"), Limits: s.cfg.Limits.TFTP, Observer: s.obs.TFTP()})
		if err != nil {
			c6.Close()
			return err
		}
		closers = append(closers, t6.Close)
		s.addComponent("tftp6", t6.Run)
	}
	if l := cmp.Or(bc.TFTPListen, ":69"); l != "off" && !v6only {
		tc := tftp.Config{Listen: l, Catalog: cat, Timeline: s.inv, Logger: s.log.With("component", "tftp"), Limits: s.cfg.Limits.TFTP, Observer: s.obs.TFTP()}
		if ds != nil {
			tc.MACs = ds
		}
		if bc.SecureBoot {
			tc.Grub, tc.ServerIP = hs, serverIP
		}
		ts, err := tftp.New(tc)
		if err != nil {
			return err
		}
		closers = append(closers, ts.Close)
		s.addComponent("tftp", ts.Run)
	}
	s.addComponent("boot-http", hs.Run)
	if !bc.NoRA {
		params := ra.Params{RouterLifetime: bc.RARouterLifetime}
		for _, r := range ranges6 {
			if !r.Relayed {
				params.Managed, params.Other = true, true
				params.OnLink = append(params.OnLink, r.Prefix)
			}
		}
		r, err := ra.New(ra.Config{Interface: bc.Interface, Timeline: s.inv, Logger: s.log.With("component", "ra"), Params: params})
		if err != nil {
			// IPv6 may be disabled on the host: network boot still works,
			// iPXE just waits for its IPv6 timeout.
			s.log.Warn("router-advertisement responder not started", "err", err)
		} else {
			s.addComponent("ra", r.Run)
		}
	}
	s.initDeploy(serverIP.String(), httpPort, ds, mode == dhcp.ModeFull)
	ok = true
	s.log.Info("network boot on", "interface", bc.Interface, "server_ip", serverIP.String(), "dhcp_mode", string(mode), "dhcp6", len(ranges6) > 0, "ipv6_only", v6only,
		"http", hs.Addr().String(), "catalog", cat.Dir())
	return nil
}

// scriptEndpoint is the API endpoint boot scripts give agents
// (corral.endpoint): ":PORT" (the host iPXE reached boot/http on) when the
// API listens on every address, or on loopback with a loopback boot
// interface; the listen address when it is one of the boot interface's; the
// listen address with a warning when it is another non-loopback address
// (agents must be routed to it); --api-advertise when the listen address is
// loopback-only. A loopback-only API with nothing advertised is refused:
// every agent would retry "connection refused" forever on its console.
func scriptEndpoint(listen, port, advertise, ifname string, ifAddrs []netip.Addr) (ep, warn string, err error) {
	host, _, _ := net.SplitHostPort(listen)
	if host == "" || isUnspecified(host) {
		return ":" + port, "", nil
	}
	addr, perr := netip.ParseAddr(host)
	loopback := strings.EqualFold(host, "localhost") || (perr == nil && addr.IsLoopback())
	loopbackIf := len(ifAddrs) > 0
	for _, a := range ifAddrs {
		loopbackIf = loopbackIf && a.IsLoopback()
	}
	if loopback && loopbackIf {
		return ":" + port, "", nil
	}
	if perr == nil && slices.Contains(ifAddrs, addr.WithZone("")) {
		return net.JoinHostPort(host, port), "", nil
	}
	if advertise != "" {
		ah, _, aerr := net.SplitHostPort(advertise)
		aa, _ := netip.ParseAddr(ah)
		if aerr != nil || ah == "" || isUnspecified(ah) || (!loopbackIf && (strings.EqualFold(ah, "localhost") || aa.IsLoopback())) {
			return "", "", fmt.Errorf("--api-advertise %q: agents on --boot-interface %s cannot reach it: give a HOST:PORT on the boot LAN, e.g. %s",
				advertise, ifname, net.JoinHostPort(firstOr(ifAddrs, "BOOT-ADDRESS"), port))
		}
		return advertise, "", nil
	}
	if loopback {
		return "", "", fmt.Errorf("--api-listen %s accepts only local connections, but booting machines on --boot-interface %s would be told to reach the API at %s: "+
			"listen on the boot interface's address or 0.0.0.0 (--api-listen %s or :%s), or set --api-advertise HOST:PORT to an address they reach",
			listen, ifname, net.JoinHostPort(firstOr(ifAddrs, "the boot interface's address"), port), net.JoinHostPort(firstOr(ifAddrs, "BOOT-ADDRESS"), port), port)
	}
	return net.JoinHostPort(host, port), "--api-listen is not an address of the boot interface: booting machines must be routed to it (or set --api-advertise)", nil
}

// interfaceAddrs lists ifname's addresses (none if it has none or does
// not exist: initBoot has already refused a missing interface).
func interfaceAddrs(ifname string) []netip.Addr {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil
	}
	as, _ := ifi.Addrs()
	var out []netip.Addr
	for _, a := range as {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out
}

// firstOr is the first IPv4 address of as as a string, else def.
func firstOr(as []netip.Addr, def string) string {
	for _, a := range as {
		if a.Is4() {
			return a.String()
		}
	}
	return def
}

func parseAddrs(flag string, ss []string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, s := range ss {
		a, err := netip.ParseAddr(strings.TrimSpace(s))
		if err != nil || !a.Is4() {
			return nil, fmt.Errorf("%s %q: want an IPv4 address", flag, s)
		}
		out = append(out, a)
	}
	return out, nil
}

// parseStartEnd parses "A-B".
func parseStartEnd(flag, s string) (netip.Addr, netip.Addr, error) {
	a, b, ok := strings.Cut(s, "-")
	start, err1 := netip.ParseAddr(strings.TrimSpace(a))
	end, err2 := netip.ParseAddr(strings.TrimSpace(b))
	if !ok || err1 != nil || err2 != nil || !start.Is4() || !end.Is4() {
		return netip.Addr{}, netip.Addr{}, fmt.Errorf("%s %q: want START-END, e.g. 10.0.0.100-10.0.0.199", flag, s)
	}
	return start, end, nil
}

// parseRanges turns the flags into DHCP ranges.
func parseRanges(bc BootConfig, mode dhcp.Mode, serverIP netip.Addr) ([]dhcp.Range, error) {
	if mode != dhcp.ModeFull {
		if bc.DHCPRange != "" || len(bc.DHCPRelayRanges) > 0 {
			return nil, fmt.Errorf("--dhcp-range and --dhcp-relay-range need --dhcp-mode full (mode is %s)", mode)
		}
		return nil, nil
	}
	if bc.DHCPRange == "" {
		return nil, errors.New("--dhcp-mode full needs --dhcp-range START-END (or use --dhcp-mode proxy beside another DHCP server)")
	}
	dns, err := parseAddrs("--dhcp-dns", bc.DHCPDNS)
	if err != nil {
		return nil, err
	}
	router, err := parseAddrs("--dhcp-router", bc.DHCPRouter)
	if err != nil {
		return nil, err
	}
	spec, bits, hasBits := strings.Cut(bc.DHCPRange, "/")
	start, end, err := parseStartEnd("--dhcp-range", spec)
	if err != nil {
		return nil, err
	}
	var subnet netip.Prefix
	if hasBits {
		n, err := strconv.Atoi(bits)
		if err != nil || n < 8 || n > 30 {
			return nil, fmt.Errorf("--dhcp-range %q: prefix length must be 8-30", bc.DHCPRange)
		}
		subnet = netip.PrefixFrom(start, n).Masked()
	} else if subnet, err = dhcp.InterfacePrefix(bc.Interface, start); err != nil {
		return nil, fmt.Errorf("--dhcp-range %q: %w (give the prefix: START-END/BITS)", bc.DHCPRange, err)
	}
	local := dhcp.Range{Subnet: subnet, Start: start, End: end, Router: router, DNS: dns}
	if err := local.Validate(); err != nil {
		return nil, fmt.Errorf("--dhcp-range: %w", err)
	}
	if local.Contains(serverIP) {
		return nil, fmt.Errorf("--dhcp-range %s contains the appliance's own address %s", bc.DHCPRange, serverIP)
	}
	out := []dhcp.Range{local}
	for _, rr := range bc.DHCPRelayRanges {
		sub, rest, ok := strings.Cut(rr, "=")
		p, err := netip.ParsePrefix(strings.TrimSpace(sub))
		if !ok || err != nil || !p.Addr().Is4() {
			return nil, fmt.Errorf("--dhcp-relay-range %q: want SUBNET=START-END[@ROUTER], e.g. 10.9.0.0/24=10.9.0.100-10.9.0.200@10.9.0.1", rr)
		}
		se, gw, hasGW := strings.Cut(rest, "@")
		s, e, err := parseStartEnd("--dhcp-relay-range", se)
		if err != nil {
			return nil, err
		}
		r := dhcp.Range{Subnet: p.Masked(), Start: s, End: e, DNS: dns, Relayed: true}
		if hasGW {
			if r.Router, err = parseAddrs("--dhcp-relay-range router", []string{gw}); err != nil {
				return nil, err
			}
		}
		if err := r.Validate(); err != nil {
			return nil, fmt.Errorf("--dhcp-relay-range: %w", err)
		}
		for _, o := range out {
			if o.Subnet.Overlaps(r.Subnet) {
				return nil, fmt.Errorf("--dhcp-relay-range %q overlaps %s", rr, o.Subnet)
			}
		}
		out = append(out, r)
	}
	return out, nil
}

// fleetArtifacts syncs the boot artifacts with the fleet once, before the
// boot servers open the catalog, and returns the fleet's manifest. A sync
// that fails is logged: the appliance serves what it holds and the
// periodic sync (artifact-sync) tries again.
func (s *Server) fleetArtifacts() []images.Artifact {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	log := s.log.With("component", "artifacts")
	if got, err := s.artifacts.Sync(ctx, nil); err != nil {
		log.Warn("boot artifacts not in sync with the fleet at start", "err", err)
	} else if len(got) > 0 {
		log.Info("boot artifacts fetched from peers", "count", len(got))
	}
	manifest, err := s.artifacts.Manifest(ctx)
	if err != nil {
		log.Warn("fleet catalog manifest unreadable; booting this appliance's own files", "err", err)
		return nil
	}
	return manifest
}

// dhcpBalance publishes the subnets this appliance hands out addresses on
// in its runner record and returns the split of their DISCOVERs among the
// fleet's appliances (fleet.Balance), or nil: alone on its store, not in
// full mode, or with --dhcp-balance-max-secs 0.
func (s *Server) dhcpBalance(mode dhcp.Mode, ranges []dhcp.Range) func(string, netip.Prefix, uint16) bool {
	if mode != dhcp.ModeFull || s.cfg.Store.Kind != StoreEtcd || s.fleetSelf == nil || s.cfg.Boot.DHCPBalanceMaxSecs == 0 {
		return nil
	}
	for _, r := range ranges {
		if seg := r.Subnet.Masked().String(); !slices.Contains(s.fleetSelf.DhcpSegments, seg) {
			s.fleetSelf.DhcpSegments = append(s.fleetSelf.DhcpSegments, seg)
		}
	}
	b := &fleet.Balance{Store: s.store, Self: s.fleetSelf.GetName(), MaxSecs: s.cfg.Boot.DHCPBalanceMaxSecs, Logger: s.log.With("component", "dhcp-balance")}
	s.addComponent("dhcp-balance", b.Run)
	return b.Answers
}

// parseRelayFrom6 parses --dhcp6-relay-from (an address is a /128).
func parseRelayFrom6(ss []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, v := range ss {
		v = strings.TrimSpace(v)
		p, err := netip.ParsePrefix(v)
		if err != nil {
			a, aerr := netip.ParseAddr(v)
			if aerr != nil {
				return nil, fmt.Errorf("--dhcp6-relay-from %q: want an IPv6 prefix or address", v)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if !p.Addr().Is6() || p.Addr().Is4In6() {
			return nil, fmt.Errorf("--dhcp6-relay-from %q: want an IPv6 prefix or address", v)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// parseRanges6 turns the DHCPv6 flags into ranges: the local one (its
// prefix from /BITS, else the boot interface's prefix holding START, else
// /64) and the relayed ones.
func parseRanges6(bc BootConfig, serverIP6 netip.Addr) ([]dhcp6.Range, error) {
	var dns []netip.Addr
	for _, d := range bc.DHCP6DNS {
		a, err := netip.ParseAddr(strings.TrimSpace(d))
		if err != nil || !a.Is6() || a.Is4In6() {
			return nil, fmt.Errorf("--dhcp6-dns %q: want an IPv6 address", d)
		}
		dns = append(dns, a)
	}
	startEnd := func(flag, s string) (netip.Addr, netip.Addr, error) {
		a, b, ok := strings.Cut(s, "-")
		start, err1 := netip.ParseAddr(strings.TrimSpace(a))
		end, err2 := netip.ParseAddr(strings.TrimSpace(b))
		if !ok || err1 != nil || err2 != nil || !start.Is6() || !end.Is6() || start.Is4In6() || end.Is4In6() {
			return netip.Addr{}, netip.Addr{}, fmt.Errorf("%s %q: want START-END of IPv6 addresses, e.g. fd00:10::100-fd00:10::1ff", flag, s)
		}
		return start, end, nil
	}
	spec, bits, hasBits := strings.Cut(bc.DHCP6Range, "/")
	start, end, err := startEnd("--dhcp6-range", spec)
	if err != nil {
		return nil, err
	}
	prefix := netip.PrefixFrom(start, 64).Masked()
	if hasBits {
		n, err := strconv.Atoi(bits)
		if err != nil || n < 8 || n > 126 {
			return nil, fmt.Errorf("--dhcp6-range %q: prefix length must be 8-126", bc.DHCP6Range)
		}
		prefix = netip.PrefixFrom(start, n).Masked()
	} else {
		for _, a := range interfacePrefixes(bc.Interface) {
			if a.Contains(start) {
				prefix = a.Masked()
				break
			}
		}
	}
	local := dhcp6.Range{Prefix: prefix, Start: start, End: end, DNS: dns}
	if err := local.Validate(); err != nil {
		return nil, fmt.Errorf("--dhcp6-range: %w", err)
	}
	if local.Contains(serverIP6) {
		return nil, fmt.Errorf("--dhcp6-range %s contains the appliance's own address %s", bc.DHCP6Range, serverIP6)
	}
	out := []dhcp6.Range{local}
	for _, rr := range bc.DHCP6RelayRanges {
		sub, rest, ok := strings.Cut(rr, "=")
		p, err := netip.ParsePrefix(strings.TrimSpace(sub))
		if !ok || err != nil || !p.Addr().Is6() {
			return nil, fmt.Errorf("--dhcp6-relay-range %q: want PREFIX=START-END, e.g. fd00:9::/64=fd00:9::100-fd00:9::1ff", rr)
		}
		s, e, err := startEnd("--dhcp6-relay-range", rest)
		if err != nil {
			return nil, err
		}
		r := dhcp6.Range{Prefix: p.Masked(), Start: s, End: e, DNS: dns, Relayed: true}
		if err := r.Validate(); err != nil {
			return nil, fmt.Errorf("--dhcp6-relay-range: %w", err)
		}
		for _, o := range out {
			if o.Prefix.Overlaps(r.Prefix) {
				return nil, fmt.Errorf("--dhcp6-relay-range %q overlaps %s", rr, o.Prefix)
			}
		}
		out = append(out, r)
	}
	return out, nil
}

// interfacePrefixes are ifname's IPv6 prefixes.
func interfacePrefixes(ifname string) []netip.Prefix {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil
	}
	as, _ := ifi.Addrs()
	var out []netip.Prefix
	for _, a := range as {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() == nil {
			ones, _ := n.Mask.Size()
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, netip.PrefixFrom(ip, ones))
			}
		}
	}
	return out
}

// BootCADir is where the boot CA (pki.EnsureBootCA) and the HTTPS boot
// certificate live, under the data directory.
var BootCADir = filepath.Join(PKIDir, "boot")

// httpsBoot starts the HTTPS boot listener on listen: the boot CA (made
// the first time; in a fleet, the fleet's) and a server certificate for
// the boot address.
func (s *Server) httpsBoot(hs *boothttp.Server, listen string, serverIP netip.Addr) (*boothttp.HTTPS, error) {
	if !serverIP.Is4() {
		return nil, errors.New("--https-boot-listen: the boot interface has no IPv4 address (HTTPS boot is served to IPv4 HTTP boot clients)")
	}
	dir := filepath.Join(s.cfg.DataDir, BootCADir)
	// In a fleet every appliance serves from the one boot CA (store.go).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.shareBootCA(ctx); err != nil {
		return nil, fmt.Errorf("--https-boot-listen: %w", err)
	}
	ca, err := pki.EnsureBootCA(dir)
	if err != nil {
		return nil, fmt.Errorf("--https-boot-listen: %w", err)
	}
	cert, err := ca.EnsureBootServerCert(filepath.Join(dir, "server"), []string{serverIP.String()})
	if err != nil {
		return nil, fmt.Errorf("--https-boot-listen: %w", err)
	}
	s.obs.CertificateExpiry("boot-ca", ca.NotAfter())
	s.obs.CertificateExpiry("boot-server", cert.Leaf.NotAfter)
	return hs.NewHTTPS(listen, pki.BootTLSConfig(cert))
}
