package appliance

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/api/clientconfig"
	fleetv1 "github.com/corralhq/corral/api/fleet/v1"
	"github.com/corralhq/corral/auth"
	"github.com/corralhq/corral/fleet"
	"github.com/corralhq/corral/fleet/artifactsync"
	"github.com/corralhq/corral/images"
	"github.com/corralhq/corral/testsupport/etcdtest"
)

// withApplianceService registers the ApplianceService with srv's
// FetchArtifact on an appliance whose New did not (before it runs).
func withApplianceService(srv *Server) {
	if _, ok := srv.grpc.GetServiceInfo()["corral.fleet.v1.ApplianceService"]; !ok {
		fleet.Register(srv.grpc, &fleet.Service{Store: srv.store, FetchArtifact: srv.artifacts.FetchArtifact})
	}
}

// newFleetPair starts appliances a and b on one etcd prefix, b with a's
// cluster key (so one CA, one token store).
func newFleetPair(t *testing.T, c *etcdtest.Cluster, prefix string) (a, b *Server, admin *clientconfig.Config) {
	t.Helper()
	dirA, dirB := t.TempDir(), t.TempDir()
	a, err := New(etcdConfig(c, dirA, "a", prefix))
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
	b, err = New(etcdConfig(c, dirB, "b", prefix))
	if err != nil {
		a.Close()
		t.Fatal(err)
	}
	for _, s := range []*Server{a, b} {
		withApplianceService(s)
		runFleetServer(t, s)
	}
	admin, err = clientconfig.Load(filepath.Join(dirA, AdminConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	return a, b, admin
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func hexSum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// openCatalog builds srv's catalog from kernel and initrd bytes (and a
// stand-in iPXE binary), as the boot servers do at start.
func openCatalog(t *testing.T, srv *Server, kernel, initrd []byte) {
	t.Helper()
	src := t.TempDir()
	for name, b := range map[string][]byte{"undionly.kpxe": []byte("ipxe of " + srv.cfg.Fleet.Name), "vmlinuz": kernel, "initrd.img": initrd} {
		if err := os.WriteFile(filepath.Join(src, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := images.Open(images.Config{Dir: srv.catalogDir(), IPXEDirs: []string{src},
		Kernel: filepath.Join(src, "vmlinuz"), Initrd: filepath.Join(src, "initrd.img")}); err != nil {
		t.Fatal(err)
	}
}

// fetchAll calls FetchArtifact and returns the chunks.
func fetchAll(ctx context.Context, conn *grpc.ClientConn, sum string) ([]*fleetv1.ArtifactChunk, error) {
	stream, err := fleetv1.NewApplianceServiceClient(conn).FetchArtifact(ctx, &fleetv1.FetchArtifactRequest{Sha256: sum})
	if err != nil {
		return nil, err
	}
	var out []*fleetv1.ArtifactChunk
	for {
		c, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, c)
	}
}

// dialTLS connects to addr trusting ca, presenting cert when given.
func dialTLS(t *testing.T, addr string, srv *Server, cert *tls.Certificate) *grpc.ClientConn {
	t.Helper()
	c := &tls.Config{RootCAs: srv.ca.Pool(), MinVersion: tls.VersionTLS12}
	if cert != nil {
		c.Certificates = []tls.Certificate{*cert}
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(c)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestArtifactsFromPeer: two appliances share one etcd store; the boot
// artifacts are on A only. A publishes them to the fleet's catalog, B
// fetches them from A by SHA-256 (as ROLE_APPLIANCE, with its own
// certificate) and then serves them itself; a node certificate, a viewer
// and an unauthenticated caller are refused.
func TestArtifactsFromPeer(t *testing.T) {
	c := etcdtest.New(t, 3)
	a, b, admin := newFleetPair(t, c, "/artifacts")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Several chunks, the last one short.
	kernel := randomBytes(t, 3*artifactsync.ChunkSize+123)
	initrd := randomBytes(t, 10*artifactsync.ChunkSize)
	openCatalog(t, a, kernel, initrd)

	if fetched, err := a.artifacts.Sync(ctx, []string{b.Addr().String()}); err != nil || len(fetched) != 0 {
		t.Fatalf("A's sync: fetched %v, %v; want nothing (A holds its catalog)", fetched, err)
	}
	manifest, err := b.artifacts.Manifest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []images.Artifact{
		{Name: "initrd.img", Kind: images.KindInitrd, Size: int64(len(initrd)), SHA256: hexSum(initrd)},
		{Name: "vmlinuz", Kind: images.KindKernel, Size: int64(len(kernel)), SHA256: hexSum(kernel)},
	}
	if diff := cmp.Diff(want, manifest); diff != "" {
		t.Fatalf("fleet catalog (-want +got):\n%s", diff)
	}

	// B lacks both; with no peer it says so and fetches nothing.
	if _, err := b.artifacts.Sync(ctx, []string{}); err == nil || !strings.Contains(err.Error(), "knows no peer") {
		t.Fatalf("B's sync without peers: %v", err)
	}
	fetched, err := b.artifacts.Sync(ctx, []string{a.Addr().String()})
	if err != nil {
		t.Fatalf("B's sync from A: %v", err)
	}
	if diff := cmp.Diff(want, fetched, cmpopts.IgnoreFields(images.Artifact{}, "Path")); diff != "" {
		t.Fatalf("B fetched (-want +got):\n%s", diff)
	}
	for i, body := range [][]byte{initrd, kernel} {
		got, err := os.ReadFile(fetched[i].Path)
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("B's copy of %s: %d bytes, %v", want[i].Name, len(got), err)
		}
	}
	if again, err := b.artifacts.Sync(ctx, []string{a.Addr().String()}); err != nil || len(again) != 0 {
		t.Fatalf("B's second sync fetched %v, %v", again, err)
	}
	// B's boot servers would boot the fleet's files.
	cfg := images.Config{Dir: b.catalogDir()}.WithFleet(manifest)
	if cfg.Kernel != fetched[1].Path || cfg.Initrd != fetched[0].Path {
		t.Errorf("WithFleet on B = kernel %s, initrd %s", cfg.Kernel, cfg.Initrd)
	}

	// B serves what it fetched: to an admin, and to A as a peer.
	ccB := *admin
	ccB.Endpoint = b.Addr().String()
	adminConn := dial(t, &ccB, "")
	chunks, err := fetchAll(ctx, adminConn, hexSum(kernel))
	if err != nil {
		t.Fatalf("admin FetchArtifact from B: %v", err)
	}
	var got []byte
	for _, ch := range chunks {
		got = append(got, ch.GetData()...)
	}
	if !bytes.Equal(got, kernel) || len(chunks) != 4 || chunks[0].GetSize() != uint64(len(kernel)) || chunks[0].GetName() == "" {
		t.Errorf("B served %d bytes in %d chunks (first: name %q size %d); want %d in 4", len(got), len(chunks), chunks[0].GetName(), chunks[0].GetSize(), len(kernel))
	}
	for i, ch := range chunks {
		if len(ch.GetData()) > artifactsync.ChunkSize || (i > 0 && (ch.GetName() != "" || ch.GetSize() != 0)) {
			t.Errorf("chunk %d: %d bytes, name %q, size %d", i, len(ch.GetData()), ch.GetName(), ch.GetSize())
		}
	}
	peerConn := dialTLS(t, b.Addr().String(), a, &a.cert)
	if chunks, err := fetchAll(ctx, peerConn, hexSum(initrd)); err != nil || len(chunks) != 10 {
		t.Errorf("A as a peer fetching from B: %d chunks, %v", len(chunks), err)
	}

	nodePEM, keyPEM, err := b.ca.IssueNodeCert("node-1", auth.NodeOrganization)
	if err != nil {
		t.Fatal(err)
	}
	nodeCert, err := tls.X509KeyPair(nodePEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	viewer := newToken(t, b, authv1.Role_ROLE_VIEWER)
	for name, tc := range map[string]struct {
		conn *grpc.ClientConn
		sum  string
		want codes.Code
	}{
		"node certificate": {conn: dialTLS(t, b.Addr().String(), b, &nodeCert), sum: hexSum(kernel), want: codes.PermissionDenied},
		"unauthenticated":  {conn: dialTLS(t, b.Addr().String(), b, nil), sum: hexSum(kernel), want: codes.Unauthenticated},
		"viewer token":     {conn: dial(t, &ccB, viewer), sum: hexSum(kernel), want: codes.PermissionDenied},
		"unknown content":  {conn: adminConn, sum: hexSum([]byte("nothing")), want: codes.NotFound},
		"malformed sha256": {conn: adminConn, sum: "../../pki/ca.key", want: codes.InvalidArgument},
		"upper-case hex":   {conn: peerConn, sum: strings.ToUpper(hexSum(kernel)), want: codes.InvalidArgument},
	} {
		t.Run(name, func(t *testing.T) {
			chunks, err := fetchAll(ctx, tc.conn, tc.sum)
			if status.Code(err) != tc.want || len(chunks) != 0 {
				t.Errorf("FetchArtifact: %d chunks, %v; want %v and none", len(chunks), err, tc.want)
			}
		})
	}
}

// liar is a peer appliance (a certificate of the fleet CA with the
// appliance identity) that serves what send makes of the real bytes.
func liar(t *testing.T, ca *Server, body []byte, send func(b []byte, stream grpc.ServerStreamingServer[fleetv1.ArtifactChunk]) error) string {
	t.Helper()
	cert, err := ca.ca.EnsureServerCert(t.TempDir(), []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))
	fleet.Register(srv, &fleet.Service{FetchArtifact: func(_ *fleetv1.FetchArtifactRequest, stream grpc.ServerStreamingServer[fleetv1.ArtifactChunk]) error {
		return send(body, stream)
	}})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// TestArtifactFromLyingPeer: a peer whose bytes are not the manifest's
// (other bytes, short, long, another size, a broken stream, silence) is
// refused with an error naming it, nothing it sent is kept, and the next
// peer is tried.
func TestArtifactFromLyingPeer(t *testing.T) {
	c := etcdtest.New(t, 3)
	a, b, _ := newFleetPair(t, c, "/liars")
	body := randomBytes(t, 2*artifactsync.ChunkSize+7)
	want := images.Artifact{Name: "vmlinuz", Kind: images.KindKernel, Size: int64(len(body)), SHA256: hexSum(body)}
	if _, err := images.Receive(a.catalogDir(), want, bytes.NewReader(body)); err != nil {
		t.Fatal(err)
	}
	chunk := func(stream grpc.ServerStreamingServer[fleetv1.ArtifactChunk], size int, data []byte) error {
		return stream.Send(&fleetv1.ArtifactChunk{Name: "vmlinuz", Size: uint64(size), Data: data})
	}
	for name, tc := range map[string]struct {
		send     func(b []byte, stream grpc.ServerStreamingServer[fleetv1.ArtifactChunk]) error
		says     string
		mismatch bool
	}{
		"other bytes": {send: func(b []byte, s grpc.ServerStreamingServer[fleetv1.ArtifactChunk]) error {
			return chunk(s, len(b), bytes.Repeat([]byte{0}, len(b)))
		}, says: "sha256", mismatch: true},
		"truncated": {send: func(b []byte, s grpc.ServerStreamingServer[fleetv1.ArtifactChunk]) error {
			return chunk(s, len(b), b[:len(b)/2])
		}, says: "truncated", mismatch: true},
		"longer": {send: func(b []byte, s grpc.ServerStreamingServer[fleetv1.ArtifactChunk]) error {
			if err := chunk(s, len(b), b); err != nil {
				return err
			}
			return s.Send(&fleetv1.ArtifactChunk{Data: []byte("more")})
		}, says: "more than", mismatch: true},
		"another size": {send: func(b []byte, s grpc.ServerStreamingServer[fleetv1.ArtifactChunk]) error {
			return chunk(s, len(b)+1, append(b, 0))
		}, says: "the fleet's catalog says", mismatch: true},
		"stream breaks": {send: func(b []byte, s grpc.ServerStreamingServer[fleetv1.ArtifactChunk]) error {
			if err := chunk(s, len(b), b[:100]); err != nil {
				return err
			}
			return status.Error(codes.Unavailable, "disk on fire")
		}, says: "disk on fire"},
		"silence": {send: func(b []byte, s grpc.ServerStreamingServer[fleetv1.ArtifactChunk]) error {
			if err := chunk(s, len(b), b[:100]); err != nil {
				return err
			}
			<-s.Context().Done()
			return nil
		}, says: "no data for"},
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			peer := liar(t, a, body, tc.send)
			dir := t.TempDir()
			f := artifactsync.New(artifactsync.Config{CatalogDir: dir, TLS: b.peerTLS(), Logger: b.log, Idle: 500 * time.Millisecond})
			fetched, err := f.Fetch(ctx, []images.Artifact{want}, []string{peer})
			if err == nil || len(fetched) != 0 {
				t.Fatalf("fetch from the liar: %v, %v", fetched, err)
			}
			if !strings.Contains(err.Error(), "peer "+peer) || !strings.Contains(err.Error(), tc.says) || errors.Is(err, images.ErrMismatch) != tc.mismatch {
				t.Errorf("error %q: want it to name peer %s, say %q, ErrMismatch=%v", err, peer, tc.says, tc.mismatch)
			}
			if left, _ := os.ReadDir(filepath.Join(dir, images.ContentDir)); len(left) != 0 {
				t.Errorf("the liar's bytes were kept: %v", left)
			}
			// The honest peer after the liar is asked next.
			fetched, err = f.Fetch(ctx, []images.Artifact{want}, []string{peer, a.Addr().String()})
			if err != nil || len(fetched) != 1 {
				t.Fatalf("fetch from the liar, then A: %v, %v", fetched, err)
			}
			if got, _ := os.ReadFile(fetched[0].Path); !bytes.Equal(got, body) {
				t.Error("the artifact fetched after the liar is not A's")
			}
		})
	}

	// A peer that is not an appliance (a node certificate, valid for the
	// name dialled) is not asked.
	nodePEM, keyPEM, err := a.ca.IssueNodeCert("localhost", auth.NodeOrganization)
	if err != nil {
		t.Fatal(err)
	}
	nodeCert, err := tls.X509KeyPair(nodePEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{nodeCert}})))
	fleet.Register(srv, &fleet.Service{FetchArtifact: func(_ *fleetv1.FetchArtifactRequest, s grpc.ServerStreamingServer[fleetv1.ArtifactChunk]) error {
		return s.Send(&fleetv1.ArtifactChunk{Name: "vmlinuz", Size: uint64(len(body)), Data: body})
	}})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()
	_, port, _ := net.SplitHostPort(lis.Addr().String())
	node := "localhost:" + port
	f := artifactsync.New(artifactsync.Config{CatalogDir: t.TempDir(), TLS: b.peerTLS(), Logger: b.log})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := f.Fetch(ctx, []images.Artifact{want}, []string{node}); err == nil || !strings.Contains(err.Error(), node) || !strings.Contains(err.Error(), "not the appliance's") {
		t.Errorf("fetch from a node posing as a peer: %v", err)
	}
}
