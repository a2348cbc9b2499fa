package cli

import (
	"context"
	"encoding/hex"
	"fmt"
	"net/url"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
)

// Block storage annotation keys (see vm.go).
const (
	annBSRequestNode    = "n0core/provisioning/block_storage/request_node_name"
	annBSUsedBy         = "corral/used_by"
	annBSProtectedBy    = "corral/protected_by"
	annBSBackingForPref = "corral/backing_for/"
)

// bsCommand groups the block storage verbs.
func (inv *invocation) bsCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "bs VERB",
		Aliases: []string{"block_storage", "block-storage", "block_storages"},
		Short:   "Create, fetch, copy, resize, delete, undelete and purge block storages (qcow2 volumes on nodes)",
		Args:    cobra.ArbitraryArgs,
		RunE:    groupRunE,
	}
	cmd.AddCommand(
		inv.bsCreateCommand(),
		inv.bsFetchCommand(),
		inv.bsCopyCommand(),
		inv.bsResizeCommand(),
		inv.bsStateCommand("delete", "Soft-delete a block storage (undelete or purge it later) and print it",
			func(ctx context.Context, c provisioningv1.BlockStorageServiceClient, name string) (*provisioningv1.BlockStorage, error) {
				return c.DeleteBlockStorage(ctx, &provisioningv1.DeleteBlockStorageRequest{Name: name})
			}),
		inv.bsStateCommand("undelete", "Bring a soft-deleted block storage back and print it",
			func(ctx context.Context, c provisioningv1.BlockStorageServiceClient, name string) (*provisioningv1.BlockStorage, error) {
				return c.UndeleteBlockStorage(ctx, &provisioningv1.UndeleteBlockStorageRequest{Name: name})
			}),
		inv.bsPurgeCommand(),
	)
	return cmd
}

// bsSizeFlags are --request-bytes and --limit-bytes.
type bsSizeFlags struct {
	request, limit uint64
}

func (f *bsSizeFlags) register(cmd *cobra.Command, limitHelp, requestHelp string) {
	cmd.Flags().Var(sizeValue{&f.limit}, "limit-bytes", limitHelp)
	cmd.Flags().Var(sizeValue{&f.request}, "request-bytes", requestHelp)
}

// sizes returns (request, limit), the request defaulting to the limit.
func (f *bsSizeFlags) sizes(cmd *cobra.Command) (uint64, uint64) {
	return requestOr(cmd, "request-bytes", f.request, f.limit), f.limit
}

// bsCreateFlags are the flags shared by create, fetch and copy.
type bsCreateFlags struct {
	bsSizeFlags
	meta   metaFlags
	output string
}

func (f *bsCreateFlags) register(cmd *cobra.Command, limitHelp, requestHelp string) {
	f.bsSizeFlags.register(cmd, limitHelp, requestHelp)
	f.meta.register(cmd, "node to place the volume on (sets the "+annBSRequestNode+" annotation)")
	addOutputFlag(cmd, &f.output)
}

// bsCreateRPC checks the flags and runs one creating call, printing the new
// block storage.
func (inv *invocation) bsCreateRPC(cmd *cobra.Command, f *bsCreateFlags, name, what string,
	call func(ctx context.Context, c provisioningv1.BlockStorageServiceClient, ann, labels map[string]string) (*provisioningv1.BlockStorage, error)) error {
	if err := checkFormat(f.output); err != nil {
		return err
	}
	ann, labels, err := f.meta.parse(annBSRequestNode)
	if err != nil {
		return err
	}
	var bs *provisioningv1.BlockStorage
	if err := inv.rpc(cmd, what+" "+blockStorageKind.subject(name), func(ctx context.Context, cc *grpc.ClientConn) (err error) {
		bs, err = call(ctx, provisioningv1.NewBlockStorageServiceClient(cc), ann, labels)
		return err
	}); err != nil {
		return err
	}
	return printRecord(cmd, blockStorageKind, bs, f.output)
}

const sizeHelp = "bytes or a size such as 20GiB, 100G (=100*10^9)"

func (inv *invocation) bsCreateCommand() *cobra.Command {
	var f bsCreateFlags
	cmd := &cobra.Command{
		Use:   "create NAME --limit-bytes SIZE [--request-bytes SIZE] [--node NODE]",
		Short: "Create an empty volume and print it",
		Args:  argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req, lim := f.sizes(cmd)
			if lim == 0 {
				return usageErrorf("--limit-bytes must be positive")
			}
			return inv.bsCreateRPC(cmd, &f, args[0], "create", func(ctx context.Context, c provisioningv1.BlockStorageServiceClient, ann, labels map[string]string) (*provisioningv1.BlockStorage, error) {
				return c.CreateBlockStorage(ctx, &provisioningv1.CreateBlockStorageRequest{
					Name: args[0], Annotations: ann, Labels: labels, RequestBytes: req, LimitBytes: lim,
				})
			})
		},
	}
	f.register(cmd, "volume size: "+sizeHelp, "storage to book on the node (default: the limit)")
	markRequired(cmd, "limit-bytes")
	return cmd
}

// checkFetchURL accepts absolute http and https URLs.
func checkFetchURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return usageErrorf("--url %q: want an absolute http or https URL", s)
	}
	return nil
}

func (inv *invocation) bsFetchCommand() *cobra.Command {
	var f bsCreateFlags
	var src, sum string
	cmd := &cobra.Command{
		Use:   "fetch NAME --url URL --limit-bytes SIZE [--sha256 HEX] [--request-bytes SIZE] [--node NODE]",
		Short: "Download an image (qcow2 or raw) from an http(s) URL into a new volume and print it",
		Long: `fetch makes the node download URL into a new volume of --limit-bytes (also
the most it will download), checking its SHA-256 when --sha256 is given.
Large downloads may need a longer --timeout.`,
		Args: argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFetchURL(src); err != nil {
				return err
			}
			if sum != "" {
				if b, err := hex.DecodeString(sum); err != nil || len(b) != 32 {
					return usageErrorf("--sha256 %q: want 64 hexadecimal digits", sum)
				}
			}
			req, lim := f.sizes(cmd)
			if lim == 0 {
				return usageErrorf("--limit-bytes must be positive")
			}
			return inv.bsCreateRPC(cmd, &f, args[0], "fetch", func(ctx context.Context, c provisioningv1.BlockStorageServiceClient, ann, labels map[string]string) (*provisioningv1.BlockStorage, error) {
				return c.FetchBlockStorage(ctx, &provisioningv1.FetchBlockStorageRequest{
					Name: args[0], Annotations: ann, Labels: labels, RequestBytes: req, LimitBytes: lim,
					SourceUrl: src, SourceSha256: strings.ToLower(sum),
				})
			})
		},
	}
	cmd.Flags().StringVar(&src, "url", "", "http or https URL to download")
	cmd.Flags().StringVar(&sum, "sha256", "", "expected SHA-256 of the download, in hex")
	f.register(cmd, "volume size and download limit: "+sizeHelp, "storage to book on the node (default: the limit)")
	markRequired(cmd, "url", "limit-bytes")
	return cmd
}

func (inv *invocation) bsCopyCommand() *cobra.Command {
	var f bsCreateFlags
	cmd := &cobra.Command{
		Use:   "copy SOURCE NAME [--limit-bytes SIZE] [--request-bytes SIZE]",
		Short: "Make NAME a copy-on-write copy of block storage SOURCE (on SOURCE's node) and print it",
		Long: `copy makes NAME an overlay backed by SOURCE's volume: instant, whatever the
size. SOURCE cannot be attached, resized or purged while a copy exists.
Sizes default to SOURCE's; the limit may grow, never shrink.`,
		Args: argsBetween(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			req, lim := f.sizes(cmd)
			return inv.bsCreateRPC(cmd, &f, args[1], "copy "+args[0]+" to", func(ctx context.Context, c provisioningv1.BlockStorageServiceClient, ann, labels map[string]string) (*provisioningv1.BlockStorage, error) {
				return c.CopyBlockStorage(ctx, &provisioningv1.CopyBlockStorageRequest{
					Name: args[1], Annotations: ann, Labels: labels, RequestBytes: req, LimitBytes: lim,
					SourceBlockStorage: args[0],
				})
			})
		},
	}
	f.register(cmd, "volume size: "+sizeHelp+" (default: the source's)", "storage to book on the node (default: the limit, or the source's)")
	return cmd
}

func (inv *invocation) bsResizeCommand() *cobra.Command {
	var f bsSizeFlags
	var output string
	cmd := &cobra.Command{
		Use:   "resize NAME [--limit-bytes SIZE] [--request-bytes SIZE]",
		Short: "Grow an AVAILABLE volume or change its booked storage, and print it",
		Long: `resize sets the volume's size (--limit-bytes; it can only grow) and/or the
storage booked for it (--request-bytes); a size not given is kept. The
record's annotations and labels are kept.`,
		Args: argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			if !cmd.Flags().Changed("limit-bytes") && !cmd.Flags().Changed("request-bytes") {
				return usageErrorf("give --limit-bytes, --request-bytes or both")
			}
			if (cmd.Flags().Changed("limit-bytes") && f.limit == 0) || (cmd.Flags().Changed("request-bytes") && f.request == 0) {
				return usageErrorf("sizes must be positive")
			}
			var bs *provisioningv1.BlockStorage
			if err := inv.rpc(cmd, "resize "+blockStorageKind.subject(args[0]), func(ctx context.Context, cc *grpc.ClientConn) error {
				c := provisioningv1.NewBlockStorageServiceClient(cc)
				// UpdateBlockStorage replaces annotations and labels:
				// send the current ones back.
				cur, err := c.GetBlockStorage(ctx, &provisioningv1.GetBlockStorageRequest{Name: args[0]})
				if err != nil {
					return err
				}
				bs, err = c.UpdateBlockStorage(ctx, &provisioningv1.UpdateBlockStorageRequest{
					Name: args[0], Annotations: cur.GetAnnotations(), Labels: cur.GetLabels(),
					RequestBytes: f.request, LimitBytes: f.limit,
				})
				return err
			}); err != nil {
				return err
			}
			return printRecord(cmd, blockStorageKind, bs, output)
		},
	}
	f.register(cmd, "new volume size: "+sizeHelp, "new storage to book on the node")
	addOutputFlag(cmd, &output)
	return cmd
}

// bsStateCommand is delete or undelete: one call returning the record.
func (inv *invocation) bsStateCommand(verb, short string,
	call func(ctx context.Context, c provisioningv1.BlockStorageServiceClient, name string) (*provisioningv1.BlockStorage, error)) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   verb + " NAME",
		Short: short,
		Args:  argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			var bs *provisioningv1.BlockStorage
			if err := inv.rpc(cmd, verb+" "+blockStorageKind.subject(args[0]), func(ctx context.Context, cc *grpc.ClientConn) (err error) {
				bs, err = call(ctx, provisioningv1.NewBlockStorageServiceClient(cc), args[0])
				return err
			}); err != nil {
				return err
			}
			return printRecord(cmd, blockStorageKind, bs, output)
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

func (inv *invocation) bsPurgeCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "purge NAME",
		Short: "Remove a soft-deleted block storage for good: its volume and its booked storage",
		Args:  argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := inv.rpc(cmd, "purge "+blockStorageKind.subject(args[0]), func(ctx context.Context, cc *grpc.ClientConn) error {
				_, err := provisioningv1.NewBlockStorageServiceClient(cc).PurgeBlockStorage(ctx, &provisioningv1.PurgeBlockStorageRequest{Name: args[0]})
				return err
			}); err != nil {
				return err
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "%s/%s purged\n", blockStorageKind.name, args[0])
			return writeErr(err)
		},
	}
}

// bsUsedBy names what holds a block storage: "vm/NAME" (IN_USE),
// "image/NAME" (PROTECTED), "copy/NAME" (copy-on-write overlays it backs).
func bsUsedBy(bs *provisioningv1.BlockStorage) string {
	ann := bs.GetAnnotations()
	var out []string
	if v := ann[annBSUsedBy]; v != "" {
		out = append(out, "vm/"+v)
	}
	if v := ann[annBSProtectedBy]; v != "" {
		out = append(out, "image/"+v)
	}
	var copies []string
	for k := range ann {
		if o, ok := strings.CutPrefix(k, annBSBackingForPref); ok && o != "" {
			copies = append(copies, "copy/"+o)
		}
	}
	sort.Strings(copies)
	out = append(out, copies...)
	return cell(strings.Join(out, ","))
}

// sizePair renders a request/limit pair of byte sizes, once when equal.
func sizePair(request, limit uint64) string {
	if request == limit {
		return humanBytes(limit)
	}
	return humanBytes(request) + "/" + humanBytes(limit)
}
