package etcd

import (
	"context"
	"log/slog"
	"maps"
	"slices"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// clientLogLevel is the least severe etcd client entry that reaches the
// store's logger: the client reports retries and reconnects at Info and
// below, which would drown the appliance's own lines in normal operation.
const clientLogLevel = zapcore.WarnLevel

// newZapLogger returns a zap logger for the etcd client whose entries at
// level and above go to log's handler, with zap fields as slog attributes.
func newZapLogger(log *slog.Logger, level zapcore.Level) *zap.Logger {
	return zap.New(&slogCore{h: log.Handler(), min: level})
}

// slogCore is a zapcore.Core that writes each entry to a slog.Handler.
// Levels map Debug, Info and Warn to their slog namesakes and everything
// more severe to slog's Error; the logger's name becomes a "logger" attr.
type slogCore struct {
	h   slog.Handler
	min zapcore.Level
}

func slogLevel(l zapcore.Level) slog.Level {
	switch {
	case l <= zapcore.DebugLevel:
		return slog.LevelDebug
	case l == zapcore.InfoLevel:
		return slog.LevelInfo
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	default:
		return slog.LevelError
	}
}

func (c *slogCore) Enabled(l zapcore.Level) bool {
	return l >= c.min && c.h.Enabled(context.Background(), slogLevel(l))
}

func (c *slogCore) With(fields []zapcore.Field) zapcore.Core {
	if len(fields) == 0 {
		return c
	}
	return &slogCore{h: c.h.WithAttrs(slogAttrs(fields)), min: c.min}
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	r := slog.NewRecord(e.Time, slogLevel(e.Level), e.Message, 0)
	if e.LoggerName != "" {
		r.AddAttrs(slog.String("logger", e.LoggerName))
	}
	r.AddAttrs(slogAttrs(fields)...)
	return c.h.Handle(context.Background(), r)
}

func (c *slogCore) Sync() error { return nil }

// slogAttrs turns zap fields into slog attributes, in the fields' order.
// Each field is rendered by zap's own map encoder, so errors, durations,
// objects and arrays come out as zap would print them; a namespace field
// nests the ones after it in a group of its name.
func slogAttrs(fields []zapcore.Field) []slog.Attr {
	attrs := make([]slog.Attr, 0, len(fields))
	for i, f := range fields {
		if f.Type == zapcore.NamespaceType {
			return append(attrs, slog.Attr{Key: f.Key, Value: slog.GroupValue(slogAttrs(fields[i+1:])...)})
		}
		enc := zapcore.NewMapObjectEncoder()
		f.AddTo(enc)
		// One key per field, but for inline objects.
		for _, k := range slices.Sorted(maps.Keys(enc.Fields)) {
			attrs = append(attrs, slog.Any(k, enc.Fields[k]))
		}
	}
	return attrs
}
