package etcd

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// TestZapToSlog: what the etcd client logs at Warn and above reaches the
// store's slog handler with its fields as attributes; Info stays out.
func TestZapToSlog(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	z := newZapLogger(log, clientLogLevel).Named("etcd-client").With(zap.String("endpoint", "10.0.0.1:2379"))

	z.Info("retrying of unary invoker", zap.Int("attempt", 1))
	if buf.Len() != 0 {
		t.Fatalf("an Info entry was written: %q", buf.String())
	}
	z.Warn("retrying of unary invoker failed",
		zap.Duration("backoff", 25*time.Millisecond), zap.Error(errors.New("context deadline exceeded")))
	z.Error("lost leader", zap.Strings("members", []string{"a", "b"}))

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("got %d lines, want 2:\n%s", len(lines), buf.String())
	}
	for i, want := range []string{
		`level=WARN msg="retrying of unary invoker failed" endpoint=10.0.0.1:2379 logger=etcd-client backoff=25ms error="context deadline exceeded"`,
		`level=ERROR msg="lost leader" endpoint=10.0.0.1:2379 logger=etcd-client members="[a b]"`,
	} {
		if _, got, _ := strings.Cut(lines[i], " "); got != want { // drop time=
			t.Errorf("line %d:\n got %s\nwant %s", i, got, want)
		}
	}
}

// TestZapLevelsToSlog: zap's levels map onto slog's, the handler's own
// level still applies, and a namespace nests the fields after it.
func TestZapLevelsToSlog(t *testing.T) {
	for zl, want := range map[zapcore.Level]slog.Level{
		zapcore.DebugLevel:  slog.LevelDebug,
		zapcore.InfoLevel:   slog.LevelInfo,
		zapcore.WarnLevel:   slog.LevelWarn,
		zapcore.ErrorLevel:  slog.LevelError,
		zapcore.DPanicLevel: slog.LevelError,
		zapcore.FatalLevel:  slog.LevelError,
	} {
		if got := slogLevel(zl); got != want {
			t.Errorf("slogLevel(%v) = %v, want %v", zl, got, want)
		}
	}
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelError}))
	z := newZapLogger(log, zapcore.DebugLevel)
	z.Warn("below the handler's level")
	z.Error("kept", zap.Namespace("peer"), zap.String("id", "x"))
	if got := buf.String(); strings.Contains(got, "below") || !strings.Contains(got, `msg=kept peer.id=x`) {
		t.Errorf("got %q", got)
	}
}
