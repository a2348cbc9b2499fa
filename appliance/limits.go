package appliance

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net"
	"time"

	"github.com/corralhq/corral/boot/connlimit"
	boothttp "github.com/corralhq/corral/boot/http"
	"github.com/corralhq/corral/boot/tftp"
	"github.com/corralhq/corral/internal/lograte"
	"github.com/corralhq/corral/inventory"
	boottimeline "github.com/corralhq/corral/inventory/timeline"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// LimitsConfig bounds what clients can hold of the appliance: the boot LAN
// is hostile (docs/security.md, "Every resource bounded"), and anything on it can reach
// the boot servers and the gRPC API. Zero fields take the defaults; every
// field is a flag of corrald serve.
type LimitsConfig struct {
	HTTP     boothttp.Limits
	TFTP     tftp.Limits
	GRPC     GRPCLimits
	Timeline TimelineLimits
	Agent    AgentLimits
	// Reports cap an agent's fact report and a machine's fact history
	// (docs/security.md, "Report caps").
	Reports inventory.FactCaps
}

// GRPCLimits bound the gRPC API's clients.
//
// One message size for every method: no request carries bulk data (images
// and volumes move by URL, fetched by the node), the largest is an agent's
// facts report (tens of KiB), so 1 MiB serves every method and nothing
// needs a class of its own.
type GRPCLimits struct {
	// MaxRecvMsgBytes caps a request message (ResourceExhausted beyond);
	// MaxHeaderBytes a request's metadata.
	MaxRecvMsgBytes int
	MaxHeaderBytes  int
	// MaxConcurrentStreams caps the calls in flight on one connection.
	MaxConcurrentStreams int
	// MaxConns caps open connections, MaxConnsPerIP those from one source
	// address; a connection over a cap is closed at accept.
	MaxConns      int
	MaxConnsPerIP int
	// HandshakeTimeout bounds a new connection's TLS handshake and HTTP/2
	// preface.
	HandshakeTimeout time.Duration
	// KeepaliveTime and KeepaliveTimeout: a connection silent for
	// KeepaliveTime is pinged and closed without an answer within
	// KeepaliveTimeout, so a dead agent's session ends within their sum.
	KeepaliveTime    time.Duration
	KeepaliveTimeout time.Duration
	// KeepaliveMinTime is the shortest ping interval a client may use
	// (pinging faster gets the connection closed); pings without calls in
	// flight are allowed.
	KeepaliveMinTime time.Duration
	// MaxConnectionIdle closes a connection with no call in flight for this
	// long.
	MaxConnectionIdle time.Duration
}

// DefaultGRPCLimits are the gRPC limits of a zero GRPCLimits: a large
// datacenter's agents and nodes hold one connection each.
func DefaultGRPCLimits() GRPCLimits {
	return GRPCLimits{
		MaxRecvMsgBytes:      1 << 20,
		MaxHeaderBytes:       16 << 10,
		MaxConcurrentStreams: 100,
		MaxConns:             16384,
		MaxConnsPerIP:        32,
		HandshakeTimeout:     10 * time.Second,
		KeepaliveTime:        20 * time.Second,
		KeepaliveTimeout:     10 * time.Second,
		KeepaliveMinTime:     10 * time.Second,
		MaxConnectionIdle:    5 * time.Minute,
	}
}

// TimelineLimits bound the boot timeline (package inventory/timeline).
type TimelineLimits struct {
	// PerMAC entries are kept per MAC, MaxEntries across all MACs (the
	// least recently written MACs' timelines go first).
	PerMAC     int
	MaxEntries int
	// Queue entries may wait to be written; more are dropped and counted.
	Queue int
	// DetailBytes, Attrs and AttrBytes cut each entry.
	DetailBytes int
	Attrs       int
	AttrBytes   int
	// BootLAN bounds the entries of the boot LAN's unauthenticated
	// requests (DHCP, TFTP, boot HTTP): their own per-MAC cap, so they
	// never push out a machine's lifecycle, operator or security entries,
	// and rates per MAC and per source address.
	BootLAN inventory.TimelineBootLAN
}

// DefaultTimelineLimits are the timeline limits of a zero TimelineLimits.
func DefaultTimelineLimits() TimelineLimits {
	return TimelineLimits{
		PerMAC: inventory.DefaultTimelineLimit, MaxEntries: inventory.DefaultTimelineMaxEntries, Queue: inventory.DefaultTimelineQueue,
		DetailBytes: inventory.DefaultTimelineDetailBytes, Attrs: inventory.DefaultTimelineAttrs, AttrBytes: inventory.DefaultTimelineAttrBytes,
		BootLAN: inventory.TimelineBootLAN{Limit: boottimeline.DefaultBootLANLimit,
			PerMAC: boottimeline.DefaultBootLANPerMAC, MACBurst: boottimeline.DefaultBootLANMACBurst,
			PerSource: boottimeline.DefaultBootLANPerSource, SourceBurst: boottimeline.DefaultBootLANSourceBurst},
	}
}

// setDefaults checks every limit (errors name the flag) and fills zero
// fields with the defaults.
func (c *LimitsConfig) setDefaults() error {
	if err := c.HTTP.Validate(); err != nil {
		return err
	}
	if err := c.TFTP.Validate(); err != nil {
		return err
	}
	c.HTTP, c.TFTP = c.HTTP.WithDefaults(), c.TFTP.WithDefaults()
	if err := c.Agent.setDefaults(); err != nil {
		return err
	}

	g, dg := &c.GRPC, DefaultGRPCLimits()
	for _, d := range []struct {
		flag string
		v    *time.Duration
		def  time.Duration
	}{
		{"--grpc-handshake-timeout", &g.HandshakeTimeout, dg.HandshakeTimeout},
		{"--grpc-keepalive-time", &g.KeepaliveTime, dg.KeepaliveTime},
		{"--grpc-keepalive-timeout", &g.KeepaliveTimeout, dg.KeepaliveTimeout},
		{"--grpc-keepalive-min-time", &g.KeepaliveMinTime, dg.KeepaliveMinTime},
		{"--grpc-max-connection-idle", &g.MaxConnectionIdle, dg.MaxConnectionIdle},
	} {
		if err := fillDuration(d.flag, d.v, d.def); err != nil {
			return err
		}
	}
	tl, dt := &c.Timeline, DefaultTimelineLimits()
	for _, n := range []struct {
		flag string
		v    *int
		def  int
	}{
		{"--grpc-max-recv-bytes", &g.MaxRecvMsgBytes, dg.MaxRecvMsgBytes},
		{"--grpc-max-header-bytes", &g.MaxHeaderBytes, dg.MaxHeaderBytes},
		{"--grpc-max-concurrent-streams", &g.MaxConcurrentStreams, dg.MaxConcurrentStreams},
		{"--grpc-max-conns", &g.MaxConns, dg.MaxConns},
		{"--grpc-max-conns-per-ip", &g.MaxConnsPerIP, dg.MaxConnsPerIP},
		{"--timeline-per-mac", &tl.PerMAC, dt.PerMAC},
		{"--timeline-max-entries", &tl.MaxEntries, dt.MaxEntries},
		{"--timeline-queue", &tl.Queue, dt.Queue},
		{"--timeline-max-detail-bytes", &tl.DetailBytes, dt.DetailBytes},
		{"--timeline-max-attrs", &tl.Attrs, dt.Attrs},
		{"--timeline-max-attr-bytes", &tl.AttrBytes, dt.AttrBytes},
		{"--timeline-boot-lan-per-mac", &tl.BootLAN.Limit, dt.BootLAN.Limit},
		{"--timeline-boot-lan-burst-per-mac", &tl.BootLAN.MACBurst, dt.BootLAN.MACBurst},
		{"--timeline-boot-lan-burst-per-source", &tl.BootLAN.SourceBurst, dt.BootLAN.SourceBurst},
	} {
		if *n.v < 0 {
			return fmt.Errorf("%s %d: want a positive number", n.flag, *n.v)
		}
		if *n.v == 0 {
			*n.v = n.def
		}
	}
	for _, r := range []struct {
		flag string
		v    *float64
		def  float64
	}{
		{"--timeline-boot-lan-rate-per-mac", &tl.BootLAN.PerMAC, dt.BootLAN.PerMAC},
		{"--timeline-boot-lan-rate-per-source", &tl.BootLAN.PerSource, dt.BootLAN.PerSource},
	} {
		if *r.v < 0 {
			return fmt.Errorf("%s %g: want a positive rate (entries a second)", r.flag, *r.v)
		}
		if *r.v == 0 {
			*r.v = r.def
		}
	}
	if err := c.checkReports(); err != nil {
		return err
	}
	switch {
	case g.MaxConnsPerIP > g.MaxConns:
		return fmt.Errorf("--grpc-max-conns-per-ip %d is above --grpc-max-conns %d", g.MaxConnsPerIP, g.MaxConns)
	case g.MaxConcurrentStreams > math.MaxUint32:
		return fmt.Errorf("--grpc-max-concurrent-streams %d: at most %d", g.MaxConcurrentStreams, uint32(math.MaxUint32))
	case tl.MaxEntries < tl.PerMAC:
		return fmt.Errorf("--timeline-max-entries %d is below --timeline-per-mac %d", tl.MaxEntries, tl.PerMAC)
	case tl.Attrs < 2:
		return fmt.Errorf("--timeline-max-attrs %d: at least 2 (one says how many were cut)", tl.Attrs)
	}
	return nil
}

// checkReports fills the report caps' zero fields and refuses a negative
// cap or one above inventory's ceiling.
func (c *LimitsConfig) checkReports() error {
	r, d := &c.Reports, inventory.DefaultFactCaps
	for _, n := range []struct {
		flag      string
		v         *int
		def, ceil int
	}{
		{"--max-report-bytes", &r.ReportBytes, d.ReportBytes, inventory.MaxFactsBytes},
		{"--max-report-disks", &r.Disks, d.Disks, inventory.MaxDisks},
		{"--max-report-dimms", &r.DIMMs, d.DIMMs, inventory.MaxDIMMs},
		{"--max-report-nics", &r.NICs, d.NICs, inventory.MaxNICs},
		{"--max-report-pci-devices", &r.PCIDevices, d.PCIDevices, inventory.MaxPCIDevices},
		{"--max-fact-history-entries", &r.HistoryEntries, d.HistoryEntries, 0},
		{"--max-fact-history-bytes", &r.HistoryBytes, d.HistoryBytes, 0},
	} {
		switch {
		case *n.v < 0:
			return fmt.Errorf("%s %d: want a positive number", n.flag, *n.v)
		case *n.v == 0:
			*n.v = n.def
		case n.ceil > 0 && *n.v > n.ceil:
			return fmt.Errorf("%s %d: at most %d", n.flag, *n.v, n.ceil)
		}
	}
	return nil
}

func fillDuration(flag string, v *time.Duration, def time.Duration) error {
	if *v < 0 {
		return fmt.Errorf("%s %s: want a positive duration", flag, *v)
	}
	if *v == 0 {
		*v = def
	}
	return nil
}

// inventoryConfig sets c's timeline limits.
func (t TimelineLimits) inventoryConfig(c inventory.Config) inventory.Config {
	c.TimelineLimit, c.TimelineMaxEntries, c.TimelineQueue = t.PerMAC, t.MaxEntries, t.Queue
	c.TimelineDetailBytes, c.TimelineAttrs, c.TimelineAttrBytes = t.DetailBytes, t.Attrs, t.AttrBytes
	c.TimelineBootLAN = t.BootLAN
	return c
}

// listener caps the API listener's connections (boot/connlimit; closed at
// accept, before the TLS handshake).
func (g GRPCLimits) listener(l net.Listener, log *slog.Logger) net.Listener {
	return connlimit.New(l, connlimit.Config{MaxConns: g.MaxConns, MaxConnsPerIP: g.MaxConnsPerIP, Name: "grpc", Logger: log})
}

// serverOptions are the gRPC server's limits, and a stats handler that
// logs (at most once per 10 s, with a count) calls that ended
// ResourceExhausted: a message over the size limit, or any other limit a
// handler enforces.
func (g GRPCLimits) serverOptions(log *slog.Logger) []grpc.ServerOption {
	h := &exhaustedLog{log: log}
	h.n.Interval = connlimit.LogEvery
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(g.MaxRecvMsgBytes),
		grpc.MaxHeaderListSize(uint32(g.MaxHeaderBytes)),
		grpc.MaxConcurrentStreams(uint32(g.MaxConcurrentStreams)),
		grpc.ConnectionTimeout(g.HandshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: g.KeepaliveTime, Timeout: g.KeepaliveTimeout, MaxConnectionIdle: g.MaxConnectionIdle}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: g.KeepaliveMinTime, PermitWithoutStream: true}),
		grpc.StatsHandler(h),
	}
}

// exhaustedLog is a stats.Handler that logs calls ended ResourceExhausted.
type exhaustedLog struct {
	log *slog.Logger
	n   lograte.Counter
}

type methodKey struct{}

func (h *exhaustedLog) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	return context.WithValue(ctx, methodKey{}, info.FullMethodName)
}

func (h *exhaustedLog) HandleRPC(ctx context.Context, s stats.RPCStats) {
	end, ok := s.(*stats.End)
	if !ok || status.Code(end.Error) != codes.ResourceExhausted {
		return
	}
	h.n.Add(1, func(since int64) {
		addr := ""
		if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
			addr = p.Addr.String()
		}
		method, _ := ctx.Value(methodKey{}).(string)
		h.log.Warn("grpc call refused: limit reached", "method", method, "peer", addr, "err", status.Convert(end.Error).Message(),
			"refused_since_last_log", since)
	})
}

func (h *exhaustedLog) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

func (h *exhaustedLog) HandleConn(context.Context, stats.ConnStats) {}
