package appliance

import (
	"context"
	"errors"
	"maps"
	"regexp"
	"slices"
	"time"

	deploymentv1 "github.com/corralhq/corral/api/deployment/v1"
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store"
	"github.com/corralhq/corral/store/record"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func newImage() *deploymentv1.Image { return &deploymentv1.Image{} }

var tagRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$`)

func checkTag(tag string) error {
	if !tagRE.MatchString(tag) {
		return apierr.Invalidf("tag %q is malformed: use 1-128 letters, digits, '.', '_' or '-'", tag)
	}
	return nil
}

// GetImage returns one image.
func (s *Services) GetImage(ctx context.Context, name string) (*deploymentv1.Image, error) {
	if err := checkName("name", name); err != nil {
		return nil, err
	}
	im := newImage()
	if _, err := record.Get(ctx, s.cfg.Store, imagePrefix+name, im); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, apierr.NotFoundf("image %q", name)
		}
		return nil, err
	}
	return im, nil
}

// ListImages returns every image in name order.
func (s *Services) ListImages(ctx context.Context) ([]*deploymentv1.Image, error) {
	return record.List(ctx, s.cfg.Store, imagePrefix, newImage)
}

// ApplyImage creates an image or replaces its annotations and labels.
func (s *Services) ApplyImage(ctx context.Context, req *deploymentv1.ApplyImageRequest) (*deploymentv1.Image, error) {
	if err := checkName("name", req.GetName()); err != nil {
		return nil, err
	}
	if err := checkUserMeta(req.GetAnnotations(), req.GetLabels()); err != nil {
		return nil, err
	}
	return record.Update(ctx, s.cfg.Store, imagePrefix+req.GetName(), newImage, func(im *deploymentv1.Image, exists bool) (bool, error) {
		im.Name = req.GetName()
		im.Annotations = mergeUserAnnotations(im.GetAnnotations(), req.GetAnnotations())
		im.Labels = maps.Clone(req.GetLabels())
		return false, nil
	})
}

// DeleteImage removes the image and sets its registered block storages
// back to AVAILABLE (a failure there is left to the reconciler).
func (s *Services) DeleteImage(ctx context.Context, name string) error {
	if err := checkName("name", name); err != nil {
		return err
	}
	im, err := record.Update(ctx, s.cfg.Store, imagePrefix+name, newImage, func(im *deploymentv1.Image, exists bool) (bool, error) {
		if !exists {
			return false, apierr.NotFoundf("image %q", name)
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range im.GetRegisteredBlockStorages() {
		errs = append(errs, s.unprotect(ctx, r.GetBlockStorageName(), name))
	}
	if err := errors.Join(errs...); err != nil {
		s.log.Warn("image deleted but some block storages stay PROTECTED; the reconciler will release them", "image", name, "err", err.Error())
	}
	return nil
}

// protect is AVAILABLE → PROTECTED for image (idempotent for the same
// image).
func (s *Services) protect(ctx context.Context, bsName, image string) error {
	_, err := record.Update(ctx, s.cfg.Store, bsPrefix+bsName, newBS, func(bs *provisioningv1.BlockStorage, exists bool) (bool, error) {
		if !exists {
			return false, apierr.NotFoundf("block storage %q", bsName)
		}
		switch bs.GetState() {
		case bsAvailable:
		case bsProtected:
			if bs.GetAnnotations()[AnnotationProtectedBy] == image {
				return false, errNoChange
			}
			return false, apierr.Preconditionf("block storage %q is already registered in image %q", bsName, bs.GetAnnotations()[AnnotationProtectedBy])
		case bsPending:
			return false, s.pendingErr(bsKind, bsName, bs.GetAnnotations())
		case bsInUse:
			return false, apierr.Preconditionf("block storage %q is IN_USE by virtual machine %q: it cannot be registered", bsName, bs.GetAnnotations()[AnnotationUsedBy])
		default:
			return false, apierr.Preconditionf("block storage %q is %s, not AVAILABLE", bsName, bs.GetState())
		}
		if bs.Annotations == nil {
			bs.Annotations = map[string]string{}
		}
		bs.State = bsProtected
		bs.Annotations[AnnotationProtectedBy] = image
		bs.Annotations[AnnotationProtectedAt] = s.cfg.Now().UTC().Format(time.RFC3339Nano)
		return false, nil
	})
	if errors.Is(err, errNoChange) {
		return nil
	}
	return err
}

// unprotect is PROTECTED (by image) → AVAILABLE; anything else is left.
func (s *Services) unprotect(ctx context.Context, bsName, image string) error {
	_, err := record.Update(ctx, s.cfg.Store, bsPrefix+bsName, newBS, func(bs *provisioningv1.BlockStorage, exists bool) (bool, error) {
		if !exists || bs.GetState() != bsProtected || bs.GetAnnotations()[AnnotationProtectedBy] != image {
			return false, errNoChange
		}
		bs.State = bsAvailable
		delete(bs.Annotations, AnnotationProtectedBy)
		delete(bs.Annotations, AnnotationProtectedAt)
		return false, nil
	})
	if errors.Is(err, errNoChange) {
		return nil
	}
	return err
}

// RegisterBlockStorage registers an AVAILABLE block storage in an image
// (it becomes PROTECTED) and points tags at it.
func (s *Services) RegisterBlockStorage(ctx context.Context, req *deploymentv1.RegisterBlockStorageRequest) (*deploymentv1.Image, error) {
	image, bsName := req.GetImageName(), req.GetBlockStorageName()
	if err := checkName("image_name", image); err != nil {
		return nil, err
	}
	if err := checkName("block_storage_name", bsName); err != nil {
		return nil, err
	}
	for _, t := range req.GetTags() {
		if err := checkTag(t); err != nil {
			return nil, err
		}
	}
	if _, err := s.GetImage(ctx, image); err != nil {
		return nil, err
	}
	if err := s.protect(ctx, bsName, image); err != nil {
		return nil, err
	}
	now := timestamppb.New(s.cfg.Now())
	im, err := record.Update(ctx, s.cfg.Store, imagePrefix+image, newImage, func(im *deploymentv1.Image, exists bool) (bool, error) {
		if !exists {
			return false, apierr.NotFoundf("image %q", image)
		}
		if !slices.ContainsFunc(im.GetRegisteredBlockStorages(), func(r *deploymentv1.Image_RegisteredBlockStorage) bool { return r.GetBlockStorageName() == bsName }) {
			im.RegisteredBlockStorages = append(im.RegisteredBlockStorages, &deploymentv1.Image_RegisteredBlockStorage{BlockStorageName: bsName, RegisteredAt: now})
		}
		if len(req.GetTags()) > 0 && im.Tags == nil {
			im.Tags = map[string]string{}
		}
		for _, t := range req.GetTags() {
			im.Tags[t] = bsName
		}
		return false, nil
	})
	if err != nil {
		cctx, cancel := s.cleanupContext(ctx)
		defer cancel()
		if uerr := s.unprotect(cctx, bsName, image); uerr != nil {
			s.log.Log(cctx, LevelCritical, "compensation failed", "kind", "image", "name", image, "step", "unprotect "+bsName, "err", uerr.Error())
		}
		return nil, err
	}
	return im, nil
}

// UnregisterBlockStorage removes a block storage (and the tags pointing at
// it) from an image and sets it AVAILABLE.
func (s *Services) UnregisterBlockStorage(ctx context.Context, req *deploymentv1.UnregisterBlockStorageRequest) (*deploymentv1.Image, error) {
	image, bsName := req.GetImageName(), req.GetBlockStorageName()
	if err := checkName("image_name", image); err != nil {
		return nil, err
	}
	if err := checkName("block_storage_name", bsName); err != nil {
		return nil, err
	}
	im, err := record.Update(ctx, s.cfg.Store, imagePrefix+image, newImage, func(im *deploymentv1.Image, exists bool) (bool, error) {
		if !exists {
			return false, apierr.NotFoundf("image %q", image)
		}
		i := slices.IndexFunc(im.GetRegisteredBlockStorages(), func(r *deploymentv1.Image_RegisteredBlockStorage) bool { return r.GetBlockStorageName() == bsName })
		if i < 0 {
			return false, apierr.NotFoundf("block storage %q is not registered in image %q", bsName, image)
		}
		im.RegisteredBlockStorages = slices.Delete(im.RegisteredBlockStorages, i, i+1)
		for t, target := range im.Tags {
			if target == bsName {
				delete(im.Tags, t)
			}
		}
		return false, nil
	})
	if err != nil {
		return nil, err
	}
	if err := s.unprotect(ctx, bsName, image); err != nil {
		s.log.Warn("unregistered block storage stays PROTECTED; the reconciler will release it", "image", image, "block_storage", bsName, "err", err.Error())
	}
	return im, nil
}

// TagImage points tag at a registered block storage.
func (s *Services) TagImage(ctx context.Context, req *deploymentv1.TagImageRequest) (*deploymentv1.Image, error) {
	name, tag, target := req.GetName(), req.GetTag(), req.GetRegisteredBlockStorageName()
	if err := checkName("name", name); err != nil {
		return nil, err
	}
	if err := checkTag(tag); err != nil {
		return nil, err
	}
	return record.Update(ctx, s.cfg.Store, imagePrefix+name, newImage, func(im *deploymentv1.Image, exists bool) (bool, error) {
		if !exists {
			return false, apierr.NotFoundf("image %q", name)
		}
		if !slices.ContainsFunc(im.GetRegisteredBlockStorages(), func(r *deploymentv1.Image_RegisteredBlockStorage) bool { return r.GetBlockStorageName() == target }) {
			return false, apierr.NotFoundf("block storage %q is not registered in image %q", target, name)
		}
		if im.Tags == nil {
			im.Tags = map[string]string{}
		}
		im.Tags[tag] = target
		return false, nil
	})
}

// UntagImage removes a tag.
func (s *Services) UntagImage(ctx context.Context, req *deploymentv1.UntagImageRequest) (*deploymentv1.Image, error) {
	name, tag := req.GetName(), req.GetTag()
	if err := checkName("name", name); err != nil {
		return nil, err
	}
	return record.Update(ctx, s.cfg.Store, imagePrefix+name, newImage, func(im *deploymentv1.Image, exists bool) (bool, error) {
		if !exists {
			return false, apierr.NotFoundf("image %q", name)
		}
		if _, ok := im.GetTags()[tag]; !ok {
			return false, apierr.NotFoundf("image %q has no tag %q", name, tag)
		}
		delete(im.Tags, tag)
		return false, nil
	})
}

// GenerateBlockStorage makes a copy-on-write overlay of the block storage
// the tag points at, on that block storage's node.
func (s *Services) GenerateBlockStorage(ctx context.Context, req *deploymentv1.GenerateBlockStorageRequest) (*provisioningv1.BlockStorage, error) {
	im, err := s.GetImage(ctx, req.GetImageName())
	if err != nil {
		return nil, err
	}
	target, ok := im.GetTags()[req.GetTag()]
	if !ok {
		return nil, apierr.NotFoundf("image %q has no tag %q", req.GetImageName(), req.GetTag())
	}
	src, err := s.GetBlockStorage(ctx, target)
	if err != nil {
		return nil, err
	}
	return s.createOverlay(ctx, "generate", req.GetBlockStorageName(), req.GetAnnotations(), req.GetLabels(), req.GetRequestBytes(), req.GetLimitBytes(), src,
		map[string]string{AnnotationCopyFrom: target})
}

// orphanProtectGrace is how long a PROTECTED block storage may wait for
// its image record to list it (the gap between the two CAS writes of
// RegisterBlockStorage).
const orphanProtectGrace = time.Minute
