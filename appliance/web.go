package appliance

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/api/clientconfig"
	"github.com/corralhq/corral/boot/connlimit"
	"github.com/corralhq/corral/rest"
	"github.com/corralhq/corral/web"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// WebConfig configures the rack's web page (package web).
type WebConfig struct {
	// Listen is the HTTPS listen address of the web page ("" = off, the
	// default: a new listener on the provisioning network is the
	// operator's choice, e.g. ":8443" or a management address).
	Listen string
	// MaxConns caps the page's open connections (default 256),
	// MaxConnsPerIP those from one address (default 64); a connection over
	// a cap is closed at accept.
	MaxConns      int
	MaxConnsPerIP int
	// ConsoleKeepalive is how often the page's console sockets are pinged
	// (default 30 s; see web.Config).
	ConsoleKeepalive time.Duration
}

// Web server bounds: a browser's requests are small; the longest unary
// answer is a power action waiting for a BMC (web.DefaultCallTimeout);
// streams set their own write deadlines.
const (
	webReadHeaderTimeout = 10 * time.Second
	webReadTimeout       = 30 * time.Second
	webWriteTimeout      = web.DefaultCallTimeout + 15*time.Second
	webIdleTimeout       = 2 * time.Minute
	webMaxHeaderBytes    = 16 << 10
	// webMaxCallRecvBytes caps a message the page's console bridge takes
	// from the API (its only gRPC client use; the page's data is REST).
	webMaxCallRecvBytes = 64 << 20
)

// WebAddr is the web page's bound address, nil when it is off.
func (s *Server) WebAddr() net.Addr {
	if s.cfg.Web.Listen == "" {
		return nil
	}
	a, err := net.ResolveTCPAddr("tcp", s.cfg.Web.Listen)
	if err != nil {
		return nil
	}
	return a
}

// initWeb binds the web page's HTTPS listener when configured and adds the
// component serving it. The page reads and acts through the REST API
// (package rest) on the same listener; its console sockets call this
// appliance's own gRPC API (the API listener, TLS trusting the CA, the
// appliance's certificate required) with each caller's token, so the same
// interceptor authenticates, authorizes and audits every call.
func (s *Server) initWeb() error {
	c := &s.cfg.Web
	if c.Listen == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("--web-listen %q: %w", c.Listen, err)
	}
	if c.MaxConns < 0 || c.MaxConnsPerIP < 0 {
		return errors.New("web connection caps must not be negative")
	}
	if c.MaxConns == 0 {
		c.MaxConns = 256
	}
	if c.MaxConnsPerIP == 0 {
		c.MaxConnsPerIP = 64
	}
	log := s.log.With("component", "web")
	conn, err := grpc.NewClient(s.endpoint(),
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			RootCAs:          s.ca.Pool(),
			MinVersion:       tls.VersionTLS12,
			VerifyConnection: clientconfig.VerifyApplianceConnection,
		})),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(webMaxCallRecvBytes)),
	)
	if err != nil {
		return fmt.Errorf("web: dial own API %s: %w", s.endpoint(), err)
	}
	h, err := web.New(web.Config{Conn: conn, Logger: log, ConsoleKeepalive: c.ConsoleKeepalive, Role: func(ctx context.Context, token string) (authv1.Role, error) {
		p, err := s.tokens.Authenticate(ctx, token)
		return p.Role, err
	}})
	if err != nil {
		conn.Close()
		return err
	}
	// The REST API (package rest) shares the listener, its TLS, caps and
	// timeouts: /v1/ and /openapi.json, transcoded in process to s.grpc,
	// so the interceptors see the caller's address and TLS state.
	api, err := rest.New(rest.Config{Server: s.grpc, Logger: s.log.With("component", "rest")})
	if err != nil {
		conn.Close()
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/", restHeaders(api))
	mux.Handle("/openapi.json", restHeaders(api))
	mux.Handle("/", h)
	lis, err := net.Listen("tcp", c.Listen)
	if err != nil {
		conn.Close()
		return fmt.Errorf("--web-listen %s: %w", c.Listen, err)
	}
	// The Server's own copy now names the bound address (port 0
	// resolved) for WebAddr.
	url := "https://" + webURLHost(c.Listen, lis.Addr())
	c.Listen = lis.Addr().String()
	limited := connlimit.New(lis, connlimit.Config{MaxConns: c.MaxConns, MaxConnsPerIP: c.MaxConnsPerIP, Name: "web", Logger: log})
	srv := &http.Server{
		Handler: mux,
		TLSConfig: &tls.Config{
			Certificates: []tls.Certificate{s.cert},
			MinVersion:   tls.VersionTLS12,
		},
		ReadHeaderTimeout: webReadHeaderTimeout,
		ReadTimeout:       webReadTimeout,
		WriteTimeout:      webWriteTimeout,
		IdleTimeout:       webIdleTimeout,
		MaxHeaderBytes:    webMaxHeaderBytes,
		// Browsers that do not trust the CA yet fail handshakes: debug.
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	s.webDone = make(chan struct{})
	s.addComponent("web", func(ctx context.Context) error {
		defer close(s.webDone)
		defer conn.Close()
		// Requests (and so watch streams) end with ctx, which lets
		// Shutdown finish.
		srv.BaseContext = func(net.Listener) context.Context { return ctx }
		log.Info("serving web page", "url", url)
		errc := make(chan error, 1)
		go func() { errc <- srv.ServeTLS(limited, "", "") }()
		select {
		case err := <-errc:
			return fmt.Errorf("serve: %w", err)
		case <-ctx.Done():
		}
		sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownGrace)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			log.Warn("web page shutdown timed out; closing", "err", err)
			srv.Close()
		}
		if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	return nil
}

// restHeaders sets the headers every REST answer carries.
func restHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Cache-Control", "no-store")
		h.ServeHTTP(w, r)
	})
}

// webURLHost is host:port for the log line (127.0.0.1 for a wildcard).
func webURLHost(listen string, bound net.Addr) string {
	host, _, _ := net.SplitHostPort(listen)
	_, port, _ := net.SplitHostPort(bound.String())
	if host == "" || isUnspecified(host) {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}
