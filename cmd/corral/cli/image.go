package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	deploymentv1 "github.com/corralhq/corral/api/deployment/v1"
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
)

// imageCommand groups the image verbs.
func (inv *invocation) imageCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "image VERB",
		Aliases: []string{"images"},
		Short:   "Images: named, tagged sets of protected block storages that new volumes are generated from",
		Args:    cobra.ArbitraryArgs,
		RunE:    groupRunE,
	}
	cmd.AddCommand(
		inv.imageApplyCommand(),
		inv.imageDeleteCommand(),
		inv.imageRegisterCommand(),
		inv.imageRecordCommand("unregister IMAGE BLOCK_STORAGE",
			"Remove a block storage (and its tags) from an image (it becomes AVAILABLE) and print the image", 2,
			func(args []string) string { return fmt.Sprintf("unregister block_storage %q from", args[1]) },
			func(ctx context.Context, c deploymentv1.ImageServiceClient, args []string) (*deploymentv1.Image, error) {
				return c.UnregisterBlockStorage(ctx, &deploymentv1.UnregisterBlockStorageRequest{ImageName: args[0], BlockStorageName: args[1]})
			}),
		inv.imageRecordCommand("tag IMAGE TAG BLOCK_STORAGE",
			"Point TAG of an image at one of its registered block storages and print the image", 3,
			func(args []string) string { return fmt.Sprintf("tag %q of", args[1]) },
			func(ctx context.Context, c deploymentv1.ImageServiceClient, args []string) (*deploymentv1.Image, error) {
				return c.TagImage(ctx, &deploymentv1.TagImageRequest{Name: args[0], Tag: args[1], RegisteredBlockStorageName: args[2]})
			}),
		inv.imageRecordCommand("untag IMAGE TAG",
			"Remove TAG from an image and print the image", 2,
			func(args []string) string { return fmt.Sprintf("untag %q of", args[1]) },
			func(ctx context.Context, c deploymentv1.ImageServiceClient, args []string) (*deploymentv1.Image, error) {
				return c.UntagImage(ctx, &deploymentv1.UntagImageRequest{Name: args[0], Tag: args[1]})
			}),
		inv.imageGenerateCommand(),
	)
	return cmd
}

// imageRecordCommand is a verb IMAGE ... of nargs arguments that makes one
// call returning the image and prints it; what(args) prefixes the image
// in error messages.
func (inv *invocation) imageRecordCommand(use, short string, nargs int, what func(args []string) string,
	call func(ctx context.Context, c deploymentv1.ImageServiceClient, args []string) (*deploymentv1.Image, error)) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  argsBetween(nargs, nargs),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			var im *deploymentv1.Image
			if err := inv.rpc(cmd, what(args)+" "+imageKind.subject(args[0]), func(ctx context.Context, cc *grpc.ClientConn) (err error) {
				im, err = call(ctx, deploymentv1.NewImageServiceClient(cc), args)
				return err
			}); err != nil {
				return err
			}
			return printRecord(cmd, imageKind, im, output)
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

func (inv *invocation) imageRegisterCommand() *cobra.Command {
	var tags []string
	cmd := inv.imageRecordCommand("register IMAGE BLOCK_STORAGE [--tag TAG]...",
		"Register an AVAILABLE block storage in an image (it becomes PROTECTED), optionally tagging it, and print the image", 2,
		func(args []string) string { return fmt.Sprintf("register block_storage %q in", args[1]) },
		func(ctx context.Context, c deploymentv1.ImageServiceClient, args []string) (*deploymentv1.Image, error) {
			return c.RegisterBlockStorage(ctx, &deploymentv1.RegisterBlockStorageRequest{ImageName: args[0], BlockStorageName: args[1], Tags: tags})
		})
	cmd.Flags().StringArrayVar(&tags, "tag", nil, "tag to point at the block storage (repeatable)")
	return cmd
}

func (inv *invocation) imageApplyCommand() *cobra.Command {
	var meta metaFlags
	var output string
	cmd := &cobra.Command{
		Use:   "apply NAME [--annotation K=V]... [--label K=V]...",
		Short: "Create an image, or set its annotations and labels, and print it",
		Args:  argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			ann, labels, err := meta.parse("")
			if err != nil {
				return err
			}
			var im *deploymentv1.Image
			if err := inv.rpc(cmd, "apply "+imageKind.subject(args[0]), func(ctx context.Context, cc *grpc.ClientConn) (err error) {
				im, err = deploymentv1.NewImageServiceClient(cc).ApplyImage(ctx, &deploymentv1.ApplyImageRequest{Name: args[0], Annotations: ann, Labels: labels})
				return err
			}); err != nil {
				return err
			}
			return printRecord(cmd, imageKind, im, output)
		},
	}
	meta.register(cmd, "")
	addOutputFlag(cmd, &output)
	return cmd
}

func (inv *invocation) imageDeleteCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete an image; its block storages become AVAILABLE again",
		Args:  argsBetween(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := inv.rpc(cmd, "delete "+imageKind.subject(args[0]), func(ctx context.Context, cc *grpc.ClientConn) error {
				_, err := deploymentv1.NewImageServiceClient(cc).DeleteImage(ctx, &deploymentv1.DeleteImageRequest{Name: args[0]})
				return err
			}); err != nil {
				return err
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "%s/%s deleted\n", imageKind.name, args[0])
			return writeErr(err)
		},
	}
}

func (inv *invocation) imageGenerateCommand() *cobra.Command {
	var sizes bsSizeFlags
	var meta metaFlags
	var output string
	cmd := &cobra.Command{
		Use:   "generate IMAGE TAG NAME [--limit-bytes SIZE] [--request-bytes SIZE]",
		Short: "Create block storage NAME as a copy-on-write copy of the block storage IMAGE's TAG points at, and print it",
		Long: `generate makes NAME an overlay of the tagged block storage, on its node:
instant, whatever the size. Sizes default to the source's; the limit may
grow, never shrink.`,
		Args: argsBetween(3, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output); err != nil {
				return err
			}
			ann, labels, err := meta.parse("")
			if err != nil {
				return err
			}
			req, lim := sizes.sizes(cmd)
			var bs *provisioningv1.BlockStorage
			subject := fmt.Sprintf("generate %s from %s tag %q", blockStorageKind.subject(args[2]), imageKind.subject(args[0]), args[1])
			if err := inv.rpc(cmd, subject, func(ctx context.Context, cc *grpc.ClientConn) (err error) {
				bs, err = deploymentv1.NewImageServiceClient(cc).GenerateBlockStorage(ctx, &deploymentv1.GenerateBlockStorageRequest{
					ImageName: args[0], Tag: args[1], BlockStorageName: args[2],
					Annotations: ann, Labels: labels, RequestBytes: req, LimitBytes: lim,
				})
				return err
			}); err != nil {
				return err
			}
			return printRecord(cmd, blockStorageKind, bs, output)
		},
	}
	sizes.register(cmd, "volume size: "+sizeHelp+" (default: the source's)", "storage to book on the node (default: the limit, or the source's)")
	meta.register(cmd, "")
	addOutputFlag(cmd, &output)
	return cmd
}
