package appliance

import (
	"context"
	"crypto/x509"
	"strings"
	"testing"

	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestNodeCertificateReadsOwnNodeOnly: a node certificate reads its own
// Node and no other; it lists none; operators read them all.
func TestNodeCertificateReadsOwnNodeOnly(t *testing.T) {
	srv, cc := startServer(t, t.TempDir())
	ctx := context.Background()
	k := newNodeKey(t, &x509.CertificateRequest{})
	resp, err := join(dial(t, cc, nodeToken(t, srv, "")), "node-1", k.csr)
	if err != nil {
		t.Fatal(err)
	}
	mine := poolv1.NewNodeServiceClient(dialCert(t, cc, k.pair(t, resp.GetCertPem())))
	admin := poolv1.NewNodeServiceClient(dial(t, cc, ""))
	if _, err := mine.ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: "node-1", CpuMilliCores: 1000, MemoryBytes: gib}); err != nil {
		t.Fatalf("node-1 applying itself: %v", err)
	}
	if _, err := admin.ApplyNode(ctx, &poolv1.ApplyNodeRequest{Name: "node-2", CpuMilliCores: 1000, MemoryBytes: gib}); err != nil {
		t.Fatal(err)
	}
	if n, err := mine.GetNode(ctx, &poolv1.GetNodeRequest{Name: "node-1"}); err != nil || n.GetName() != "node-1" {
		t.Fatalf("node-1 reading itself: %v, %v", n, err)
	}
	for name, want := range map[string]string{"node-2": `may not read node "node-2"`, "nope": `may not read node "nope"`, "": `may not read node ""`} {
		_, err := mine.GetNode(ctx, &poolv1.GetNodeRequest{Name: name})
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), want) {
			t.Errorf("node-1 reading %q: %v; want PermissionDenied %q", name, err, want)
		}
	}
	if _, err := mine.ListNodes(ctx, &poolv1.ListNodesRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("node-1 listing nodes: %v; want PermissionDenied", err)
	}
	if _, err := admin.GetNode(ctx, &poolv1.GetNodeRequest{Name: "node-1"}); err != nil {
		t.Errorf("admin reading node-1: %v", err)
	}
	if l, err := admin.ListNodes(ctx, &poolv1.ListNodesRequest{}); err != nil || len(l.GetNodes()) != 2 {
		t.Errorf("admin listing nodes: %v, %v; want 2", l, err)
	}
}
