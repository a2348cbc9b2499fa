package node

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	hypervisorv1 "github.com/corralhq/corral/api/hypervisor/v1"
)

// TestSerialConsoleRefusals: a serial stream must name its VM first, and
// a VM the node does not have is NotFound. (A running VM's serial port is
// proved end to end in hypervisor/e2e: keys typed reach the guest.)
func TestSerialConsoleRefusals(t *testing.T) {
	s, err := NewServer(context.Background(), ServerConfig{DataDir: t.TempDir(), Accel: "tcg"})
	if err != nil {
		t.Fatal(err)
	}
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer()
	hypervisorv1.RegisterHypervisorServiceServer(gs, s)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient("passthrough:///node", grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := hypervisorv1.NewHypervisorServiceClient(conn)
	for name, tc := range map[string]struct {
		first *hypervisorv1.SerialInput
		want  codes.Code
	}{
		"data first":   {&hypervisorv1.SerialInput{Input: &hypervisorv1.SerialInput_Data{Data: []byte("x")}}, codes.InvalidArgument},
		"unknown vm":   {&hypervisorv1.SerialInput{Input: &hypervisorv1.SerialInput_Vm{Vm: "ghost"}}, codes.NotFound},
		"traversal vm": {&hypervisorv1.SerialInput{Input: &hypervisorv1.SerialInput_Vm{Vm: "../x"}}, codes.InvalidArgument},
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			st, err := c.SerialConsole(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Send(tc.first); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Recv(); code(err) != tc.want {
				t.Fatalf("%v, want %v", err, tc.want)
			}
		})
	}
}
