package appliance

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/auth"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

func TestAgentLimits(t *testing.T) {
	cfg := AgentLimits{PerToken: 1, TokenBurst: 3, PerSource: 1, SourceBurst: 5}
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	l := newAgentLimiter(cfg, nil)
	now := time.Unix(1_000_000, 0)
	l.now = func() time.Time { return now }
	const register = "/corral.node.v1.AgentService/Register"
	call := func(id, src string, role authv1.Role) error {
		ctx := auth.NewContext(context.Background(), auth.Principal{Role: role, ID: id})
		ctx = peer.NewContext(ctx, &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(src), Port: 40000}})
		return l.check(ctx, register)
	}
	for i := range 3 {
		if err := call("tok-a", "10.0.0.1", authv1.Role_ROLE_AGENT); err != nil {
			t.Fatalf("call %d of the burst: %v", i, err)
		}
	}
	err := call("tok-a", "10.0.0.1", authv1.Role_ROLE_AGENT)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "token tok-a is over its rate limit") {
		t.Fatalf("4th call with one token: %v; want ResourceExhausted naming the token", err)
	}
	// Another token from the same address: its own bucket, until the
	// address's is empty (5 calls, the refused one counted).
	if err := call("tok-b", "10.0.0.1", authv1.Role_ROLE_AGENT); err != nil {
		t.Fatalf("5th call from one address, another token: %v", err)
	}
	err = call("tok-c", "10.0.0.1", authv1.Role_ROLE_AGENT)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "source address 10.0.0.1") {
		t.Fatalf("6th call from one address: %v; want ResourceExhausted naming the address", err)
	}
	if err := call("tok-d", "10.0.0.2", authv1.Role_ROLE_AGENT); err != nil {
		t.Fatalf("another address: %v", err)
	}
	for range 20 {
		if err := call("admin", "10.0.0.1", authv1.Role_ROLE_ADMIN); err != nil {
			t.Fatalf("an admin is not limited: %v", err)
		}
	}
	// Each method has its own bucket per token: an agent's retry round
	// (Register, then Session) costs one of each.
	sctx := peer.NewContext(auth.NewContext(context.Background(), auth.Principal{Role: authv1.Role_ROLE_AGENT, ID: "tok-a"}),
		&peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP("10.0.0.9"), Port: 40000}})
	if err := l.check(sctx, "/corral.node.v1.AgentService/Session"); err != nil {
		t.Fatalf("Session with a token whose Register bucket is empty: %v", err)
	}
	ctx := auth.NewContext(context.Background(), auth.Principal{Role: authv1.Role_ROLE_AGENT, ID: "tok-a"})
	if err := l.check(ctx, "/corral.inventory.v1.MachineService/ListMachines"); err != nil {
		t.Fatalf("other methods are not limited: %v", err)
	}
	if l.byToken.Load() != 1 || l.bySrc.Load() != 1 {
		t.Errorf("counted %d by token, %d by source; want 1 and 1", l.byToken.Load(), l.bySrc.Load())
	}
	now = now.Add(time.Second)
	if err := call("tok-a", "10.0.0.3", authv1.Role_ROLE_AGENT); err != nil {
		t.Fatalf("a second later: %v", err)
	}
}

func TestAgentLimitsRefuseNegative(t *testing.T) {
	for flag, c := range map[string]AgentLimits{
		"--agent-rate-per-token":   {PerToken: -1},
		"--agent-burst-per-source": {SourceBurst: -1},
		"--agent-limiter-max-keys": {MaxKeys: -2},
	} {
		if err := c.setDefaults(); err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("%+v: %v; want an error naming %s", c, err, flag)
		}
	}
}
