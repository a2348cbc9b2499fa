// Package rest serves the appliance's gRPC API as REST/JSON: the
// google.api.http rules in api/**.proto, transcoded by vanguard in process
// to the appliance's own *grpc.Server, so every interceptor (tokens, roles,
// limits, audit with the caller's real address and TLS state, metrics)
// runs exactly as for a gRPC call. Watches (GET /v1/watch/...) are served
// here as newline-delimited JSON or server-sent events. GET /openapi.json
// is the checked-in OpenAPI document (api/openapi).
//
// It imports the API and internal/httpstream only: the appliance mounts
// its handler on the web page's HTTPS listener.
package rest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"connectrpc.com/vanguard"
	"github.com/corralhq/corral/api/openapi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
)

// Defaults.
const (
	// DefaultMaxBodyBytes caps a request body: the largest request of the
	// resource RPCs (a deploy's user data, a BIOS settings map) is far
	// below it.
	DefaultMaxBodyBytes = 4 << 20
	// DefaultMaxWatches caps the open watch streams.
	DefaultMaxWatches = 64
	// maxFrameBytes caps one watch event taken from the API.
	maxFrameBytes = 64 << 20
)

// Config configures the REST handler.
type Config struct {
	// Server is the appliance's gRPC server with every service
	// registered: New reads its services once.
	Server *grpc.Server
	// Logger receives failed watch streams at Info.
	Logger *slog.Logger
	// MaxBodyBytes caps a request body (default DefaultMaxBodyBytes); a
	// larger one is refused 413 before any RPC runs.
	MaxBodyBytes int64
	// MaxWatches caps the open watch streams (default DefaultMaxWatches);
	// one more is refused 503.
	MaxWatches int
}

// Handler serves /v1/ and /openapi.json. It is safe for concurrent use.
type Handler struct {
	cfg     Config
	tc      *vanguard.Transcoder
	watches chan struct{}
	routes  []route
	mux     *http.ServeMux
}

// jsonOptions are the JSON forms of REST answers and requests: lowerCamel
// field names (as the OpenAPI document says), unset fields omitted, and an
// unknown field in a request an error rather than silently dropped.
var jsonOptions = struct {
	m protojson.MarshalOptions
	u protojson.UnmarshalOptions
}{
	m: protojson.MarshalOptions{},
	u: protojson.UnmarshalOptions{DiscardUnknown: false},
}

// New builds the handler over cfg.Server's registered services.
func New(cfg Config) (*Handler, error) {
	if cfg.Server == nil {
		return nil, errors.New("rest: no gRPC server")
	}
	if cfg.Logger == nil {
		return nil, errors.New("rest: no logger")
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.MaxWatches <= 0 {
		cfg.MaxWatches = DefaultMaxWatches
	}
	// As vanguardgrpc.NewTranscoder, with this package's JSON options.
	var services []*vanguard.Service
	for name := range cfg.Server.GetServiceInfo() {
		services = append(services, vanguard.NewService(name, cfg.Server))
	}
	tc, err := vanguard.NewTranscoder(services,
		vanguard.WithDefaultServiceOptions(
			vanguard.WithTargetCodecs(vanguard.CodecProto),
			vanguard.WithTargetProtocols(vanguard.ProtocolGRPC),
			vanguard.WithMaxMessageBufferBytes(maxFrameBytes),
		),
		vanguard.WithCodec(func(res vanguard.TypeResolver) vanguard.Codec {
			c := vanguard.NewJSONCodec(res)
			c.MarshalOptions = jsonOptions.m
			c.MarshalOptions.Resolver = res
			c.UnmarshalOptions = jsonOptions.u
			c.UnmarshalOptions.Resolver = res
			return c
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("rest: transcoder: %w", err)
	}
	routes, err := routes(cfg.Server)
	if err != nil {
		return nil, err
	}
	h := &Handler{cfg: cfg, tc: tc, watches: make(chan struct{}, cfg.MaxWatches), routes: routes, mux: http.NewServeMux()}
	h.mux.HandleFunc("GET /openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(openapi.JSON)))
		_, _ = w.Write(openapi.JSON)
	})
	h.mux.HandleFunc("GET /v1/watch/", h.watch)
	h.mux.HandleFunc("/v1/", h.call)
	return h, nil
}

// ServeHTTP serves one REST request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mux.ServeHTTP(w, r)
}

// call transcodes one unary REST call. Only REST reaches the transcoder
// here: Connect, gRPC-Web and gRPC paths (/corral.x.v1.Svc/Method) are
// not under /v1/. The body is read whole first (it is small: a unary
// request) so an oversized one is refused 413 before any RPC runs,
// declared or chunked.
func (h *Handler) call(w http.ResponseWriter, r *http.Request) {
	var body []byte
	if r.Body != nil && r.Body != http.NoBody {
		if r.ContentLength > h.cfg.MaxBodyBytes {
			writeStatus(w, http.StatusRequestEntityTooLarge, codes.ResourceExhausted, fmt.Sprintf("request body of %d bytes is over the %d-byte limit", r.ContentLength, h.cfg.MaxBodyBytes))
			return
		}
		b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes))
		if err != nil {
			if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
				writeStatus(w, http.StatusRequestEntityTooLarge, codes.ResourceExhausted, fmt.Sprintf("request body is over the %d-byte limit", h.cfg.MaxBodyBytes))
				return
			}
			writeStatus(w, http.StatusBadRequest, codes.InvalidArgument, "read request body: "+err.Error())
			return
		}
		body = b
		r.Body = io.NopCloser(bytes.NewReader(b))
		r.ContentLength = int64(len(b))
		// curl -d sends a form content type: a REST body is JSON.
		if ct := r.Header.Get("Content-Type"); ct == "" || strings.HasPrefix(ct, "application/x-www-form-urlencoded") {
			r.Header.Set("Content-Type", "application/json")
		}
	}
	if err := h.checkInput(r, body); err != nil {
		writeError(w, err)
		return
	}
	h.tc.ServeHTTP(w, r)
}
