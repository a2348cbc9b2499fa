package node

import (
	"context"
	"crypto/x509/pkix"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	hypervisorv1 "github.com/corralhq/corral/api/hypervisor/v1"
	"github.com/corralhq/corral/testsupport/require"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// attackImage makes a 4 MiB qcow2 with real qemu-img and opts.
func attackImage(t *testing.T, opts ...string) []byte {
	t.Helper()
	dir := t.TempDir()
	args := append(append([]string{"create", "-q", "-f", "qcow2"}, opts...), "img.qcow2", "4M")
	cmd := exec.Command("qemu-img", args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("qemu-img %v: %v %s", args, err, out)
	}
	b, err := os.ReadFile(filepath.Join(dir, "img.qcow2"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestFetchVolumeRefusesHostileSources drives FetchVolume over the node's
// real mTLS gRPC service, as the appliance does, against a web server that
// serves what an attacker controlling (or answering for) the source URL
// could: qcow2 images that name a host file, a json: pseudo-protocol or
// another volume as backing or data file, redirects to file:// and ftp://,
// a redirect loop, a truncated body. Each is refused with a clear status
// and the node's volume directory is byte-for-byte the same; then a clean
// image is fetched and deleted.
func TestFetchVolumeRefusesHostileSources(t *testing.T) {
	require.Tool(t, "qemu-img")
	good := attackImage(t)
	bodies := map[string][]byte{
		"/good":         good,
		"/backing":      attackImage(t, "-u", "-b", "/etc/shadow", "-F", "raw"),
		"/json-backing": attackImage(t, "-u", "-b", `json:{"driver":"nbd","host":"10.0.0.66","port":10809}`, "-F", "raw"),
		"/data-file":    attackImage(t, "-o", "data_file=victim-disk"),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/img/{name}", func(w http.ResponseWriter, r *http.Request) {
		b, ok := bodies["/"+r.PathValue("name")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Write(b)
	})
	mux.HandleFunc("/to-file", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "file:///var/lib/corral-node/identity/node.key", http.StatusFound)
	})
	mux.HandleFunc("/to-ftp", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "ftp://10.0.0.66/img", http.StatusFound)
	})
	mux.HandleFunc("/loop/{n}", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.PathValue("n"))
		http.Redirect(w, r, fmt.Sprintf("/loop/%d", n+1), http.StatusFound)
	})
	mux.HandleFunc("/truncated", func(w http.ResponseWriter, r *http.Request) {
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			panic(http.ErrAbortHandler)
		}
		defer conn.Close()
		fmt.Fprintf(buf, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", len(good))
		buf.Write(good[:len(good)/3])
		buf.Flush()
	})
	web := httptest.NewServer(mux)
	defer web.Close()

	ca := newTestCA(t)
	nodeCert := ca.issue(t, pkix.Name{CommonName: "node-1"})
	appliance := ca.issue(t, pkix.Name{CommonName: "corrald"})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{Name: "node-1", DataDir: data, Listener: lis, CAPool: ca.pool(), Certificate: nodeCert,
			Accel: "tcg", SkipRestart: true, FetchMaxRedirects: 4})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	hv := dialNode(t, lis.Addr().String(), ca, &appliance)
	cctx, ccancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer ccancel()

	// A volume the hostile images aim at, so that the directory holds
	// something to compare.
	if _, err := hv.CreateVolume(cctx, &hypervisorv1.CreateVolumeRequest{Name: "victim-disk", SizeBytes: 8 << 20}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	volDir := filepath.Join(data, "volumes")
	before := snapshot(t, volDir)

	for name, tc := range map[string]struct {
		path string
		code codes.Code
		want string
	}{
		"qcow2 backing host file":   {"/img/backing", codes.InvalidArgument, `backing file "/etc/shadow"`},
		"qcow2 json: backing (nbd)": {"/img/json-backing", codes.InvalidArgument, `backing file "json:{\"driver\":\"nbd\"`},
		"qcow2 data file (volume)":  {"/img/data-file", codes.InvalidArgument, `external data file "victim-disk"`},
		"redirect to file://":       {"/to-file", codes.InvalidArgument, "redirects to file:///var/lib/corral-node/identity/node.key: only http and https"},
		"redirect to ftp://":        {"/to-ftp", codes.InvalidArgument, "redirects to ftp://10.0.0.66/img: only http and https"},
		"redirect loop":             {"/loop/0", codes.InvalidArgument, "more than 4 redirects"},
		"truncated body":            {"/truncated", codes.FailedPrecondition, "truncated"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := hv.FetchVolume(cctx, &hypervisorv1.FetchVolumeRequest{Name: "fetched", SourceUrl: web.URL + tc.path, SizeBytes: 8 << 20})
			st := status.Convert(err)
			if st.Code() != tc.code || !strings.Contains(st.Message(), tc.want) {
				t.Fatalf("FetchVolume: %v, want %v saying %q", err, tc.code, tc.want)
			}
			t.Logf("refused: %v: %s", st.Code(), st.Message())
			if diff := cmp.Diff(before, snapshot(t, volDir)); diff != "" {
				t.Errorf("volume directory changed (-before +after):\n%s", diff)
			}
		})
	}
	if l, err := hv.ListVolumes(cctx, &hypervisorv1.ListVolumesRequest{}); err != nil || len(l.GetVolumes()) != 1 {
		t.Errorf("volumes after the refusals: %v %v", l, err)
	}

	// The same path still fetches a clean image, which deletes cleanly.
	v, err := hv.FetchVolume(cctx, &hypervisorv1.FetchVolumeRequest{Name: "fetched", SourceUrl: web.URL + "/img/good", SizeBytes: 8 << 20})
	if err != nil || v.GetFormat() != "qcow2" || v.GetBackingFile() != "" || v.GetSizeBytes() != 8<<20 {
		t.Fatalf("clean fetch: %v %v", v, err)
	}
	for _, n := range []string{"fetched", "victim-disk"} {
		if _, err := hv.DeleteVolume(cctx, &hypervisorv1.VolumeRequest{Name: n}); err != nil {
			t.Fatal(err)
		}
	}
	if got := snapshot(t, volDir); len(got) != 0 {
		t.Errorf("left behind: %v", got)
	}
}

// snapshot maps every entry of dir (hidden ones included) to its size and
// modification time.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range es {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = fmt.Sprintf("%d bytes, %s", fi.Size(), fi.ModTime().Format(time.RFC3339Nano))
	}
	return out
}
