// Package netup brings the discovery image onto the network: it sets the
// physical NICs up, waits for carrier, and runs DHCPv4 (u-root's dhclient,
// insomniacslk's nclient4 inside) on the boot NIC named by the kernel
// command line first, then on the other NICs that have a link. A machine
// told to reach its appliances over IPv6 (Config.IPv6) runs DHCPv6 instead
// (the same dhclient, nclient6 inside). It must not import store/, boot/
// or ipmi/.
package netup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"github.com/u-root/u-root/pkg/dhclient"
	"github.com/vishvananda/netlink"
)

// NIC is what ordering needs to know about a link.
type NIC struct {
	Name    string
	MAC     string
	Carrier bool
}

// Order returns the NICs to try: the one whose MAC is bootMAC first
// (even without carrier: a slow switch port may still come up), then the
// others that have carrier, in their given order.
func Order(nics []NIC, bootMAC string) []NIC {
	bootMAC = strings.ToLower(bootMAC)
	var boot, rest []NIC
	for _, n := range nics {
		switch {
		case strings.ToLower(n.MAC) == bootMAC:
			boot = append(boot, n)
		case n.Carrier:
			rest = append(rest, n)
		}
	}
	return append(boot, rest...)
}

// Config configures Up.
type Config struct {
	BootMAC     string
	LinkTimeout time.Duration // wait for carrier (default 10 s)
	DHCPTimeout time.Duration // per DHCP attempt (default 5 s)
	Retries     int           // DHCP retries per NIC (default 3)
	// QuickTimeout bounds the first exchange on a NIC that has carrier
	// (default 2 s); then the full one (DHCPTimeout, Retries) follows.
	QuickTimeout time.Duration
	// IPv6 runs stateful DHCPv6 instead of DHCPv4: the appliances'
	// endpoints are IPv6 addresses (an IPv6-only boot segment). The
	// address comes as a /128; the segment's router advertisement puts the
	// prefix on the link.
	IPv6    bool
	Console io.Writer
	Logger  *slog.Logger
}

// Lease is the configured address.
type Lease struct {
	Interface string
	MAC       string
	Address   string // CIDR
}

// Up configures the first NIC that gets a DHCPv4 lease (address, routes,
// DNS into /etc/resolv.conf) and returns it. It blocks for at most about
// LinkTimeout + NICs × Retries × DHCPTimeout, or until ctx ends. It needs
// CAP_NET_ADMIN.
func Up(ctx context.Context, cfg Config) (*Lease, error) {
	if cfg.LinkTimeout <= 0 {
		cfg.LinkTimeout = 10 * time.Second
	}
	if cfg.DHCPTimeout <= 0 {
		cfg.DHCPTimeout = 5 * time.Second
	}
	if cfg.Retries <= 0 {
		cfg.Retries = 3
	}
	if cfg.QuickTimeout <= 0 {
		cfg.QuickTimeout = 2 * time.Second
	}
	if cfg.Console == nil {
		cfg.Console = io.Discard
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	links, err := physical()
	if err != nil {
		return nil, err
	}
	if len(links) == 0 {
		return nil, errors.New("netup: no physical network interface (missing driver?)")
	}
	for _, l := range links {
		if err := netlink.LinkSetUp(l); err != nil {
			log.Warn("link up failed", "iface", l.Attrs().Name, "err", err)
		}
	}
	nics := waitCarrier(ctx, links, cfg.BootMAC, cfg.LinkTimeout)
	order := Order(nics, cfg.BootMAC)
	if len(order) == 0 {
		return nil, fmt.Errorf("netup: boot NIC %s not found and no other NIC has a link", cfg.BootMAC)
	}
	var errs []error
	for _, n := range order {
		link, err := netlink.LinkByName(n.Name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		proto := "DHCP"
		if cfg.IPv6 {
			proto = "DHCPv6"
		}
		fmt.Fprintf(cfg.Console, "corral: %s on %s (%s, link %v)\n", proto, n.Name, n.MAC, n.Carrier)
		if n.Carrier && !cfg.IPv6 {
			// The link is up with carrier: the NIC sends now. u-root's
			// dhclient would first wait for the operational state, which
			// the kernel's link watcher sets up to a second later (it
			// batches link events to one a second): ask at once, for one
			// short exchange; a lost answer falls back to the full one.
			start := time.Now()
			l, err := quickLease(ctx, link, cfg.QuickTimeout)
			if err == nil {
				lease := &Lease{Interface: n.Name, MAC: n.MAC, Address: l.String()}
				log.Info("dhcp lease", "iface", lease.Interface, "mac", lease.MAC, "address", lease.Address, "took_ms", time.Since(start).Milliseconds())
				return lease, nil
			}
			log.Warn("quick DHCP failed: full exchange", "iface", n.Name, "err", err)
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		dctx, cancel := context.WithTimeout(ctx, time.Duration(cfg.Retries+1)*cfg.DHCPTimeout)
		results := dhclient.SendRequests(dctx, []netlink.Link{link}, !cfg.IPv6, cfg.IPv6,
			dhclient.Config{Timeout: cfg.DHCPTimeout, Retries: cfg.Retries}, cfg.LinkTimeout)
		var lease *Lease
		for r := range results {
			if r.Err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", n.Name, r.Err))
				continue
			}
			if lease != nil {
				continue
			}
			if err := r.Lease.Configure(); err != nil {
				errs = append(errs, fmt.Errorf("%s: configure: %w", n.Name, err))
				continue
			}
			lease = &Lease{Interface: n.Name, MAC: n.MAC}
			switch p := r.Lease.(type) {
			case *dhclient.Packet4:
				if p.Lease() != nil {
					lease.Address = p.Lease().String()
				}
			case *dhclient.Packet6:
				if a := p.Lease(); a != nil {
					lease.Address = a.IPv6Addr.String() + "/128"
				}
			}
		}
		cancel()
		if lease != nil {
			log.Info("dhcp lease", "iface", lease.Interface, "mac", lease.MAC, "address", lease.Address)
			return lease, nil
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	return nil, fmt.Errorf("netup: no DHCP lease: %w", errors.Join(errs...))
}

// quickLease is one DHCPv4 exchange on link with insomniacslk's nclient4,
// asking what u-root's dhclient asks, and configures the lease with
// u-root's (address, routes, DNS). It does not wait for the link's
// operational state.
func quickLease(ctx context.Context, link netlink.Link, timeout time.Duration) (*net.IPNet, error) {
	client, err := nclient4.New(link.Attrs().Name, nclient4.WithTimeout(timeout), nclient4.WithRetry(1))
	if err != nil {
		return nil, err
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*timeout)
	defer cancel()
	l, err := client.Request(ctx,
		dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXE UROOT")),
		dhcpv4.WithRequestedOptions(dhcpv4.OptionSubnetMask),
		dhcpv4.WithNetboot)
	if err != nil {
		return nil, err
	}
	p := dhclient.NewPacket4(link, l.ACK)
	if err := p.Configure(); err != nil {
		return nil, fmt.Errorf("configure: %w", err)
	}
	if p.Lease() == nil {
		return nil, errors.New("the ACK has no address")
	}
	return p.Lease(), nil
}

// HasLink reports whether a network interface with MAC mac exists under
// root's sys/class/net (root "" means "/"): its driver is loaded. It reads
// sysfs only, so it is cheap enough to ask after every coldplug round.
func HasLink(root, mac string) bool {
	if root == "" {
		root = "/"
	}
	dir := filepath.Join(root, "sys/class/net")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "address"))
		if err == nil && strings.EqualFold(strings.TrimSpace(string(b)), mac) {
			return true
		}
	}
	return false
}

// physical lists links that are real devices with an Ethernet address.
func physical() ([]netlink.Link, error) {
	all, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("netup: list links: %w", err)
	}
	var out []netlink.Link
	for _, l := range all {
		a := l.Attrs()
		if l.Type() != "device" || len(a.HardwareAddr) != 6 || a.Flags&net.FlagLoopback != 0 {
			continue
		}
		out = append(out, l)
	}
	return out, nil
}

// waitCarrier polls until the boot NIC has carrier or timeout passes, and
// returns every link's state.
func waitCarrier(ctx context.Context, links []netlink.Link, bootMAC string, timeout time.Duration) []NIC {
	deadline := time.Now().Add(timeout)
	for {
		var nics []NIC
		bootUp := false
		for _, l := range links {
			fresh, err := netlink.LinkByIndex(l.Attrs().Index)
			if err != nil {
				continue
			}
			a := fresh.Attrs()
			n := NIC{Name: a.Name, MAC: a.HardwareAddr.String(), Carrier: a.OperState == netlink.OperUp || a.RawFlags&0x10000 != 0} // IFF_LOWER_UP
			if strings.EqualFold(n.MAC, bootMAC) && n.Carrier {
				bootUp = true
			}
			nics = append(nics, n)
		}
		if bootUp || time.Now().After(deadline) || ctx.Err() != nil {
			return nics
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}
