package main

import (
	"github.com/corralhq/corral/appliance"
	boothttp "github.com/corralhq/corral/boot/http"
	"github.com/corralhq/corral/boot/tftp"
	"github.com/spf13/cobra"
)

// addLimitFlags registers the resource limits of `corrald serve`: what a
// client on the boot LAN (or anywhere that reaches the API) can hold. Each
// also reads CORRAL_<NAME> and the --config file (flagconf); corrald logs
// a line, at most every 10 s, when one bites. 0 means the default.
func addLimitFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	h, t, g, tl := boothttp.DefaultLimits(), tftp.DefaultLimits(), appliance.DefaultGRPCLimits(), appliance.DefaultTimelineLimits()

	f.Duration("http-read-header-timeout", h.ReadHeaderTimeout, "boot HTTP: a client must send its request line and headers within this (slowloris) (env CORRAL_HTTP_READ_HEADER_TIMEOUT)")
	f.Duration("http-read-timeout", h.ReadTimeout, "boot HTTP: a client must send its whole request, body included, within this (env CORRAL_HTTP_READ_TIMEOUT)")
	f.Duration("http-write-stall-timeout", h.WriteStall, "boot HTTP: a client that takes less than 256 KiB of a response in this long is cut; a download that keeps flowing is never cut, however long (env CORRAL_HTTP_WRITE_STALL_TIMEOUT)")
	f.Duration("http-idle-timeout", h.IdleTimeout, "boot HTTP: a keep-alive connection with no request for this long is closed (env CORRAL_HTTP_IDLE_TIMEOUT)")
	f.Int("http-max-header-bytes", h.MaxHeaderBytes, "boot HTTP: request line and headers larger than this are answered 431 (env CORRAL_HTTP_MAX_HEADER_BYTES)")
	f.Int("http-max-conns", h.MaxConns, "boot HTTP: open connections at most; more are answered 503 and closed (env CORRAL_HTTP_MAX_CONNS)")
	f.Int("http-max-conns-per-ip", h.MaxConnsPerIP, "boot HTTP: open connections from one address at most; more are answered 503 and closed (env CORRAL_HTTP_MAX_CONNS_PER_IP)")

	f.Duration("tftp-timeout", t.Timeout, "TFTP: a block not acknowledged within this is sent again (env CORRAL_TFTP_TIMEOUT)")
	f.Int("tftp-retries", t.Retries, "TFTP: times a block is sent again before the transfer is dropped (env CORRAL_TFTP_RETRIES)")
	f.Int("tftp-max-transfers", t.MaxTransfers, "TFTP: transfers at once at most; more are answered with a TFTP error (env CORRAL_TFTP_MAX_TRANSFERS)")
	f.Int("tftp-max-transfers-per-ip", t.MaxTransfersPerIP, "TFTP: transfers at once to one address at most; more are answered with a TFTP error (env CORRAL_TFTP_MAX_TRANSFERS_PER_IP)")
	f.Duration("tftp-transfer-timeout", t.TransferTimeout, "TFTP: a transfer still running after this is cut with a TFTP error (env CORRAL_TFTP_TRANSFER_TIMEOUT)")

	f.Int("grpc-max-recv-bytes", g.MaxRecvMsgBytes, "API: largest request message; larger ones fail with ResourceExhausted (env CORRAL_GRPC_MAX_RECV_BYTES)")
	f.Int("grpc-max-header-bytes", g.MaxHeaderBytes, "API: largest request metadata (env CORRAL_GRPC_MAX_HEADER_BYTES)")
	f.Int("grpc-max-concurrent-streams", g.MaxConcurrentStreams, "API: calls in flight on one connection at most (env CORRAL_GRPC_MAX_CONCURRENT_STREAMS)")
	f.Int("grpc-max-conns", g.MaxConns, "API: open connections at most; more are closed at accept (env CORRAL_GRPC_MAX_CONNS)")
	f.Int("grpc-max-conns-per-ip", g.MaxConnsPerIP, "API: open connections from one address at most; more are closed at accept (env CORRAL_GRPC_MAX_CONNS_PER_IP)")
	f.Duration("grpc-handshake-timeout", g.HandshakeTimeout, "API: a new connection must finish its TLS handshake within this (env CORRAL_GRPC_HANDSHAKE_TIMEOUT)")
	f.Duration("grpc-keepalive-time", g.KeepaliveTime, "API: a connection silent this long is pinged (env CORRAL_GRPC_KEEPALIVE_TIME)")
	f.Duration("grpc-keepalive-timeout", g.KeepaliveTimeout, "API: a ping not answered within this closes the connection: a dead agent's session ends within keepalive time + timeout (env CORRAL_GRPC_KEEPALIVE_TIMEOUT)")
	f.Duration("grpc-keepalive-min-time", g.KeepaliveMinTime, "API: clients that ping more often than this are disconnected (env CORRAL_GRPC_KEEPALIVE_MIN_TIME)")
	f.Duration("grpc-max-connection-idle", g.MaxConnectionIdle, "API: a connection with no call in flight for this long is closed (env CORRAL_GRPC_MAX_CONNECTION_IDLE)")

	f.Int("timeline-per-mac", tl.PerMAC, "boot timeline: entries kept per MAC; the oldest go first (env CORRAL_TIMELINE_PER_MAC)")
	f.Int("timeline-max-entries", tl.MaxEntries, "boot timeline: entries kept across all MACs; the timelines of the MACs written to least recently go first (env CORRAL_TIMELINE_MAX_ENTRIES)")
	f.Int("timeline-queue", tl.Queue, "boot timeline: entries waiting to be written at most; more are dropped and counted (env CORRAL_TIMELINE_QUEUE)")
	f.Int("timeline-max-detail-bytes", tl.DetailBytes, "boot timeline: an entry's detail is cut to this (env CORRAL_TIMELINE_MAX_DETAIL_BYTES)")
	f.Int("timeline-max-attrs", tl.Attrs, "boot timeline: attributes per entry at most (env CORRAL_TIMELINE_MAX_ATTRS)")
	f.Int("timeline-max-attr-bytes", tl.AttrBytes, "boot timeline: an attribute value is cut to this (env CORRAL_TIMELINE_MAX_ATTR_BYTES)")
}

// limitsConfig reads the limit flags (server checks them, naming the flag).
func limitsConfig(cmd *cobra.Command) appliance.LimitsConfig {
	f := cmd.Flags()
	var c appliance.LimitsConfig
	h := &c.HTTP
	h.ReadHeaderTimeout, _ = f.GetDuration("http-read-header-timeout")
	h.ReadTimeout, _ = f.GetDuration("http-read-timeout")
	h.WriteStall, _ = f.GetDuration("http-write-stall-timeout")
	h.IdleTimeout, _ = f.GetDuration("http-idle-timeout")
	h.MaxHeaderBytes, _ = f.GetInt("http-max-header-bytes")
	h.MaxConns, _ = f.GetInt("http-max-conns")
	h.MaxConnsPerIP, _ = f.GetInt("http-max-conns-per-ip")

	t := &c.TFTP
	t.Timeout, _ = f.GetDuration("tftp-timeout")
	t.Retries, _ = f.GetInt("tftp-retries")
	t.MaxTransfers, _ = f.GetInt("tftp-max-transfers")
	t.MaxTransfersPerIP, _ = f.GetInt("tftp-max-transfers-per-ip")
	t.TransferTimeout, _ = f.GetDuration("tftp-transfer-timeout")

	g := &c.GRPC
	g.MaxRecvMsgBytes, _ = f.GetInt("grpc-max-recv-bytes")
	g.MaxHeaderBytes, _ = f.GetInt("grpc-max-header-bytes")
	g.MaxConcurrentStreams, _ = f.GetInt("grpc-max-concurrent-streams")
	g.MaxConns, _ = f.GetInt("grpc-max-conns")
	g.MaxConnsPerIP, _ = f.GetInt("grpc-max-conns-per-ip")
	g.HandshakeTimeout, _ = f.GetDuration("grpc-handshake-timeout")
	g.KeepaliveTime, _ = f.GetDuration("grpc-keepalive-time")
	g.KeepaliveTimeout, _ = f.GetDuration("grpc-keepalive-timeout")
	g.KeepaliveMinTime, _ = f.GetDuration("grpc-keepalive-min-time")
	g.MaxConnectionIdle, _ = f.GetDuration("grpc-max-connection-idle")

	tl := &c.Timeline
	tl.PerMAC, _ = f.GetInt("timeline-per-mac")
	tl.MaxEntries, _ = f.GetInt("timeline-max-entries")
	tl.Queue, _ = f.GetInt("timeline-queue")
	tl.DetailBytes, _ = f.GetInt("timeline-max-detail-bytes")
	tl.Attrs, _ = f.GetInt("timeline-max-attrs")
	tl.AttrBytes, _ = f.GetInt("timeline-max-attr-bytes")
	return c
}
