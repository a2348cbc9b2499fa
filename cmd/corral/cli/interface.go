package cli

import (
	"google.golang.org/grpc"

	"context"

	"fmt"
	"net"
	"net/netip"

	"github.com/spf13/cobra"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
)

func (inv *invocation) reserveInterfaceCommand() *cobra.Command {
	var (
		output      string
		annotations []string
		mac         string
		ipv4        string
		ipv6        string
	)
	cmd := &cobra.Command{
		Use:   "reserve-interface NETWORK IFACE",
		Short: "Reserve addresses for interface IFACE on NETWORK and print the network",
		Long: `reserve-interface reserves a MAC and addresses for IFACE on NETWORK. Addresses
left out are allocated by corrald from the network's ranges.`,
		Args: argsBetween(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			ann, err := parseAnnotations(annotations)
			if err != nil {
				return err
			}
			if mac != "" {
				if _, err := net.ParseMAC(mac); err != nil {
					return usageErrorf("--hardware-address %q: not a MAC address", mac)
				}
			}
			if ipv4 != "" {
				if a, err := netip.ParseAddr(ipv4); err != nil || !a.Is4() {
					return usageErrorf("--ipv4-address %q: not an IPv4 address", ipv4)
				}
			}
			if ipv6 != "" {
				if a, err := netip.ParseAddr(ipv6); err != nil || !a.Is6() || a.Is4In6() {
					return usageErrorf("--ipv6-address %q: not an IPv6 address", ipv6)
				}
			}
			var network *poolv1.Network
			if err := inv.rpc(cmd, fmt.Sprintf("network %q: reserve interface %q", args[0], args[1]), func(ctx context.Context, cc *grpc.ClientConn) (err error) {
				network, err = poolv1.NewNetworkServiceClient(cc).ReserveNetworkInterface(ctx, &poolv1.ReserveNetworkInterfaceRequest{
					NetworkName:          args[0],
					NetworkInterfaceName: args[1],
					Annotations:          ann,
					HardwareAddress:      mac,
					Ipv4Address:          ipv4,
					Ipv6Address:          ipv6,
				})
				return err
			}); err != nil {
				return err
			}
			return printRecord(cmd, networkKind, network, output)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&mac, "hardware-address", "", "MAC address of the interface (default: generated)")
	fs.StringVar(&ipv4, "ipv4-address", "", "IPv4 address (default: allocated)")
	fs.StringVar(&ipv6, "ipv6-address", "", "IPv6 address (default: allocated)")
	addAnnotationFlag(cmd, &annotations)
	addOutputFlag(cmd, &output)
	return cmd
}

func (inv *invocation) releaseInterfaceCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "release-interface NETWORK IFACE",
		Short: "Release the addresses of interface IFACE on NETWORK",
		Args:  argsBetween(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := inv.rpc(cmd, fmt.Sprintf("network %q: release interface %q", args[0], args[1]), func(ctx context.Context, cc *grpc.ClientConn) error {
				_, err := poolv1.NewNetworkServiceClient(cc).ReleaseNetworkInterface(ctx, &poolv1.ReleaseNetworkInterfaceRequest{
					NetworkName:          args[0],
					NetworkInterfaceName: args[1],
				})
				return err
			}); err != nil {
				return err
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "network/%s: interface %s released\n", args[0], args[1])
			return writeErr(err)
		},
	}
}
