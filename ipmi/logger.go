package ipmi

import (
	"log/slog"

	"github.com/go-logr/logr"
)

// bmclibLogger adapts our slog logger to the logr interface bmclib takes.
func bmclibLogger(l *slog.Logger) logr.Logger { return logr.FromSlogHandler(l.Handler()) }
