package main

import (
	"github.com/corralhq/corral/appliance"
	boothttp "github.com/corralhq/corral/boot/http"
	"github.com/corralhq/corral/boot/tftp"
	"github.com/corralhq/corral/inventory"
	"github.com/spf13/pflag"
)

// addLimitFlags registers the resource limits of `corrald serve`: what a
// client on the boot LAN (or anywhere that reaches the API) can hold. Each
// also reads CORRAL_<NAME> and the --config file (flagconf); corrald logs
// a line, at most every 10 s, when one bites. 0 means the default; server
// checks them, naming the flag.
func addLimitFlags(f *pflag.FlagSet, c *appliance.LimitsConfig) {
	h, t, g, tl, ag, r := boothttp.DefaultLimits(), tftp.DefaultLimits(), appliance.DefaultGRPCLimits(), appliance.DefaultTimelineLimits(), appliance.DefaultAgentLimits(), inventory.DefaultFactCaps

	f.DurationVar(&c.HTTP.ReadHeaderTimeout, "http-read-header-timeout", h.ReadHeaderTimeout, "boot HTTP: a client must send its request line and headers within this (slowloris) (env CORRAL_HTTP_READ_HEADER_TIMEOUT)")
	f.DurationVar(&c.HTTP.ReadTimeout, "http-read-timeout", h.ReadTimeout, "boot HTTP: a client must send its whole request, body included, within this (env CORRAL_HTTP_READ_TIMEOUT)")
	f.DurationVar(&c.HTTP.WriteStall, "http-write-stall-timeout", h.WriteStall, "boot HTTP: a client that takes less than 256 KiB of a response in this long is cut; a download that keeps flowing is never cut, however long (env CORRAL_HTTP_WRITE_STALL_TIMEOUT)")
	f.DurationVar(&c.HTTP.IdleTimeout, "http-idle-timeout", h.IdleTimeout, "boot HTTP: a keep-alive connection with no request for this long is closed (env CORRAL_HTTP_IDLE_TIMEOUT)")
	f.IntVar(&c.HTTP.MaxHeaderBytes, "http-max-header-bytes", h.MaxHeaderBytes, "boot HTTP: request line and headers larger than this are answered 431 (env CORRAL_HTTP_MAX_HEADER_BYTES)")
	f.IntVar(&c.HTTP.MaxConns, "http-max-conns", h.MaxConns, "boot HTTP: open connections at most; more are answered 503 and closed (env CORRAL_HTTP_MAX_CONNS)")
	f.IntVar(&c.HTTP.MaxConnsPerIP, "http-max-conns-per-ip", h.MaxConnsPerIP, "boot HTTP: open connections from one address at most; more are answered 503 and closed (env CORRAL_HTTP_MAX_CONNS_PER_IP)")

	f.DurationVar(&c.TFTP.Timeout, "tftp-timeout", t.Timeout, "TFTP: a block not acknowledged within this is sent again (env CORRAL_TFTP_TIMEOUT)")
	f.IntVar(&c.TFTP.Retries, "tftp-retries", t.Retries, "TFTP: times a block is sent again before the transfer is dropped (env CORRAL_TFTP_RETRIES)")
	f.IntVar(&c.TFTP.MaxTransfers, "tftp-max-transfers", t.MaxTransfers, "TFTP: transfers at once at most; more are answered with a TFTP error (env CORRAL_TFTP_MAX_TRANSFERS)")
	f.IntVar(&c.TFTP.MaxTransfersPerIP, "tftp-max-transfers-per-ip", t.MaxTransfersPerIP, "TFTP: transfers at once to one address at most; more are answered with a TFTP error (env CORRAL_TFTP_MAX_TRANSFERS_PER_IP)")
	f.DurationVar(&c.TFTP.TransferTimeout, "tftp-transfer-timeout", t.TransferTimeout, "TFTP: a transfer still running after this is cut with a TFTP error (env CORRAL_TFTP_TRANSFER_TIMEOUT)")

	f.IntVar(&c.GRPC.MaxRecvMsgBytes, "grpc-max-recv-bytes", g.MaxRecvMsgBytes, "API: largest request message; larger ones fail with ResourceExhausted (env CORRAL_GRPC_MAX_RECV_BYTES)")
	f.IntVar(&c.GRPC.MaxHeaderBytes, "grpc-max-header-bytes", g.MaxHeaderBytes, "API: largest request metadata (env CORRAL_GRPC_MAX_HEADER_BYTES)")
	f.IntVar(&c.GRPC.MaxConcurrentStreams, "grpc-max-concurrent-streams", g.MaxConcurrentStreams, "API: calls in flight on one connection at most (env CORRAL_GRPC_MAX_CONCURRENT_STREAMS)")
	f.IntVar(&c.GRPC.MaxConns, "grpc-max-conns", g.MaxConns, "API: open connections at most; more are closed at accept (env CORRAL_GRPC_MAX_CONNS)")
	f.IntVar(&c.GRPC.MaxConnsPerIP, "grpc-max-conns-per-ip", g.MaxConnsPerIP, "API: open connections from one address at most; more are closed at accept (env CORRAL_GRPC_MAX_CONNS_PER_IP)")
	f.DurationVar(&c.GRPC.HandshakeTimeout, "grpc-handshake-timeout", g.HandshakeTimeout, "API: a new connection must finish its TLS handshake within this (env CORRAL_GRPC_HANDSHAKE_TIMEOUT)")
	f.DurationVar(&c.GRPC.KeepaliveTime, "grpc-keepalive-time", g.KeepaliveTime, "API: a connection silent this long is pinged (env CORRAL_GRPC_KEEPALIVE_TIME)")
	f.DurationVar(&c.GRPC.KeepaliveTimeout, "grpc-keepalive-timeout", g.KeepaliveTimeout, "API: a ping not answered within this closes the connection: a dead agent's session ends within keepalive time + timeout (env CORRAL_GRPC_KEEPALIVE_TIMEOUT)")
	f.DurationVar(&c.GRPC.KeepaliveMinTime, "grpc-keepalive-min-time", g.KeepaliveMinTime, "API: clients that ping more often than this are disconnected (env CORRAL_GRPC_KEEPALIVE_MIN_TIME)")
	f.DurationVar(&c.GRPC.MaxConnectionIdle, "grpc-max-connection-idle", g.MaxConnectionIdle, "API: a connection with no call in flight for this long is closed (env CORRAL_GRPC_MAX_CONNECTION_IDLE)")

	f.IntVar(&c.Timeline.PerMAC, "timeline-per-mac", tl.PerMAC, "boot timeline: entries kept per MAC; the oldest go first (env CORRAL_TIMELINE_PER_MAC)")
	f.IntVar(&c.Timeline.MaxEntries, "timeline-max-entries", tl.MaxEntries, "boot timeline: entries kept across all MACs; the timelines of the MACs written to least recently go first (env CORRAL_TIMELINE_MAX_ENTRIES)")
	f.IntVar(&c.Timeline.Queue, "timeline-queue", tl.Queue, "boot timeline: entries waiting to be written at most; more are dropped and counted (env CORRAL_TIMELINE_QUEUE)")
	f.IntVar(&c.Timeline.DetailBytes, "timeline-max-detail-bytes", tl.DetailBytes, "boot timeline: an entry's detail is cut to this (env CORRAL_TIMELINE_MAX_DETAIL_BYTES)")
	f.IntVar(&c.Timeline.Attrs, "timeline-max-attrs", tl.Attrs, "boot timeline: attributes per entry at most (env CORRAL_TIMELINE_MAX_ATTRS)")
	f.IntVar(&c.Timeline.AttrBytes, "timeline-max-attr-bytes", tl.AttrBytes, "boot timeline: an attribute value is cut to this (env CORRAL_TIMELINE_MAX_ATTR_BYTES)")
	f.IntVar(&c.Timeline.BootLAN.Limit, "timeline-boot-lan-per-mac", tl.BootLAN.Limit, "boot timeline: entries of unauthenticated boot requests (DHCP, TFTP, boot HTTP) kept per MAC, apart from its lifecycle, operator and security entries, which they never push out (env CORRAL_TIMELINE_BOOT_LAN_PER_MAC)")
	f.Float64Var(&c.Timeline.BootLAN.PerMAC, "timeline-boot-lan-rate-per-mac", tl.BootLAN.PerMAC, "boot timeline: entries of unauthenticated boot requests recorded a second for one MAC after its burst; more are dropped and counted (env CORRAL_TIMELINE_BOOT_LAN_RATE_PER_MAC)")
	f.IntVar(&c.Timeline.BootLAN.MACBurst, "timeline-boot-lan-burst-per-mac", tl.BootLAN.MACBurst, "boot timeline: entries of unauthenticated boot requests recorded at once for one MAC (env CORRAL_TIMELINE_BOOT_LAN_BURST_PER_MAC)")
	f.Float64Var(&c.Timeline.BootLAN.PerSource, "timeline-boot-lan-rate-per-source", tl.BootLAN.PerSource, "boot timeline: entries of unauthenticated TFTP and boot HTTP requests recorded a second for one source address after its burst; more are dropped and counted (env CORRAL_TIMELINE_BOOT_LAN_RATE_PER_SOURCE)")
	f.IntVar(&c.Timeline.BootLAN.SourceBurst, "timeline-boot-lan-burst-per-source", tl.BootLAN.SourceBurst, "boot timeline: entries of unauthenticated TFTP and boot HTTP requests recorded at once for one source address (env CORRAL_TIMELINE_BOOT_LAN_BURST_PER_SOURCE)")

	f.Float64Var(&c.Agent.PerToken, "agent-rate-per-token", ag.PerToken, "agent calls (Register, Session, Join): calls a second of one method one token or node certificate may make after its burst; more fail with ResourceExhausted (env CORRAL_AGENT_RATE_PER_TOKEN)")
	f.IntVar(&c.Agent.TokenBurst, "agent-burst-per-token", ag.TokenBurst, "agent calls: calls of one method one token or node certificate may make at once (env CORRAL_AGENT_BURST_PER_TOKEN)")
	f.Float64Var(&c.Agent.PerSource, "agent-rate-per-source", ag.PerSource, "agent calls: calls a second one source address may make after its burst, whatever its tokens; more fail with ResourceExhausted (env CORRAL_AGENT_RATE_PER_SOURCE)")
	f.IntVar(&c.Agent.SourceBurst, "agent-burst-per-source", ag.SourceBurst, "agent calls: calls one source address may make at once (env CORRAL_AGENT_BURST_PER_SOURCE)")
	f.IntVar(&c.Agent.MaxKeys, "agent-limiter-max-keys", ag.MaxKeys, "agent calls: tokens and source addresses each tracked at most; past it the one used least recently is forgotten (env CORRAL_AGENT_LIMITER_MAX_KEYS)")

	f.IntVar(&c.Reports.ReportBytes, "max-report-bytes", r.ReportBytes, "agent reports: a fact report larger than this (encoded) is refused (InvalidArgument) and counted in corral_report_refusals_total (env CORRAL_MAX_REPORT_BYTES)")
	f.IntVar(&c.Reports.Disks, "max-report-disks", r.Disks, "agent reports: a report listing more disks is refused (env CORRAL_MAX_REPORT_DISKS)")
	f.IntVar(&c.Reports.DIMMs, "max-report-dimms", r.DIMMs, "agent reports: a report listing more memory modules is refused (env CORRAL_MAX_REPORT_DIMMS)")
	f.IntVar(&c.Reports.NICs, "max-report-nics", r.NICs, "agent reports: a report listing more network interfaces is refused (env CORRAL_MAX_REPORT_NICS)")
	f.IntVar(&c.Reports.PCIDevices, "max-report-pci-devices", r.PCIDevices, "agent reports: a report listing more PCI devices (or more without a driver) is refused (env CORRAL_MAX_REPORT_PCI_DEVICES)")
	f.IntVar(&c.Reports.HistoryEntries, "max-fact-history-entries", r.HistoryEntries, "fact history: changes kept per machine; the oldest go first (env CORRAL_MAX_FACT_HISTORY_ENTRIES)")
	f.IntVar(&c.Reports.HistoryBytes, "max-fact-history-bytes", r.HistoryBytes, "fact history: bytes of changes kept per machine; the oldest go first (env CORRAL_MAX_FACT_HISTORY_BYTES)")
}
