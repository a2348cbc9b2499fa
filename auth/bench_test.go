package auth

import (
	"context"
	"crypto/tls"
	"math/big"
	"net"
	"path/filepath"
	"testing"
	"time"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/api/clientconfig"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/auth/pki"
	"github.com/corralhq/corral/internal/nodeid"
	"github.com/corralhq/corral/store/bolt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// BenchmarkNodeCertificateCalls measures API round trips per second of a
// node calling with its certificate over one real TLS gRPC connection to a
// server with this package's interceptor, with the per-call revocation
// check (one bbolt Get on a list of 1,000 revoked serials) on and off.
// It prints, asserts nothing:
//
//	go test -run XXX -bench NodeCertificateCalls -benchtime 5s ./auth
func BenchmarkNodeCertificateCalls(b *testing.B) {
	for _, name := range []string{"revocation-off", "revocation-on"} {
		b.Run(name, func(b *testing.B) {
			dir := b.TempDir()
			st, err := bolt.Open(filepath.Join(dir, "corral.db"), bolt.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			ca, err := pki.EnsureCA(dir)
			if err != nil {
				b.Fatal(err)
			}
			rev := &Revocations{Store: st}
			ctx := context.Background()
			for i := range 1000 {
				// Revoked serials of other nodes, so the Get walks a real tree.
				e := &authv1.IssuedCertificates_Entry{Serial: big.NewInt(int64(i + 1)).Text(16), NotAfterUnix: time.Now().Add(time.Hour).Unix()}
				if err := rev.revoke(ctx, "old", e, "bench"); err != nil {
					b.Fatal(err)
				}
			}
			ic := &Interceptor{NodeCertificates: true}
			if name == "revocation-on" {
				ic.Certificates = rev
			}
			serverCert, err := ca.EnsureServerCert(dir, []string{"127.0.0.1"})
			if err != nil {
				b.Fatal(err)
			}
			srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{serverCert},
				ClientCAs: ca.Pool(), ClientAuth: tls.VerifyClientCertIfGiven, MinVersion: tls.VersionTLS12})),
				grpc.ChainUnaryInterceptor(ic.Unary()))
			poolv1.RegisterNodeServiceServer(srv, nodeServer{})
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			go srv.Serve(lis)
			defer srv.Stop()
			certPEM, keyPEM, err := ca.IssueNodeCert("node-1", nodeid.Organization)
			if err != nil {
				b.Fatal(err)
			}
			nodeCert, err := tls.X509KeyPair(certPEM, keyPEM)
			if err != nil {
				b.Fatal(err)
			}
			conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
				RootCAs: ca.Pool(), Certificates: []tls.Certificate{nodeCert}, MinVersion: tls.VersionTLS12,
				VerifyConnection: clientconfig.VerifyApplianceConnection})))
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			c := poolv1.NewNodeServiceClient(conn)
			if _, err := c.GetNode(ctx, &poolv1.GetNodeRequest{Name: "node-1"}); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := c.GetNode(ctx, &poolv1.GetNodeRequest{Name: "node-1"}); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "calls/s")
		})
	}
}

// BenchmarkRevocationCheck is the check alone: one Revocations.Check (a
// bbolt Get by serial, not found) per call.
//
//	go test -run XXX -bench RevocationCheck ./auth
func BenchmarkRevocationCheck(b *testing.B) {
	st, err := bolt.Open(filepath.Join(b.TempDir(), "corral.db"), bolt.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	rev := &Revocations{Store: st}
	ctx := context.Background()
	for i := range 1000 {
		e := &authv1.IssuedCertificates_Entry{Serial: big.NewInt(int64(i + 1)).Text(16), NotAfterUnix: time.Now().Add(time.Hour).Unix()}
		if err := rev.revoke(ctx, "old", e, "bench"); err != nil {
			b.Fatal(err)
		}
	}
	cert := testCert(1<<40, time.Now().Add(time.Hour))

	for b.Loop() {
		if err := rev.Check(ctx, cert); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAuthenticate is the bearer-token check every agent call makes:
// one Authenticate of a live per-boot token among 5,000 (a bbolt Get by
// id, SHA-256, a constant-time compare). It prints, asserts nothing:
//
//	go test -run XXX -bench Authenticate ./auth
func BenchmarkAuthenticate(b *testing.B) {
	st, err := bolt.Open(filepath.Join(b.TempDir(), "corral.db"), bolt.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	tk := &Tokens{Store: st}
	ctx := context.Background()
	toks := make([]string, 5000)
	for i := range toks {
		mac := net.HardwareAddr{0x52, 0x54, 0, byte(i >> 16), byte(i >> 8), byte(i)}.String()
		if toks[i], _, err = tk.IssueBoot(ctx, mac, "m-"+mac, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	i := 0
	for b.Loop() {
		if _, err := tk.Authenticate(ctx, toks[i%len(toks)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
