// Command tftpserve runs a TFTP server over a directory for the TFTP
// benchmark: -impl corral is boot/tftp exactly as corrald runs it (the
// directory is opened as an image catalog, so only iPXE binary names are
// served), -impl pin-default is github.com/pin/tftp/v3 with its defaults
// reading each file from disk, the configuration the issue measured at
// 0.73x tftpd-hpa. See bench/README.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/pin/tftp/v3"

	boottftp "github.com/corralhq/corral/boot/tftp"
	"github.com/corralhq/corral/images"
)

func main() {
	dir := flag.String("dir", "", "directory with the files")
	listen := flag.String("listen", ":69", "UDP listen address")
	impl := flag.String("impl", "corral", "corral or pin-default")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	err := run(ctx, *dir, *listen, *impl)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "tftpserve:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dir, listen, impl string) error {
	switch impl {
	case "corral":
		cat, err := images.Open(images.Config{Dir: filepath.Join(dir, ".catalog"), IPXEDirs: []string{dir}})
		if err != nil {
			return err
		}
		// All benchmark clients share one address: lift the per-client
		// transfer cap (corrald's default is 8) so that it measures the
		// server, not the cap.
		lim := boottftp.DefaultLimits()
		lim.MaxTransfersPerIP = lim.MaxTransfers
		s, err := boottftp.New(boottftp.Config{Listen: listen, Catalog: cat, Limits: lim})
		if err != nil {
			return err
		}
		return s.Run(ctx)
	case "pin-default":
		s := tftp.NewServer(func(name string, rf io.ReaderFrom) error {
			f, err := os.Open(filepath.Join(dir, filepath.Base(name)))
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = rf.ReadFrom(f)
			return err
		}, nil)
		conn, err := net.ListenPacket("udp4", listen)
		if err != nil {
			return err
		}
		go func() { <-ctx.Done(); s.Shutdown() }()
		return s.Serve(conn)
	}
	return fmt.Errorf("unknown -impl %q", impl)
}
