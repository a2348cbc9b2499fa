package appliance

import (
	"context"
	"crypto/tls"
	"log/slog"
	"runtime/debug"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

func credentialsFromTLS(c *tls.Config) credentials.TransportCredentials {
	return credentials.NewTLS(c)
}

// recoverUnary turns a handler panic into codes.Internal and a log line.
func recoverUnary(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if r := recover(); r != nil {
				log.Error("panic in handler", "method", info.FullMethod, "panic", r, "stack", string(debug.Stack()))
				err = status.Errorf(codes.Internal, "internal error in %s", info.FullMethod)
			}
		}()
		return h(ctx, req)
	}
}

func recoverStream(log *slog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
		defer func() {
			if r := recover(); r != nil {
				log.Error("panic in handler", "method", info.FullMethod, "panic", r, "stack", string(debug.Stack()))
				err = status.Errorf(codes.Internal, "internal error in %s", info.FullMethod)
			}
		}()
		return h(srv, ss)
	}
}

// logUnary logs each call at debug level, and failures other than the
// caller's own mistakes at warn level.
func logUnary(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := h(ctx, req)
		code := status.Code(err)
		level := slog.LevelDebug
		switch code {
		case codes.Internal, codes.Unknown, codes.DataLoss, codes.Unavailable:
			level = slog.LevelWarn
		default:
			// Answers the client caused, or none wrong: debug.
		}
		log.Log(ctx, level, "rpc", "method", info.FullMethod, "code", code.String(), "duration", time.Since(start).String())
		return resp, err
	}
}

// nonNil drops the nil interceptors of parts that are switched off.
func nonNil[T any](in ...T) []T {
	out := in[:0:0]
	for _, i := range in {
		if any(i) != nil && !isNilFunc(i) {
			out = append(out, i)
		}
	}
	return out
}

func isNilFunc[T any](i T) bool {
	switch f := any(i).(type) {
	case grpc.UnaryServerInterceptor:
		return f == nil
	case grpc.StreamServerInterceptor:
		return f == nil
	}
	return false
}
