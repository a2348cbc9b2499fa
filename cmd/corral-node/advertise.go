//go:build !corral_discovery

package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/hypervisor/node"
	"google.golang.org/grpc"
)

// listensEverywhere reports whether a listen address names no host
// (":20181", "0.0.0.0:20181", "[::]:20181"): the appliance then cannot
// learn from it where to dial the node.
func listensEverywhere(listen string) bool {
	h, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if h == "" {
		return true
	}
	a, err := netip.ParseAddr(h)
	return err == nil && a.IsUnspecified()
}

// routeAddress is the local address this host sends from to reach
// endpoint (host:port): a UDP "connect" asks the kernel's routing table
// and sends nothing. It fails when there is no route, or the endpoint's
// name does not resolve.
func routeAddress(ctx context.Context, endpoint string) (netip.Addr, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := (&net.Dialer{}).DialContext(ctx, "udp", endpoint)
	if err != nil {
		return netip.Addr{}, err
	}
	defer c.Close()
	ua, ok := c.LocalAddr().(*net.UDPAddr)
	if !ok {
		return netip.Addr{}, fmt.Errorf("local address %v is not UDP", c.LocalAddr())
	}
	a, ok := netip.AddrFromSlice(ua.IP)
	if !ok || a.Unmap().IsUnspecified() {
		return netip.Addr{}, fmt.Errorf("no local address toward %s", endpoint)
	}
	return a.Unmap(), nil
}

// addressedRegistry fills a Node's empty address with the address this
// node reaches the appliance it is on from, every heartbeat (so a new
// DHCP lease or a failover to an appliance on another network shows).
// When no address can be found it sends nothing and returns the error:
// the node is not registered, so it never shows READY with an address
// the appliance cannot dial; node.Run logs the failure each beat and
// tries again at the next.
type addressedRegistry struct {
	node.Registry
	// current is the appliance endpoint calls go to now.
	current func() string
	// route finds the local address toward an endpoint (routeAddress).
	route func(ctx context.Context, endpoint string) (netip.Addr, error)
	log   *slog.Logger
	last  netip.Addr // only touched from the heartbeat goroutine
}

// ApplyNode registers in with an address, or fails without sending.
func (r *addressedRegistry) ApplyNode(ctx context.Context, in *poolv1.ApplyNodeRequest, opts ...grpc.CallOption) (*poolv1.Node, error) {
	if in.GetAddress() == "" {
		ep := r.current()
		a, err := r.route(ctx, ep)
		if err != nil {
			return nil, fmt.Errorf("not registering: no address to advertise (the node listens on every address and has no route to the appliance at %s: %w); set --advertise ADDRESS", ep, err)
		}
		if a != r.last {
			r.log.Info("advertising the address this node reaches the appliance from", "address", a.String(), "appliance", ep)
			r.last = a
		}
		in.Address = a.String()
	}
	return r.Registry.ApplyNode(ctx, in, opts...)
}

// withAddress makes sure the node registers with an address the
// appliance can dial when it listens on every address and no --advertise
// was given: the address toward the appliance now becomes Advertise
// (logged), and when there is none yet the registry refuses to register
// without one (addressedRegistry) until a route appears.
func withAddress(ctx context.Context, nc *node.Config, current func() string) {
	listen := nc.Listen
	if listen == "" {
		listen = fmt.Sprintf(":%d", node.DefaultPort)
	}
	if nc.Advertise != "" || nc.Registry == nil || !listensEverywhere(listen) {
		return
	}
	ep := current()
	a, err := routeAddress(ctx, ep)
	if err == nil {
		nc.Advertise = a.String()
		nc.Logger.Info("advertising the address this node reaches the appliance from (set --advertise to choose another)", "address", nc.Advertise, "appliance", ep, "listen", listen)
		return
	}
	nc.Logger.Error("no address to advertise: the node listens on every address and has no route to the appliance; it registers once it has one (or set --advertise ADDRESS)", "appliance", ep, "err", err)
	nc.Registry = &addressedRegistry{Registry: nc.Registry, current: current, route: routeAddress, log: nc.Logger}
}
