package appliance

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"time"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/auth"
	"github.com/corralhq/corral/internal/keyrate"
	"github.com/corralhq/corral/internal/lograte"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// AgentLimits rate-limit the agent edge (AgentService Register, Session
// and Join) per token and method, and per source address
// (docs/security.md, "Agent rate limits"): a per-boot token is public on
// the boot LAN, and each Register is a store write and an audit record.
// Zero fields take the defaults (DefaultAgentLimits); every field is a
// flag of corrald serve.
type AgentLimits struct {
	// PerToken calls a second, after a burst of TokenBurst, for one token
	// (or one node certificate) and one method: an agent's round of
	// retries (Register, then Session) costs one of each method's.
	PerToken   float64
	TokenBurst int
	// PerSource calls a second, after a burst of SourceBurst, from one
	// source IP address, whatever the tokens.
	PerSource   float64
	SourceBurst int
	// MaxKeys bounds each table of limiters (tokens, sources): past it the
	// key used least recently is forgotten.
	MaxKeys int
}

// DefaultAgentLimits are the agent limits of a zero AgentLimits. An agent
// makes two calls a boot (Register, Session) and a few more when its
// connection drops; a machine has one address.
func DefaultAgentLimits() AgentLimits {
	return AgentLimits{PerToken: 1, TokenBurst: 10, PerSource: 50, SourceBurst: 200, MaxKeys: 65536}
}

// agentMethods are the calls the limits apply to.
var agentMethods = map[string]bool{
	"/corral.node.v1.AgentService/Register": true,
	"/corral.node.v1.AgentService/Session":  true,
	"/corral.node.v1.AgentService/Join":     true,
}

// agentLimiter applies AgentLimits after the auth interceptor (it needs
// the principal): over a limit the call ends ResourceExhausted, counted
// (corral_agent_calls_limited_total) and logged at most every 10 s.
// ADMIN callers are not limited (an operator's hand or tests); the audit
// records the refusals at a bounded rate (package audit).
type agentLimiter struct {
	cfg             AgentLimits
	tokens, sources *keyrate.Table
	byToken, bySrc  atomic.Uint64
	logged          lograte.Counter
	log             *slog.Logger
	now             func() time.Time
}

func newAgentLimiter(cfg AgentLimits, log *slog.Logger) *agentLimiter {
	return &agentLimiter{cfg: cfg, log: cmp.Or(log, slog.New(slog.DiscardHandler)), now: time.Now,
		tokens:  keyrate.New(cfg.PerToken, cfg.TokenBurst, cfg.MaxKeys),
		sources: keyrate.New(cfg.PerSource, cfg.SourceBurst, cfg.MaxKeys)}
}

// check returns the ResourceExhausted status of a call over a limit, or
// nil.
func (l *agentLimiter) check(ctx context.Context, method string) error {
	if !agentMethods[method] {
		return nil
	}
	p, ok := auth.FromContext(ctx)
	if !ok || p.Role == authv1.Role_ROLE_ADMIN {
		return nil
	}
	now := l.now()
	src := ""
	if pr, ok := peer.FromContext(ctx); ok && pr.Addr != nil {
		src = pr.Addr.String()
		if h, _, err := net.SplitHostPort(src); err == nil {
			src = h
		}
	}
	if src != "" && !l.sources.Allow(src, now) {
		l.bySrc.Add(1)
		return l.refuse(method, p, src, "source address "+src, l.cfg.PerSource, l.cfg.SourceBurst, "--agent-rate-per-source")
	}
	key, who := "token:"+p.ID, "token "+p.ID
	if p.ID == "" {
		key, who = "cert:"+p.Subject, "node certificate "+p.Subject
	}
	if !l.tokens.Allow(method+" "+key, now) {
		l.byToken.Add(1)
		return l.refuse(method, p, src, who, l.cfg.PerToken, l.cfg.TokenBurst, "--agent-rate-per-token")
	}
	return nil
}

func (l *agentLimiter) refuse(method string, p auth.Principal, src, who string, perSecond float64, burst int, flag string) error {
	short := method[strings.LastIndex(method, "/")+1:]
	l.logged.Add(1, func(since int64) {
		l.log.Warn("agent call over its rate limit: refused", "method", short, "limited", who, "peer", src, "token_id", p.ID,
			"rate_per_s", perSecond, "burst", burst, "refused_since_last_log", since,
			"refused_by_token_total", l.byToken.Load(), "refused_by_source_total", l.bySrc.Load())
	})
	return status.Errorf(codes.ResourceExhausted, "%s: %s is over its rate limit (%g calls/s after a burst of %d, %s): retry later",
		short, who, perSecond, burst, flag)
}

func (l *agentLimiter) unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if err := l.check(ctx, info.FullMethod); err != nil {
			return nil, err
		}
		return h(ctx, req)
	}
}

func (l *agentLimiter) stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if err := l.check(ss.Context(), info.FullMethod); err != nil {
			return err
		}
		return h(srv, ss)
	}
}

// countInto exports the refusals to /metrics.
func (l *agentLimiter) countInto(c counterFuncs) {
	const name, help = "corral_agent_calls_limited_total", "Agent calls (Register, Session, Join) refused ResourceExhausted by the agent rate limits, by what was over its limit (token: one token or node certificate; source: one source address)."
	c.CounterFunc(name, help, map[string]string{"by": "token"}, l.byToken.Load)
	c.CounterFunc(name, help, map[string]string{"by": "source"}, l.bySrc.Load)
}

// counterFuncs is where components export their counts (package metrics).
type counterFuncs interface {
	CounterFunc(name, help string, labels map[string]string, read func() uint64)
}

// setDefaults validates the limits (errors name the flag) and fills zero
// fields with the defaults.
func (a *AgentLimits) setDefaults() error {
	d := DefaultAgentLimits()
	for _, f := range []struct {
		flag string
		v    *float64
		def  float64
	}{{"--agent-rate-per-token", &a.PerToken, d.PerToken}, {"--agent-rate-per-source", &a.PerSource, d.PerSource}} {
		if *f.v < 0 {
			return fmt.Errorf("%s %g: want a positive rate (calls a second)", f.flag, *f.v)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	for _, f := range []struct {
		flag string
		v    *int
		def  int
	}{{"--agent-burst-per-token", &a.TokenBurst, d.TokenBurst}, {"--agent-burst-per-source", &a.SourceBurst, d.SourceBurst},
		{"--agent-limiter-max-keys", &a.MaxKeys, d.MaxKeys}} {
		if *f.v < 0 {
			return fmt.Errorf("%s %d: want a positive number", f.flag, *f.v)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	return nil
}
