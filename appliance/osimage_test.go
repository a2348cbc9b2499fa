package appliance

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	auditv1 "github.com/corralhq/corral/api/audit/v1"
	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/api/clientconfig"
	osimagev1 "github.com/corralhq/corral/api/osimage/v1"
	"github.com/corralhq/corral/images"
	"github.com/corralhq/corral/images/osimage"
	"github.com/corralhq/corral/testsupport/etcdtest"
)

// waitOSImage polls GetOSImage until name is READY or FAILED.
func waitOSImage(t *testing.T, conn *grpc.ClientConn, name string) *osimagev1.OSImage {
	t.Helper()
	c := osimagev1.NewOSImageServiceClient(conn)
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := c.GetOSImage(context.Background(), &osimagev1.GetOSImageRequest{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		switch im := resp.GetOsImage(); im.GetState() {
		case osimagev1.OSImageState_OS_IMAGE_STATE_READY, osimagev1.OSImageState_OS_IMAGE_STATE_FAILED:
			return im
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("OS image %s still %v", name, resp.GetOsImage().GetState())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func rangeGet(t *testing.T, url, rng string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if rng != "" {
		req.Header.Set("Range", rng)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// TestOSImagesEndToEnd: an OS image registered over the API from a URL is
// downloaded, checked and served by the boot HTTP server with ranges; a
// wrong hash is FAILED and keeps nothing; a viewer cannot register; the
// writes are audited.
func TestOSImagesEndToEnd(t *testing.T) {
	dir := t.TempDir()
	srv, err := New(Config{DataDir: dir, APIListen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler),
		Boot: BootConfig{Interface: "lo", DHCPMode: "off", TFTPListen: "off", HTTPListen: "127.0.0.1:0", NoRA: true}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	cc, err := clientconfig.Load(filepath.Join(dir, AdminConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	conn := dial(t, cc, "")
	c := osimagev1.NewOSImageServiceClient(conn)

	disk := randomBytes(t, 3<<20)
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(disk) }))
	defer web.Close()
	if _, err := c.RegisterOSImage(ctx, &osimagev1.RegisterOSImageRequest{Name: "debian", SourceUrl: web.URL + "/debian.raw", Sha256: hexSum(disk),
		Format: osimagev1.OSImageFormat_OS_IMAGE_FORMAT_RAW, Labels: map[string]string{"os": "debian"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RegisterOSImage(ctx, &osimagev1.RegisterOSImageRequest{Name: "liar", SourceUrl: web.URL + "/liar.raw", Sha256: hexSum([]byte("not it")),
		Format: osimagev1.OSImageFormat_OS_IMAGE_FORMAT_RAW}); err != nil {
		t.Fatal(err)
	}
	im := waitOSImage(t, conn, "debian")
	if im.GetState() != osimagev1.OSImageState_OS_IMAGE_STATE_READY || im.GetSizeBytes() != uint64(len(disk)) {
		t.Fatalf("debian: %v %q", im.GetState(), im.GetReason())
	}
	if liar := waitOSImage(t, conn, "liar"); liar.GetState() != osimagev1.OSImageState_OS_IMAGE_STATE_FAILED || !strings.Contains(liar.GetReason(), "sha256 mismatch") {
		t.Errorf("liar: %v %q; want FAILED for its hash", liar.GetState(), liar.GetReason())
	}
	es, _ := os.ReadDir(filepath.Join(dir, ImagesDir, images.ContentDir))
	es = slices.DeleteFunc(es, func(e os.DirEntry) bool { return e.Name() == hexSum(disk)+osimage.MapSuffix }) // its block map, built in the background
	if len(es) != 1 || es[0].Name() != hexSum(disk) {
		t.Errorf("content store: %v; want the debian image alone", es)
	}

	base := "http://" + srv.BootHTTPAddr().String()
	code, body := rangeGet(t, base+im.GetPath(), "")
	if code != http.StatusOK || !bytes.Equal(body, disk) {
		t.Fatalf("GET %s: %d, %d bytes", im.GetPath(), code, len(body))
	}
	code, body = rangeGet(t, base+im.GetPath(), "bytes=1048576-2097151")
	if code != http.StatusPartialContent || !bytes.Equal(body, disk[1<<20:2<<20]) {
		t.Fatalf("range GET: %d, %d bytes", code, len(body))
	}
	code, body = rangeGet(t, base+im.GetPath()+"/raw", "bytes=1048576-2097151") // the raw view a deploy writes
	if code != http.StatusPartialContent || !bytes.Equal(body, disk[1<<20:2<<20]) {
		t.Fatalf("raw range GET: %d, %d bytes", code, len(body))
	}
	if code, _ := rangeGet(t, base+"/os-images/"+hexSum([]byte("not it")), ""); code != http.StatusNotFound {
		t.Errorf("a FAILED image's path: %d, want 404", code)
	}

	viewer := osimagev1.NewOSImageServiceClient(dial(t, cc, newToken(t, srv, authv1.Role_ROLE_VIEWER)))
	if _, err := viewer.RegisterOSImage(ctx, &osimagev1.RegisterOSImageRequest{Name: "v", SourceUrl: web.URL, Sha256: hexSum(disk),
		Format: osimagev1.OSImageFormat_OS_IMAGE_FORMAT_RAW}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("viewer register: %v; want PermissionDenied", err)
	}
	if resp, err := viewer.ListOSImages(ctx, &osimagev1.ListOSImagesRequest{}); err != nil || len(resp.GetOsImages()) != 2 {
		t.Errorf("viewer list: %v, %v", resp, err)
	}
	if _, err := c.DeleteOSImage(ctx, &osimagev1.DeleteOSImageRequest{Name: "debian"}); err != nil {
		t.Fatal(err)
	}
	if code, _ := rangeGet(t, base+im.GetPath(), ""); code != http.StatusNotFound {
		t.Errorf("a deleted image's path: %d, want 404", code)
	}

	if err := srv.audit.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	ev, err := auditv1.NewAuditServiceClient(conn).ListEvents(ctx, &auditv1.ListEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	for _, e := range ev.GetEvents() {
		if strings.Contains(e.GetMethod(), "OSImage") {
			seen = append(seen, e.GetObject()+" "+e.GetCode())
		}
	}
	for _, want := range []string{"osimage/debian OK", "osimage/liar OK", "osimage/v PermissionDenied", "osimage/debian OK"} {
		if !strings.Contains(strings.Join(seen, "\n"), want) {
			t.Errorf("audit lacks %q: %q", want, seen)
		}
	}
}

// TestOSImagesFleet: an image uploaded to one appliance of a fleet is
// fetched by the other from it (the boot artifacts' FetchArtifact path)
// and served by both.
func TestOSImagesFleet(t *testing.T) {
	c := etcdtest.New(t, 1)
	dirA, dirB := t.TempDir(), t.TempDir()
	cfg := func(dir, name string) Config {
		cf := etcdConfig(c, dir, name, "/os-images")
		cf.OSImages.SyncInterval = 100 * time.Millisecond
		return cf
	}
	a, err := New(cfg(dirA, "a"))
	if err != nil {
		t.Fatal(err)
	}
	key, err := os.ReadFile(filepath.Join(dirA, ClusterKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dirB, ClusterKeyFile), key, 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := New(cfg(dirB, "b"))
	if err != nil {
		a.Close()
		t.Fatal(err)
	}
	for _, s := range []*Server{a, b} {
		withApplianceService(s)
		runFleetServer(t, s)
	}
	admin, err := clientconfig.Load(filepath.Join(dirA, AdminConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	disk := randomBytes(t, 1<<20)
	st, err := osimagev1.NewOSImageServiceClient(dial(t, admin, "")).UploadOSImage(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	st.Send(&osimagev1.UploadOSImageRequest{Part: &osimagev1.UploadOSImageRequest_Header{Header: &osimagev1.UploadOSImageHeader{
		Name: "img", Sha256: hexSum(disk), SizeBytes: uint64(len(disk)), Format: osimagev1.OSImageFormat_OS_IMAGE_FORMAT_RAW}}})
	for i := 0; i < len(disk); i += 256 << 10 {
		if err := st.Send(&osimagev1.UploadOSImageRequest{Part: &osimagev1.UploadOSImageRequest_Data{Data: disk[i : i+256<<10]}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		f, _, err := b.osImages.Open(hexSum(disk))
		if err == nil {
			got, _ := io.ReadAll(f)
			f.Close()
			if !bytes.Equal(got, disk) {
				t.Fatal("the peer's copy differs")
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("appliance b never fetched the image: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
