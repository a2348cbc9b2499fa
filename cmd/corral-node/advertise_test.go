//go:build !corral_discovery

package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/api/clientconfig"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	"github.com/corralhq/corral/appliance"
	"github.com/corralhq/corral/auth"
	apptest "github.com/corralhq/corral/testsupport/appliance"
	"github.com/corralhq/corral/testsupport/syncbuf"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
)

type recordingRegistry struct{ got []string }

func (r *recordingRegistry) ApplyNode(_ context.Context, in *poolv1.ApplyNodeRequest, _ ...grpc.CallOption) (*poolv1.Node, error) {
	r.got = append(r.got, in.GetAddress())
	return &poolv1.Node{Name: in.GetName(), Address: in.GetAddress()}, nil
}

func TestAddressedRegistry(t *testing.T) {
	for name, tc := range map[string]struct {
		address string // in the request
		route   string // "" fails
		want    []string
		err     string
	}{
		"fills the route's address":    {route: "10.0.0.7", want: []string{"10.0.0.7"}},
		"keeps an address already set": {address: "192.0.2.9", want: []string{"192.0.2.9"}},
		"no route: nothing sent":       {err: "not registering: no address to advertise (the node listens on every address and has no route to the appliance at appliance:20180: network is unreachable); set --advertise ADDRESS"},
	} {
		t.Run(name, func(t *testing.T) {
			inner := &recordingRegistry{}
			r := &addressedRegistry{Registry: inner, current: func() string { return "appliance:20180" }, log: slog.New(slog.DiscardHandler),
				route: func(context.Context, string) (netip.Addr, error) {
					if tc.route == "" {
						return netip.Addr{}, errors.New("network is unreachable")
					}
					return netip.MustParseAddr(tc.route), nil
				}}
			_, err := r.ApplyNode(context.Background(), &poolv1.ApplyNodeRequest{Name: "n1", Address: tc.address})
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, inner.got); diff != "" {
				t.Errorf("sent addresses (-want +got):\n%s", diff)
			}
		})
	}
}

func TestListensEverywhere(t *testing.T) {
	for listen, want := range map[string]bool{
		":20181": true, "0.0.0.0:20181": true, "[::]:20181": true, ":0": true,
		"10.0.0.5:20181": false, "node1:20181": false, "[::1]:20181": false, "garbage": false,
	} {
		if got := listensEverywhere(listen); got != want {
			t.Errorf("listensEverywhere(%q) = %v, want %v", listen, got, want)
		}
	}
}

// TestHypervisorAdvertisesRoute runs `corral-node hypervisor` with its
// listen address on every address (as the default :20181 is) against a
// real appliance on loopback: the Node registers READY with the address
// the node reaches the appliance from and the port it listens on, and the
// appliance's address for it answers.
func TestHypervisorAdvertisesRoute(t *testing.T) {
	if testing.Short() {
		t.Skip("starts corrald and corral-node")
	}
	a := apptest.Start(t, appliance.Config{Logger: slog.New(slog.DiscardHandler)})
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, a.Server.CA().CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	tok, _, err := a.Server.Tokens().CreateBound(context.Background(), auth.TokenSpec{Role: authv1.Role_ROLE_NODE, Description: "advertise test", Node: "hv1"})
	if err != nil {
		t.Fatal(err)
	}
	// A free port on every address: the listen host is unspecified.
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()

	ctx, cancel := context.WithCancel(context.Background())
	logs := &syncbuf.Buffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"hypervisor", "--name", "hv1", "--join", a.Server.Addr().String(), "--token", tok, "--ca-cert", caFile,
			"--data-dir", filepath.Join(dir, "node"), "--listen", ":" + strconv.Itoa(port), "--accel", "tcg"}, io.Discard, logs)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("corral-node hypervisor: %v\n%s", err, logs)
		}
	})

	cc, err := clientconfig.Load(a.AdminConf)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := clientconfig.Dial(cc)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	nodes := poolv1.NewNodeServiceClient(conn)
	var n *poolv1.Node
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if n, err = nodes.GetNode(ctx, &poolv1.GetNodeRequest{Name: "hv1"}); err == nil && n.GetState() == poolv1.Node_READY {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node hv1 not READY after 30s: %v %v\n%s", n, err, logs)
		}
	}
	if n.GetAddress() != "127.0.0.1" || n.GetHypervisorPort() != uint32(port) {
		t.Fatalf("node address %q port %d, want 127.0.0.1 (the address toward the appliance) port %d\n%s", n.GetAddress(), n.GetHypervisorPort(), port, logs)
	}
	if !strings.Contains(logs.String(), "advertising the address this node reaches the appliance from") {
		t.Errorf("the node does not say which address it advertises:\n%s", logs)
	}
	c, err := net.DialTimeout("tcp", net.JoinHostPort(n.GetAddress(), strconv.Itoa(int(n.GetHypervisorPort()))), 5*time.Second)
	if err != nil {
		t.Fatalf("the advertised address does not answer: %v", err)
	}
	c.Close()
}
