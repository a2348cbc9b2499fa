package osimage

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	osimagev1 "github.com/corralhq/corral/api/osimage/v1"
	"github.com/corralhq/corral/images"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/store/mem"
)

const (
	raw   = osimagev1.OSImageFormat_OS_IMAGE_FORMAT_RAW
	qcow2 = osimagev1.OSImageFormat_OS_IMAGE_FORMAT_QCOW2
)

func sum(b []byte) string { h := sha256.Sum256(b); return hex.EncodeToString(h[:]) }

// qcow2File is a minimal qcow2 version 3 header (what checkQCOW2 reads)
// for a disk of virtual bytes, padded with pad bytes of data.
func qcow2File(virtual uint64, pad int) []byte {
	b := make([]byte, qcow2V3Header+pad)
	copy(b, qcow2Magic)
	be := binary.BigEndian
	be.PutUint32(b[4:], 3)
	be.PutUint32(b[20:], 16)
	be.PutUint64(b[24:], virtual)
	be.PutUint32(b[100:], qcow2V3Header)
	for i := qcow2V3Header; i < len(b); i++ {
		b[i] = byte(i)
	}
	return b
}

func TestCheckQCOW2(t *testing.T) {
	good := qcow2File(1<<30, 0)
	set := func(off int, v uint64, width int) []byte {
		b := bytes.Clone(good)
		if width == 4 {
			binary.BigEndian.PutUint32(b[off:], uint32(v))
		} else {
			binary.BigEndian.PutUint64(b[off:], v)
		}
		return b
	}
	v2 := set(4, 2, 4)[:qcow2V2Header]
	for name, tc := range map[string]struct {
		hdr  []byte
		want string // "" = accepted
	}{
		"v3":            {good, ""},
		"v2":            {v2, ""},
		"raw bytes":     {bytes.Repeat([]byte{0}, 512), "magic"},
		"short":         {good[:40], "ends inside"},
		"v3 short":      {good[:80], "version 3 header"},
		"version 4":     {set(4, 4, 4), "only versions 2 and 3"},
		"backing file":  {set(8, 4096, 8), "backing file"},
		"cluster bits":  {set(20, 30, 4), "cluster_bits"},
		"encrypted":     {set(32, 1, 4), "encrypted"},
		"no size":       {set(24, 0, 8), "size is 0"},
		"corrupt":       {set(72, qcow2Corrupt, 8), "corrupt"},
		"header length": {set(100, 72, 4), "header length"},
	} {
		t.Run(name, func(t *testing.T) {
			info, err := checkQCOW2(tc.hdr)
			if tc.want == "" {
				if err != nil || info.virtualSize != 1<<30 {
					t.Fatalf("checkQCOW2: %+v, %v", info, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("checkQCOW2: %v; want an error with %q", err, tc.want)
			}
		})
	}
}

// contentFiles lists the content store, temporary files included, block
// maps left out.
func contentFiles(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(filepath.Join(dir, images.ContentDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		if !strings.HasSuffix(e.Name(), MapSuffix) { // cached block maps
			out = append(out, e.Name())
		}
	}
	return out
}

func newService(t *testing.T, cfg Config) *Service {
	t.Helper()
	if cfg.Store == nil {
		cfg.Store = mem.New()
	}
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	cfg.Appliance = "a1"
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return s
}

// waitState polls until name leaves PENDING and DOWNLOADING.
func waitState(t *testing.T, s *Service, name string) *osimagev1.OSImage {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		im, err := s.Get(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		switch im.GetState() {
		case osimagev1.OSImageState_OS_IMAGE_STATE_READY, osimagev1.OSImageState_OS_IMAGE_STATE_FAILED:
			return im
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still %v", name, im.GetState())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRegister(t *testing.T) {
	disk := bytes.Repeat([]byte("corral-raw-disk."), 64<<10) // 1 MiB
	qc := qcow2File(8<<30, 4096)
	mux := http.NewServeMux()
	mux.HandleFunc("/disk.raw", func(w http.ResponseWriter, r *http.Request) { w.Write(disk) })
	mux.HandleFunc("/disk.qcow2", func(w http.ResponseWriter, r *http.Request) { w.Write(qc) })
	other := bytes.Repeat([]byte("another-raw-disk"), 1024)
	mux.HandleFunc("/other.raw", func(w http.ResponseWriter, r *http.Request) { w.Write(other) })
	mux.HandleFunc("/chunked", func(w http.ResponseWriter, r *http.Request) {
		// No Content-Length: the size is learnt at the end.
		for i := 0; i < len(disk); i += 4096 {
			w.Write(disk[i : i+4096])
			w.(http.Flusher).Flush()
		}
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	dir := t.TempDir()
	s := newService(t, Config{Dir: dir, MaxBytes: 2 << 20})
	ctx := context.Background()
	for name, tc := range map[string]struct {
		url    string
		sha    string
		format osimagev1.OSImageFormat
		reason string // "" = READY
		size   uint64
		vsize  uint64
	}{
		"good raw":         {url: "/disk.raw", sha: sum(disk), format: raw, size: uint64(len(disk)), vsize: uint64(len(disk))},
		"good qcow2":       {url: "/disk.qcow2", sha: sum(qc), format: qcow2, size: uint64(len(qc)), vsize: 8 << 30},
		"no length":        {url: "/chunked", sha: sum(disk), format: raw, size: uint64(len(disk)), vsize: uint64(len(disk))},
		"wrong hash":       {url: "/disk.raw", sha: sum([]byte("other")), format: raw, reason: "sha256 mismatch"},
		"not found":        {url: "/nope", sha: sum([]byte("missing")), format: raw, reason: "404 Not Found"},
		"raw called qcow2": {url: "/other.raw", sha: sum(other), format: qcow2, reason: "qcow2 magic"},
	} {
		t.Run(name, func(t *testing.T) {
			n := strings.ReplaceAll(name, " ", "-")
			im, err := s.Register(ctx, &osimagev1.RegisterOSImageRequest{Name: n, SourceUrl: srv.URL + tc.url, Sha256: tc.sha, Format: tc.format})
			if err != nil {
				t.Fatal(err)
			}
			if im.GetState() != osimagev1.OSImageState_OS_IMAGE_STATE_PENDING {
				t.Errorf("registered %v, want PENDING", im.GetState())
			}
			im = waitState(t, s, n)
			if tc.reason != "" {
				if im.GetState() != osimagev1.OSImageState_OS_IMAGE_STATE_FAILED || !strings.Contains(im.GetReason(), tc.reason) {
					t.Fatalf("%v %q; want FAILED with %q", im.GetState(), im.GetReason(), tc.reason)
				}
				if _, _, err := s.Open(tc.sha); err == nil {
					t.Error("a FAILED image's content is served")
				}
				return
			}
			if im.GetState() != osimagev1.OSImageState_OS_IMAGE_STATE_READY || im.GetSizeBytes() != tc.size || im.GetVirtualSizeBytes() != tc.vsize || im.GetPath() != "/os-images/"+tc.sha {
				t.Fatalf("got %v size %d virtual %d path %q reason %q", im.GetState(), im.GetSizeBytes(), im.GetVirtualSizeBytes(), im.GetPath(), im.GetReason())
			}
			f, a, err := s.Open(tc.sha)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if a.Size != int64(tc.size) {
				t.Errorf("Open: %d bytes, want %d", a.Size, tc.size)
			}
		})
	}
	// Only the two good contents are stored: no temporary file, nothing
	// of the refused downloads.
	got := contentFiles(t, dir)
	if len(got) != 2 || !strings.Contains(strings.Join(got, " "), sum(disk)) || !strings.Contains(strings.Join(got, " "), sum(qc)) {
		t.Errorf("content store holds %q; want exactly the raw and qcow2 images", got)
	}
}

// TestRegisterAgain: the same registration twice is no change (apply
// files are re-run); another image under the name is AlreadyExists.
func TestRegisterAgain(t *testing.T) {
	s, err := New(Config{Store: mem.New(), Dir: t.TempDir()}) // not run: stays PENDING
	if err != nil {
		t.Fatal(err)
	}
	req := &osimagev1.RegisterOSImageRequest{Name: "d", SourceUrl: "http://x/d.img", Sha256: sum(nil), Format: raw}
	first, err := s.Register(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	again, err := s.Register(context.Background(), req)
	if err != nil || !first.GetCreatedAt().AsTime().Equal(again.GetCreatedAt().AsTime()) {
		t.Fatalf("again: %v, %v", again, err)
	}
	req.Format = qcow2
	if _, err := s.Register(context.Background(), req); !errors.Is(err, apierr.ErrAlreadyExists) {
		t.Errorf("another image under the name: %v; want AlreadyExists", err)
	}
}

func TestRegisterOversize(t *testing.T) {
	big := bytes.Repeat([]byte{1}, 3<<20)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/chunked" {
			for i := 0; i < len(big); i += 64 << 10 {
				w.Write(big[i : i+64<<10])
				w.(http.Flusher).Flush()
			}
			return
		}
		w.Write(big)
	}))
	defer srv.Close()
	dir := t.TempDir()
	s := newService(t, Config{Dir: dir, MaxBytes: 2 << 20})
	for name, path := range map[string]string{"announced": "/big", "streamed": "/chunked"} {
		if _, err := s.Register(context.Background(), &osimagev1.RegisterOSImageRequest{Name: name, SourceUrl: srv.URL + path, Sha256: sum(big), Format: raw}); err != nil {
			t.Fatal(err)
		}
		im := waitState(t, s, name)
		if im.GetState() != osimagev1.OSImageState_OS_IMAGE_STATE_FAILED || !strings.Contains(im.GetReason(), "--os-image-max-bytes") {
			t.Errorf("%s: %v %q; want FAILED over the size bound", name, im.GetState(), im.GetReason())
		}
	}
	if got := contentFiles(t, dir); len(got) != 0 {
		t.Errorf("content store holds %q after refused downloads", got)
	}
}

func TestRegisterRefusesBadInput(t *testing.T) {
	s := newService(t, Config{})
	good := &osimagev1.RegisterOSImageRequest{Name: "d", SourceUrl: "http://x/d.img", Sha256: sum(nil), Format: raw}
	for name, mut := range map[string]func(r *osimagev1.RegisterOSImageRequest){
		"file URL":  func(r *osimagev1.RegisterOSImageRequest) { r.SourceUrl = "file:///etc/passwd" },
		"no host":   func(r *osimagev1.RegisterOSImageRequest) { r.SourceUrl = "http:///x" },
		"upper hex": func(r *osimagev1.RegisterOSImageRequest) { r.Sha256 = strings.ToUpper(sum(nil)) },
		"no format": func(r *osimagev1.RegisterOSImageRequest) { r.Format = 0 },
		"bad name":  func(r *osimagev1.RegisterOSImageRequest) { r.Name = "../x" },
		"system annot": func(r *osimagev1.RegisterOSImageRequest) {
			r.Annotations = map[string]string{AnnotationDownloader: "x"}
		},
	} {
		r := &osimagev1.RegisterOSImageRequest{Name: good.Name, SourceUrl: good.SourceUrl, Sha256: good.Sha256, Format: good.Format}
		mut(r)
		if _, err := s.Register(context.Background(), r); !errors.Is(err, apierr.ErrInvalid) {
			t.Errorf("%s: %v; want InvalidArgument", name, err)
		}
	}
}

// uploadClient serves s over bufconn and returns a client.
func uploadClient(t *testing.T, s *Service) osimagev1.OSImageServiceClient {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	g := grpc.NewServer()
	Register(g, s)
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient("passthrough:///bufconn", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return osimagev1.NewOSImageServiceClient(conn)
}

// upload sends h and then data in chunks; cancel stops the stream after
// the data instead of closing it.
func upload(c osimagev1.OSImageServiceClient, h *osimagev1.UploadOSImageHeader, data []byte, cancel bool) (*osimagev1.OSImage, error) {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	st, err := c.UploadOSImage(ctx)
	if err != nil {
		return nil, err
	}
	if err := st.Send(&osimagev1.UploadOSImageRequest{Part: &osimagev1.UploadOSImageRequest_Header{Header: h}}); err != nil {
		return nil, err
	}
	for i := 0; i < len(data); i += MaxChunk {
		if err := st.Send(&osimagev1.UploadOSImageRequest{Part: &osimagev1.UploadOSImageRequest_Data{Data: data[i:min(i+MaxChunk, len(data))]}}); err != nil {
			break // the server answered early; CloseAndRecv says why
		}
	}
	if cancel {
		stop()
		_, err := st.CloseAndRecv()
		return nil, err
	}
	resp, err := st.CloseAndRecv()
	return resp.GetOsImage(), err
}

func TestUpload(t *testing.T) {
	dir := t.TempDir()
	s := newService(t, Config{Dir: dir, MaxBytes: 4 << 20})
	c := uploadClient(t, s)
	disk := bytes.Repeat([]byte("upload-disk-0123"), 128<<10) // 2 MiB
	qc := qcow2File(1<<30, 1<<20)
	hdr := func(name string, b []byte, size int, f osimagev1.OSImageFormat) *osimagev1.UploadOSImageHeader {
		return &osimagev1.UploadOSImageHeader{Name: name, Sha256: sum(b), SizeBytes: uint64(size), Format: f}
	}
	for name, tc := range map[string]struct {
		h      *osimagev1.UploadOSImageHeader
		data   []byte
		cancel bool
		code   codes.Code
		msg    string
	}{
		"truncated":       {h: hdr("t", disk, len(disk), raw), data: disk[:len(disk)/2], code: codes.InvalidArgument, msg: "truncated"},
		"cut off":         {h: hdr("c", disk, len(disk), raw), data: disk[:len(disk)/2], cancel: true, code: codes.Canceled},
		"too long":        {h: hdr("l", disk, len(disk)-1, raw), data: disk, code: codes.InvalidArgument, msg: "more than the"},
		"wrong hash":      {h: hdr("w", []byte("x"), len(disk), raw), data: disk, code: codes.InvalidArgument, msg: "sha256 mismatch"},
		"not qcow2":       {h: hdr("q", disk, len(disk), qcow2), data: disk, code: codes.InvalidArgument, msg: "qcow2 magic"},
		"over the bound":  {h: hdr("b", disk, 5<<20, raw), data: disk, code: codes.ResourceExhausted, msg: "--os-image-max-bytes"},
		"no format":       {h: hdr("f", disk, len(disk), 0), data: disk, code: codes.InvalidArgument, msg: "never guessed"},
		"no size":         {h: hdr("z", disk, 0, raw), data: disk, code: codes.InvalidArgument, msg: "size_bytes"},
		"good raw":        {h: hdr("good-raw", disk, len(disk), raw), data: disk},
		"good qcow2":      {h: hdr("good-qcow2", qc, len(qc), qcow2), data: qc},
		"name taken":      {h: hdr("taken", disk, len(disk), raw), data: disk},
		"malformed sha":   {h: &osimagev1.UploadOSImageHeader{Name: "m", Sha256: "abc", SizeBytes: 3, Format: raw}, data: []byte("abc"), code: codes.InvalidArgument, msg: "sha256"},
		"no header first": {h: nil, code: codes.InvalidArgument, msg: "header"},
	} {
		t.Run(name, func(t *testing.T) {
			if name == "name taken" {
				if _, err := upload(c, tc.h, tc.data, false); err != nil {
					t.Fatal(err)
				}
				tc.code, tc.msg = codes.AlreadyExists, "already exists"
			}
			var im *osimagev1.OSImage
			var err error
			if tc.h == nil {
				st, serr := c.UploadOSImage(context.Background())
				if serr != nil {
					t.Fatal(serr)
				}
				st.Send(&osimagev1.UploadOSImageRequest{Part: &osimagev1.UploadOSImageRequest_Data{Data: []byte("x")}})
				_, err = st.CloseAndRecv()
			} else {
				im, err = upload(c, tc.h, tc.data, tc.cancel)
			}
			if tc.code != codes.OK {
				if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
					t.Fatalf("upload: %v; want %v with %q", err, tc.code, tc.msg)
				}
				if tc.h != nil && tc.code != codes.AlreadyExists {
					if _, gerr := s.Get(context.Background(), tc.h.GetName()); !errors.Is(gerr, apierr.ErrNotFound) {
						t.Errorf("a refused upload left a record: %v", gerr)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if im.GetState() != osimagev1.OSImageState_OS_IMAGE_STATE_READY || im.GetSizeBytes() != uint64(len(tc.data)) {
				t.Fatalf("uploaded %v %d bytes", im.GetState(), im.GetSizeBytes())
			}
			f, _, err := s.Open(im.GetSha256())
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(f)
			f.Close()
			if !bytes.Equal(got, tc.data) {
				t.Error("the stored content differs from the upload")
			}
		})
	}
	// The canceled upload's server side may still be winding down.
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := contentFiles(t, dir)
		if len(got) == 2 || time.Now().After(deadline) {
			if len(got) != 2 {
				t.Errorf("content store holds %q; want the raw and the qcow2 image only", got)
			}
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestDeleteAndList(t *testing.T) {
	dir := t.TempDir()
	inUse := map[string]string{"busy": "m1"}
	s := newService(t, Config{Dir: dir, InUse: func(_ context.Context, name string) (string, error) { return inUse[name], nil }})
	c := uploadClient(t, s)
	disk := bytes.Repeat([]byte{7}, 4096)
	for _, n := range []string{"a", "b", "busy"} {
		if _, err := upload(c, &osimagev1.UploadOSImageHeader{Name: n, Sha256: sum(disk), SizeBytes: 4096, Format: raw}, disk, false); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	resp, err := c.ListOSImages(ctx, &osimagev1.ListOSImagesRequest{PageSize: 2})
	if err != nil || len(resp.GetOsImages()) != 2 || resp.GetNextPageToken() == "" {
		t.Fatalf("first page: %v, %v", resp, err)
	}
	resp, err = c.ListOSImages(ctx, &osimagev1.ListOSImagesRequest{PageSize: 2, PageToken: resp.GetNextPageToken()})
	if err != nil || len(resp.GetOsImages()) != 1 || resp.GetOsImages()[0].GetName() != "busy" || resp.GetNextPageToken() != "" {
		t.Fatalf("second page: %v, %v", resp, err)
	}
	if _, err := c.DeleteOSImage(ctx, &osimagev1.DeleteOSImageRequest{Name: "busy"}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("delete of an image in use: %v", err)
	}
	delete(inUse, "busy")
	for _, n := range []string{"a", "busy"} {
		if _, err := c.DeleteOSImage(ctx, &osimagev1.DeleteOSImageRequest{Name: n}); err != nil {
			t.Fatal(err)
		}
		if len(contentFiles(t, dir)) != 1 {
			t.Fatalf("after deleting %s the shared content is gone though b still has it", n)
		}
	}
	if _, err := c.DeleteOSImage(ctx, &osimagev1.DeleteOSImageRequest{Name: "b"}); err != nil {
		t.Fatal(err)
	}
	if got := contentFiles(t, dir); len(got) != 0 {
		t.Errorf("after the last image went, the content store holds %q", got)
	}
	if _, err := c.GetOSImage(ctx, &osimagev1.GetOSImageRequest{Name: "b"}); status.Code(err) != codes.NotFound {
		t.Errorf("get of a deleted image: %v", err)
	}
	if _, _, err := s.Open(sum(disk)); !errors.Is(err, apierr.ErrNotFound) {
		t.Errorf("Open after delete: %v", err)
	}
}

// TestDeleteStopsDownload: deleting an image while it downloads stops the
// download and keeps nothing.
func TestDeleteStopsDownload(t *testing.T) {
	started := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "1048576")
		w.Write(make([]byte, 1000))
		w.(http.Flusher).Flush()
		close(started)
		<-r.Context().Done()
	}))
	defer srv.Close()
	dir := t.TempDir()
	s := newService(t, Config{Dir: dir})
	if _, err := s.Register(context.Background(), &osimagev1.RegisterOSImageRequest{Name: "slow", SourceUrl: srv.URL, Sha256: sum(nil), Format: raw}); err != nil {
		t.Fatal(err)
	}
	<-started
	if err := s.Delete(context.Background(), "slow"); err != nil {
		t.Fatal(err)
	}
	if got := contentFiles(t, dir); len(got) != 0 {
		t.Errorf("content store holds %q after the download was stopped", got)
	}
}

// FuzzCheckQCOW2: the header check takes any bytes an upload or a download
// brings without panicking, and what it accepts has a sane header.
func FuzzCheckQCOW2(f *testing.F) {
	f.Add(qcow2File(1<<30, 0))
	f.Add(qcow2File(1, 0)[:qcow2V2Header])
	f.Add([]byte("QFI\xfb"))
	f.Add(bytes.Repeat([]byte{0}, qcow2V3Header))
	f.Fuzz(func(t *testing.T, hdr []byte) {
		info, err := checkQCOW2(hdr[:min(len(hdr), qcow2V3Header)])
		if err != nil {
			return
		}
		if string(hdr[:4]) != qcow2Magic || (info.version != 2 && info.version != 3) || info.virtualSize == 0 {
			t.Fatalf("accepted %x as %+v", hdr, info)
		}
	})
}

// TestRegisterHeldContent: registering content the store already holds
// uses it without a download (the URL is not fetched), and still checks
// the declared format against it.
func TestRegisterHeldContent(t *testing.T) {
	var fetched atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fetched.Add(1); http.NotFound(w, r) }))
	defer srv.Close()
	s := newService(t, Config{})
	c := uploadClient(t, s)
	disk := bytes.Repeat([]byte{9}, 8192)
	if _, err := upload(c, &osimagev1.UploadOSImageHeader{Name: "first", Sha256: sum(disk), SizeBytes: 8192, Format: raw}, disk, false); err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]osimagev1.OSImageFormat{"again": raw, "as-qcow2": qcow2} {
		if _, err := s.Register(context.Background(), &osimagev1.RegisterOSImageRequest{Name: name, SourceUrl: srv.URL, Sha256: sum(disk), Format: f}); err != nil {
			t.Fatal(err)
		}
	}
	if im := waitState(t, s, "again"); im.GetState() != osimagev1.OSImageState_OS_IMAGE_STATE_READY {
		t.Errorf("again: %v %q", im.GetState(), im.GetReason())
	}
	if im := waitState(t, s, "as-qcow2"); im.GetState() != osimagev1.OSImageState_OS_IMAGE_STATE_FAILED || !strings.Contains(im.GetReason(), "qcow2 magic") {
		t.Errorf("as-qcow2: %v %q", im.GetState(), im.GetReason())
	}
	if n := fetched.Load(); n != 0 {
		t.Errorf("the URL was fetched %d times", n)
	}
}
