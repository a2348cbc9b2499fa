package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	osimagev1 "github.com/corralhq/corral/api/osimage/v1"
	"github.com/corralhq/corral/internal/progress"
)

// osImageChunk is the data one upload message carries (the server takes
// at most 256 KiB).
const osImageChunk = 256 << 10

// osImageCommand groups the OS image verbs.
func (inv *invocation) osImageCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "osimage VERB",
		Aliases: []string{"osimages", "os-image"},
		Short:   "OS images: raw or qcow2 disk images, stored by content, that machines are deployed from (not n0stack's images)",
		Long: `OS images are whole-disk images, raw or qcow2, that Corral writes to a
machine's disk. The appliance keeps each by its SHA-256 and serves it over the
boot HTTP server at /os-images/<sha256>. They are a kind of their own: an
"image" (corral image) is n0stack's, a set of block storages on hypervisor
nodes that VM volumes are generated from.

List them with "corral get osimages", delete one with "corral delete osimage NAME".`,
		Args: cobra.ArbitraryArgs,
		RunE: groupRunE,
	}
	cmd.AddCommand(inv.osImageAddCommand(), inv.osImageUploadCommand())
	return cmd
}

// parseOSImageFormat turns --format into the enum; the format is never
// guessed, so it is required.
func parseOSImageFormat(s string) (osimagev1.OSImageFormat, error) {
	switch strings.ToLower(s) {
	case "raw":
		return osimagev1.OSImageFormat_OS_IMAGE_FORMAT_RAW, nil
	case "qcow2":
		return osimagev1.OSImageFormat_OS_IMAGE_FORMAT_QCOW2, nil
	case "":
		return 0, usageErrorf("--format raw|qcow2 is required: the format is never guessed")
	}
	return 0, usageErrorf("--format %q: want raw or qcow2", s)
}

func (inv *invocation) osImageAddCommand() *cobra.Command {
	var meta metaFlags
	var output, url, sum, format string
	var wait bool
	cmd := &cobra.Command{
		Use:   "add NAME --url URL --sha256 HEX --format raw|qcow2 [--wait]",
		Short: "Register an OS image the appliance downloads from URL, checking its SHA-256 and declared format, and print it",
		Long: `add registers the image and returns at once: the appliance downloads it in
the background (PENDING, then DOWNLOADING with progress), hashing it as it
arrives, and keeps it only when the SHA-256 and the declared format match:
READY, or FAILED with the reason and nothing kept. --wait polls until then
(--timeout bounds each poll, not the wait). Adding the same image again is no
change.`,
		Args: argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			f, err := parseOSImageFormat(format)
			if err != nil {
				return err
			}
			if url == "" || sum == "" {
				return usageErrorf("add needs --url URL and --sha256 HEX")
			}
			ann, labels, err := meta.parse("")
			if err != nil {
				return err
			}
			req := &osimagev1.RegisterOSImageRequest{Name: args[0], SourceUrl: url, Sha256: strings.ToLower(sum), Format: f, Annotations: ann, Labels: labels}
			var im *osimagev1.OSImage
			if err := inv.rpc(cmd, "add "+osImageKind.subject(args[0]), func(ctx context.Context, cc *grpc.ClientConn) error {
				resp, err := osimagev1.NewOSImageServiceClient(cc).RegisterOSImage(ctx, req)
				im = resp.GetOsImage()
				return err
			}); err != nil {
				return err
			}
			if wait {
				if im, err = inv.waitOSImage(cmd, args[0]); err != nil {
					return err
				}
			}
			if err := printRecord(cmd, osImageKind, im, output); err != nil {
				return err
			}
			if wait && im.GetState() == osimagev1.OSImageState_OS_IMAGE_STATE_FAILED {
				return failf("%s FAILED: %s", osImageKind.subject(args[0]), im.GetReason())
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&url, "url", "", "http:// or https:// URL to download the image from")
	cmd.Flags().StringVar(&sum, "sha256", "", "the image file's SHA-256 (64 hex digits)")
	cmd.Flags().StringVar(&format, "format", "", "raw or qcow2 (required: never guessed)")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until the image is READY or FAILED (exit 1 when FAILED)")
	meta.register(cmd, "")
	addOutputFlag(cmd, &output)
	return cmd
}

// waitOSImage polls name until it is READY or FAILED, showing the
// download's progress on stderr.
func (inv *invocation) waitOSImage(cmd *cobra.Command, name string) (*osimagev1.OSImage, error) {
	rep := progress.New(inv.app.rawStderr())
	defer rep.Done()
	staged := false
	for {
		var im *osimagev1.OSImage
		if err := inv.rpc(cmd, "get "+osImageKind.subject(name), func(ctx context.Context, cc *grpc.ClientConn) error {
			resp, err := osimagev1.NewOSImageServiceClient(cc).GetOSImage(ctx, &osimagev1.GetOSImageRequest{Name: name})
			im = resp.GetOsImage()
			return err
		}); err != nil {
			return nil, err
		}
		switch im.GetState() {
		case osimagev1.OSImageState_OS_IMAGE_STATE_READY, osimagev1.OSImageState_OS_IMAGE_STATE_FAILED:
			return im, nil
		case osimagev1.OSImageState_OS_IMAGE_STATE_DOWNLOADING:
			if !staged {
				rep.Stage("download "+name, int64(im.GetSizeBytes()))
				staged = true
			}
			rep.Set(int64(im.GetReceivedBytes()))
		default:
			// PENDING: the download has not started.
		}
		select {
		case <-cmd.Context().Done():
			return nil, failf("waiting for %s: %v", osImageKind.subject(name), cmd.Context().Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (inv *invocation) osImageUploadCommand() *cobra.Command {
	var meta metaFlags
	var output, sum, format string
	cmd := &cobra.Command{
		Use:   "upload NAME FILE --format raw|qcow2 [--sha256 HEX]",
		Short: "Upload FILE as an OS image, checked against its SHA-256 and declared format, and print it",
		Long: `upload streams FILE to the appliance, which keeps it only when its size,
SHA-256 and declared format match: a short, altered or mislabelled upload is
refused and leaves nothing behind. --sha256 is the hash you expect (the file
is then read once); without it the hash of FILE is computed first (read
twice). --timeout bounds each message of the stream, not the whole upload;
progress goes to stderr.`,
		Args: argsBetween(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			f, err := parseOSImageFormat(format)
			if err != nil {
				return err
			}
			ann, labels, err := meta.parse("")
			if err != nil {
				return err
			}
			h := &osimagev1.UploadOSImageHeader{Name: args[0], Sha256: strings.ToLower(sum), Format: f, Annotations: ann, Labels: labels}
			im, err := inv.uploadOSImage(cmd, h, args[1])
			if err != nil {
				return err
			}
			return printRecord(cmd, osImageKind, im, output)
		},
	}
	cmd.Flags().StringVar(&sum, "sha256", "", "the file's expected SHA-256 (default: computed from FILE)")
	cmd.Flags().StringVar(&format, "format", "", "raw or qcow2 (required: never guessed)")
	meta.register(cmd, "")
	addOutputFlag(cmd, &output)
	return cmd
}

// uploadOSImage streams path as the image h declares (its size from the
// file, its hash computed when h has none).
func (inv *invocation) uploadOSImage(cmd *cobra.Command, h *osimagev1.UploadOSImageHeader, path string) (*osimagev1.OSImage, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, fileErrorf("FILE", err)
	}
	defer file.Close()
	st, err := file.Stat()
	if err != nil {
		return nil, fileErrorf("FILE", err)
	}
	if !st.Mode().IsRegular() {
		return nil, usageErrorf("FILE %s is not a regular file", path)
	}
	h.SizeBytes = uint64(st.Size())
	rep := progress.New(inv.app.rawStderr())
	defer rep.Done()
	if h.Sha256 == "" {
		rep.Stage("sha256 of "+path, st.Size())
		hh := sha256.New()
		if _, err := io.Copy(hh, rep.Reader(file)); err != nil {
			return nil, failf("read %s: %v", path, err)
		}
		h.Sha256 = hex.EncodeToString(hh.Sum(nil))
		if _, err := file.Seek(0, io.SeekStart); err != nil {
			return nil, failf("read %s: %v", path, err)
		}
	}
	cc, err := inv.connect(cmd.Flags())
	if err != nil {
		return nil, err
	}
	subject := "upload " + osImageKind.subject(h.GetName())
	ctx, cancel := context.WithCancelCause(cmd.Context())
	defer cancel(nil)
	idle := time.AfterFunc(inv.timeout, func() {
		cancel(fmt.Errorf("corrald took no data for %s (--timeout)", inv.timeout))
	})
	defer idle.Stop()
	stream, err := osimagev1.NewOSImageServiceClient(cc).UploadOSImage(ctx)
	if err != nil {
		return nil, inv.callError(subject, err)
	}
	answer := func(err error) error {
		if c := context.Cause(ctx); c != nil && cmd.Context().Err() == nil {
			return failf("%s: %v", subject, c)
		}
		return inv.callError(subject, err)
	}
	if err := stream.Send(&osimagev1.UploadOSImageRequest{Part: &osimagev1.UploadOSImageRequest_Header{Header: h}}); err != nil {
		_, err = stream.CloseAndRecv()
		return nil, answer(err)
	}
	rep.Stage("upload "+h.GetName(), st.Size())
	buf := make([]byte, osImageChunk)
	for {
		n, rerr := io.ReadFull(file, buf)
		if n > 0 {
			if err := stream.Send(&osimagev1.UploadOSImageRequest{Part: &osimagev1.UploadOSImageRequest_Data{Data: buf[:n]}}); err != nil {
				// The server ended the stream (a refusal): its answer says why.
				_, err = stream.CloseAndRecv()
				return nil, answer(err)
			}
			idle.Reset(inv.timeout)
			rep.Add(int64(n))
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			cancel(rerr)
			return nil, failf("read %s: %v", path, rerr)
		}
	}
	// The server hashes and checks the whole file before it answers.
	idle.Stop()
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return nil, answer(err)
	}
	return resp.GetOsImage(), nil
}

// osImageState is the STATE cell: READY, FAILED, or DOWNLOADING with its
// progress.
func osImageState(im *osimagev1.OSImage) string {
	s := stateName(im.GetState().String(), "OS_IMAGE_STATE_")
	if im.GetState() == osimagev1.OSImageState_OS_IMAGE_STATE_DOWNLOADING && im.GetSizeBytes() > 0 {
		s += fmt.Sprintf(" %d%%", im.GetReceivedBytes()*100/im.GetSizeBytes())
	}
	return s
}

var osImageKind = &kind{
	name:    "os_image",
	columns: []string{"NAME", "STATE", "FORMAT", "SIZE", "SHA256", "SOURCE"},
	row: func(m proto.Message) []string {
		im := m.(*osimagev1.OSImage)
		size := "-"
		if im.GetSizeBytes() > 0 {
			size = humanBytes(im.GetSizeBytes())
		}
		src := im.GetSourceUrl()
		if src == "" {
			src = "(uploaded)"
		}
		return []string{im.GetName(), osImageState(im), strings.ToLower(stateName(im.GetFormat().String(), "OS_IMAGE_FORMAT_")),
			size, cell(im.GetSha256()[:min(12, len(im.GetSha256()))]), src}
	},
	wide: []string{"VIRTUAL-SIZE", "PATH", "REASON", "LABELS"},
	wideRow: func(m proto.Message) []string {
		im := m.(*osimagev1.OSImage)
		vs := "-"
		if im.GetVirtualSizeBytes() > 0 {
			vs = humanBytes(im.GetVirtualSizeBytes())
		}
		return []string{vs, cell(im.GetPath()), cell(im.GetReason()), labelsCell(im.GetLabels())}
	},
	page: func(ctx context.Context, cc grpc.ClientConnInterface, q pageQuery) ([]proto.Message, string, error) {
		resp, err := osimagev1.NewOSImageServiceClient(cc).ListOSImages(ctx, &osimagev1.ListOSImagesRequest{PageSize: q.size, PageToken: q.token})
		return messages(resp.GetOsImages()), resp.GetNextPageToken(), err
	},
	get: func(ctx context.Context, cc grpc.ClientConnInterface, name string) (proto.Message, error) {
		resp, err := osimagev1.NewOSImageServiceClient(cc).GetOSImage(ctx, &osimagev1.GetOSImageRequest{Name: name})
		if err != nil {
			return nil, err
		}
		return resp.GetOsImage(), nil
	},
	del: func(ctx context.Context, cc grpc.ClientConnInterface, name string) error {
		_, err := osimagev1.NewOSImageServiceClient(cc).DeleteOSImage(ctx, &osimagev1.DeleteOSImageRequest{Name: name})
		return err
	},
}
