package http

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
)

// HTTPS is the UEFI HTTPS boot listener: the boot profile's artifacts
// (/images/<name>) over TLS with the boot CA's certificate
// (pki.EnsureBootCA), for firmware that has that CA enrolled and is given
// an https:// URL by DHCP. It serves nothing else: the iPXE script, its
// per-boot token and the OS images stay on the plain listener, where iPXE
// (which trusts no Corral CA) fetches them. Connections count against the
// same limits as the plain listener's, as a separate pool.
type HTTPS struct {
	s   *Server
	lis net.Listener
	srv *http.Server
}

// NewHTTPS binds listen and serves s's artifacts over TLS with cfg.
func (s *Server) NewHTTPS(listen string, cfg *tls.Config) (*HTTPS, error) {
	if cfg == nil || len(cfg.Certificates) == 0 {
		return nil, errors.New("boot/http: HTTPS needs a certificate")
	}
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("boot/http: listen %s (HTTPS boot): %w", listen, err)
	}
	// The connection caps apply before the handshake: a flood of
	// half-open TLS connections costs a slot each, not a goroutine
	// each beyond the cap.
	h := &HTTPS{s: s, lis: tls.NewListener(s.cfg.Limits.listener(l, s.log), cfg)}
	h.srv = s.cfg.Limits.server(http.HandlerFunc(h.serve), s.log.With("listener", "https"))
	return h, nil
}

func (h *HTTPS) serve(w http.ResponseWriter, r *http.Request) {
	if !strings.HasPrefix(r.URL.Path, "/images/") {
		h.s.refuse(w, r, "", http.StatusNotFound, "no such path: the HTTPS boot listener serves /images/<name> only")
		return
	}
	h.s.ServeHTTP(w, r)
}

// Addr is the bound address.
func (h *HTTPS) Addr() net.Addr { return h.lis.Addr() }

// Close closes the listener.
func (h *HTTPS) Close() error { return h.lis.Close() }

// Run serves until ctx ends, then shuts down as Server.Run does.
func (h *HTTPS) Run(ctx context.Context) error {
	h.s.log.Info("serving HTTPS boot", "addr", h.lis.Addr().String())
	return serveUntil(ctx, h.srv, h.lis, h.s.log, "boot/http: HTTPS")
}
