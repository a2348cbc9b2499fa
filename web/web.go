package web

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"time"
	"unicode"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	"github.com/corralhq/corral/internal/httpstream"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

//go:embed assets
var assets embed.FS

// Defaults of a zero Config.
const (
	// DefaultCallTimeout bounds the role look-up of /api/whoami; the
	// appliance also sizes its listener's write timeout by it (a REST
	// power action waits for the BMC).
	DefaultCallTimeout = 60 * time.Second
	// maxTokenBytes caps the bearer token a request may carry.
	maxTokenBytes = 512
	// maxNameBytes caps a resource name in a path.
	maxNameBytes = 253
)

// ContentSecurityPolicy is sent with every response: scripts, styles and
// connections only from this origin, nothing inline, no framing, no
// plugins, no form posts elsewhere.
const ContentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Config configures a Handler.
type Config struct {
	// Conn reaches the appliance's own gRPC API over TLS for the consoles
	// (ConsoleService.Attach, a bidirectional stream REST cannot carry).
	// It must carry no credentials of its own (no client certificate, no
	// per-RPC credentials): every call carries the caller's bearer token,
	// so the API's interceptor authenticates, authorizes and audits the
	// caller, not the page.
	Conn grpc.ClientConnInterface
	// CallTimeout bounds Role's look-up (default DefaultCallTimeout).
	CallTimeout time.Duration
	// Logger receives one line per failed call (no tokens); nil discards.
	Logger *slog.Logger
	// Role tells /api/whoami what role a bearer token holds, so the page
	// shows only what the caller may do. An error means the token is not
	// one the appliance accepts. Nil answers /api/whoami 501 (the page then
	// shows every action and the API still refuses what the role may not).
	// It decides nothing: every call is still authorized by the API.
	Role func(ctx context.Context, token string) (authv1.Role, error)
	// ConsoleKeepalive is how often a console socket is pinged (default
	// DefaultConsoleKeepalive); one silent for two and a half intervals is
	// closed.
	ConsoleKeepalive time.Duration
}

// Handler serves the page, /api/whoami and the console sockets (the
// page's data comes from the REST API, package rest). It is safe for
// concurrent use; sockets end when their request's context ends.
type Handler struct {
	cfg Config
	log *slog.Logger
	mux *http.ServeMux
}

// New checks cfg and returns the Handler. It does no I/O.
func New(cfg Config) (*Handler, error) {
	if cfg.Conn == nil {
		return nil, errors.New("web: Config.Conn is required")
	}
	if cfg.CallTimeout < 0 {
		return nil, errors.New("web: CallTimeout must not be negative")
	}
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.ConsoleKeepalive <= 0 {
		cfg.ConsoleKeepalive = DefaultConsoleKeepalive
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	h := &Handler{cfg: cfg, log: cfg.Logger, mux: http.NewServeMux()}
	static, err := fs.Sub(assets, "assets")
	if err != nil {
		return nil, fmt.Errorf("web: embedded assets: %w", err)
	}
	files := http.FileServerFS(static)
	h.mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-cache")
		http.ServeFileFS(w, r, static, "index.html")
	})
	h.mux.Handle("GET /assets/", http.StripPrefix("/assets/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "" || strings.HasSuffix(r.URL.Path, "/") {
			http.NotFound(w, r) // no listings
			return
		}
		w.Header().Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})))
	h.routes()
	return h, nil
}

// ServeHTTP sets the security headers and dispatches.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", ContentSecurityPolicy)
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("Cross-Origin-Opener-Policy", "same-origin")
	hd.Set("Cross-Origin-Resource-Policy", "same-origin")
	if strings.HasPrefix(r.URL.Path, "/api/") {
		hd.Set("Cache-Control", "no-store")
	}
	h.mux.ServeHTTP(w, r)
}

// routes are what the page needs beyond the REST API (package rest, under
// /v1/ on the same listener): its caller's role, which no RPC tells, and
// the consoles, bidirectional streams REST cannot carry.
func (h *Handler) routes() {
	m := h.mux
	m.HandleFunc("GET /api/whoami", h.whoami)
	// A machine's console as a WebSocket (console.go).
	m.HandleFunc("GET /api/console/{name}", h.console(false))
	m.HandleFunc("GET /api/vms/{name}/console", h.console(true))
	m.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, status.Errorf(codes.NotFound, "no API path %s %s (the page's data is under /v1/)", r.Method, r.URL.Path))
	})
}

// logFailure logs a failed call (no token).
func (h *Handler) logFailure(r *http.Request, err error) {
	st := status.Convert(err)
	h.log.Info("web api call failed", "method", r.Method, "path", r.URL.Path, "code", st.Code().String(), "err", st.Message())
}

// pathName returns the {name} path value or an InvalidArgument status.
func pathName(r *http.Request) (string, error) {
	name := r.PathValue("name")
	if name == "" || len(name) > maxNameBytes || strings.ContainsFunc(name, func(c rune) bool { return c < 0x20 || c == 0x7f || c == '/' }) {
		return "", status.Errorf(codes.InvalidArgument, "name %.64q: want 1 to %d printable characters", name, maxNameBytes)
	}
	return name, nil
}

// callerCredentials returns the call option carrying the request's bearer
// token, or an Unauthenticated status.
func callerCredentials(r *http.Request) (grpc.CallOption, error) {
	auth := r.Header.Get("Authorization")
	if len(r.Header.Values("Authorization")) > 1 {
		return nil, status.Error(codes.Unauthenticated, "more than one Authorization header")
	}
	tok, ok := strings.CutPrefix(auth, "Bearer ")
	switch {
	case auth == "":
		return nil, status.Error(codes.Unauthenticated, "missing Authorization: Bearer <token> (sign in with a token)")
	case !ok || tok == "":
		return nil, status.Error(codes.Unauthenticated, `Authorization is not "Bearer <token>"`)
	}
	return tokenCredentials(tok)
}

// tokenCredentials checks the shape of a bearer token and returns the
// call option carrying it, or an Unauthenticated status.
func tokenCredentials(tok string) (grpc.CallOption, error) {
	switch {
	case tok == "":
		return nil, status.Error(codes.Unauthenticated, "missing token (sign in with a token)")
	case len(tok) > maxTokenBytes || strings.ContainsFunc(tok, func(c rune) bool { return c > unicode.MaxASCII || !unicode.IsPrint(c) || c == ' ' }):
		return nil, status.Error(codes.Unauthenticated, "the token is not a Corral token (printable ASCII, at most 512 bytes)")
	}
	return grpc.PerRPCCredentials(bearer(tok)), nil
}

// bearer sends the caller's token, only over TLS.
type bearer string

var _ credentials.PerRPCCredentials = bearer("")

func (t bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

func (bearer) RequireTransportSecurity() bool { return true }

// apiError is the JSON body of every error answer, and the last line of
// a stream a status ended.
type apiError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, err error) {
	code, body := errorBody(err)
	b, _ := json.Marshal(struct {
		Error apiError `json:"error"`
	}{body})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	// The status is sent: a failed write means the client has gone, and
	// nothing is left to tell it.
	_, _ = w.Write(append(b, '\n'))
}

func errorBody(err error) (int, apiError) {
	st := status.Convert(err)
	return HTTPStatus(st.Code()), apiError{Code: st.Code().String(), Message: st.Message()}
}

// HTTPStatus is the HTTP status /api/whoami and the console sockets answer
// for a gRPC code: the REST routes' (internal/httpstream).
func HTTPStatus(c codes.Code) int { return httpstream.HTTPStatus(c) }
