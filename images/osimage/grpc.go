package osimage

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc"

	osimagev1 "github.com/corralhq/corral/api/osimage/v1"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/internal/paging"
)

// MaxChunk is the most data one upload message may carry.
const MaxChunk = 256 << 10

// server is OSImageService: the gRPC edge of a Service. Errors become
// status codes here only (apierr.ToStatus).
type server struct {
	osimagev1.UnimplementedOSImageServiceServer
	s *Service
}

// Register serves s as OSImageService on r.
func Register(r grpc.ServiceRegistrar, s *Service) {
	osimagev1.RegisterOSImageServiceServer(r, &server{s: s})
}

func (e *server) RegisterOSImage(ctx context.Context, req *osimagev1.RegisterOSImageRequest) (*osimagev1.RegisterOSImageResponse, error) {
	im, err := e.s.Register(ctx, req)
	if err != nil {
		return nil, apierr.ToStatus(err)
	}
	return &osimagev1.RegisterOSImageResponse{OsImage: im}, nil
}

func (e *server) GetOSImage(ctx context.Context, req *osimagev1.GetOSImageRequest) (*osimagev1.GetOSImageResponse, error) {
	im, err := e.s.Get(ctx, req.GetName())
	if err != nil {
		return nil, apierr.ToStatus(err)
	}
	return &osimagev1.GetOSImageResponse{OsImage: im}, nil
}

func (e *server) ListOSImages(ctx context.Context, req *osimagev1.ListOSImagesRequest) (*osimagev1.ListOSImagesResponse, error) {
	l, err := e.s.List(ctx)
	if err != nil {
		return nil, apierr.ToStatus(err)
	}
	paging.SortByKey(l, (*osimagev1.OSImage).GetName)
	page, next, err := paging.Slice(l, (*osimagev1.OSImage).GetName, req.GetPageSize(), req.GetPageToken(), paging.Fingerprint())
	if err != nil {
		return nil, apierr.ToStatus(err)
	}
	return &osimagev1.ListOSImagesResponse{OsImages: page, NextPageToken: next}, nil
}

func (e *server) DeleteOSImage(ctx context.Context, req *osimagev1.DeleteOSImageRequest) (*osimagev1.DeleteOSImageResponse, error) {
	if err := e.s.Delete(ctx, req.GetName()); err != nil {
		return nil, apierr.ToStatus(err)
	}
	return &osimagev1.DeleteOSImageResponse{}, nil
}

// UploadOSImage reads the header, then the bytes, and answers once the
// image is stored (or refused: nothing is kept).
func (e *server) UploadOSImage(stream grpc.ClientStreamingServer[osimagev1.UploadOSImageRequest, osimagev1.UploadOSImageResponse]) error {
	first, err := stream.Recv()
	if errors.Is(err, io.EOF) {
		return apierr.ToStatus(apierr.Invalidf("UploadOSImage: the stream ended before the header"))
	}
	if err != nil {
		return err
	}
	h := first.GetHeader()
	if h == nil {
		return apierr.ToStatus(apierr.Invalidf("UploadOSImage: the first message must be the header"))
	}
	im, err := e.s.Upload(stream.Context(), h, &uploadReader{recv: stream.Recv})
	if err != nil {
		return apierr.ToStatus(err)
	}
	return stream.SendAndClose(&osimagev1.UploadOSImageResponse{OsImage: im})
}

// uploadReader reads an upload's data messages as bytes; a second header
// or an oversized chunk is an error, the client's CloseSend is io.EOF.
type uploadReader struct {
	recv func() (*osimagev1.UploadOSImageRequest, error)
	buf  []byte
}

func (r *uploadReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		m, err := r.recv()
		if err != nil {
			return 0, err
		}
		if m.GetHeader() != nil {
			return 0, apierr.Invalidf("UploadOSImage: a second header in the stream")
		}
		if len(m.GetData()) > MaxChunk {
			return 0, apierr.Invalidf("UploadOSImage: a chunk of %d bytes; at most %d", len(m.GetData()), MaxChunk)
		}
		r.buf = m.GetData()
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}
