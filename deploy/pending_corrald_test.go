package deploy_test

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/api/clientconfig"
	deploymentv1 "github.com/corralhq/corral/api/deployment/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/appliance"
	"github.com/corralhq/corral/auth"
	"github.com/corralhq/corral/deploy"
	"github.com/corralhq/corral/hypervisor/node"
	apptest "github.com/corralhq/corral/testsupport/appliance"
	"github.com/corralhq/corral/testsupport/require"
)

// TestRegisterImageUsecaseParallel runs n0stack's own
// register-blockstorage-as-image file with the default parallelism
// against a real appliance and a real hypervisor node (in-process, on
// loopback, qemu-img making the volume). RegisterBlockStorage depends
// only on ApplyImage, so it usually meets the fetched block storage still
// PENDING: the runner retries that answer until the fetch is done
// instead of failing the task.
func TestRegisterImageUsecaseParallel(t *testing.T) {
	if testing.Short() {
		t.Skip("starts corrald and a hypervisor node")
	}
	require.Tool(t, "qemu-img")
	log := slog.New(slog.DiscardHandler)
	a := apptest.Start(t, appliance.Config{Logger: log})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The node vm-host1 the file names, enrolled with a node token.
	dir := t.TempDir()
	tok, _, err := a.Server.Tokens().CreateBound(ctx, auth.TokenSpec{Role: authv1.Role_ROLE_NODE, Description: "deploy test", Node: "vm-host1"})
	if err != nil {
		t.Fatal(err)
	}
	apps, err := node.NewAppliances([]string{a.Server.Addr().String()}, log)
	if err != nil {
		t.Fatal(err)
	}
	nodeDir := filepath.Join(dir, "node")
	id, err := node.Enrol(ctx, node.EnrolConfig{Name: "vm-host1", DataDir: nodeDir, Token: tok, CACertPEM: a.Server.CA().CertPEM(), Appliances: apps})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := id.RegistryOn(apps)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nctx, stop := context.WithCancel(context.Background())
	nodeDone := make(chan error, 1)
	go func() {
		nodeDone <- node.Run(nctx, node.Config{Name: "vm-host1", DataDir: nodeDir, Listener: lis, CAPool: id.CAPool,
			Certificate: id.Certificate, GetCertificate: id.GetCertificate, Registry: reg, Accel: "tcg", Logger: log})
	}()
	defer func() {
		stop()
		if err := <-nodeDone; err != nil {
			t.Errorf("node: %v", err)
		}
	}()

	// The image the file fetches, served over HTTP.
	img := filepath.Join(dir, "guest-tiny.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", img, "64M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v: %s", err, out)
	}
	files := httptest.NewServer(http.FileServer(http.Dir(dir)))
	defer files.Close()
	b, err := os.ReadFile("testdata/usecases/register-blockstorage-as-image.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dag := strings.Replace(string(b), "http://127.0.0.1:18080/", files.URL+"/", 1)
	plan, err := deploy.Parse([]byte(dag))
	if err != nil {
		t.Fatal(err)
	}

	cc, err := clientconfig.Load(a.AdminConf)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := clientconfig.Dial(cc)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		n, err := poolv1.NewNodeServiceClient(conn).GetNode(ctx, &poolv1.GetNodeRequest{Name: "vm-host1"})
		if err == nil && n.GetState() == poolv1.Node_READY {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node vm-host1 not READY: %v %v", n, err)
		}
	}

	var retries []string
	r := &deploy.Runner{Conn: conn, TaskTimeout: 30 * time.Second, Progress: func(e deploy.Event) {
		if e.Kind == deploy.Retrying {
			retries = append(retries, e.Task.Name+": "+e.Err.Error())
		}
	}}
	s, err := r.Run(ctx, plan)
	if err != nil {
		for _, res := range s.Results {
			t.Logf("%s: %s after %d attempts: %v", res.Task.Name, res.Outcome, res.Attempts, res.Err)
		}
		t.Fatal(err)
	}
	t.Logf("retried: %q", retries)
	if s.Succeeded != 3 {
		t.Errorf("summary: %d succeeded, %d failed, %d skipped", s.Succeeded, s.Failed, s.Skipped)
	}
	im, err := deploymentv1.NewImageServiceClient(conn).GetImage(ctx, &deploymentv1.GetImageRequest{Name: "cloudimage-ubuntu"})
	if err != nil {
		t.Fatal(err)
	}
	if got := im.GetTags()["18.04"]; got != "cloudimage-ubuntu-1804" {
		t.Errorf("image tags %v, want 18.04 → cloudimage-ubuntu-1804", im.GetTags())
	}
}
