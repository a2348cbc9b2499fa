package web

import (
	"bytes"
	"cmp"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"

	authv1 "github.com/corralhq/corral/api/auth/v1"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	poolv1 "github.com/corralhq/corral/api/pool/v1"
	provisioningv1 "github.com/corralhq/corral/api/provisioning/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

//go:embed assets
var assets embed.FS

// Defaults of a zero Config.
const (
	DefaultMaxWatches  = 64
	DefaultCallTimeout = 60 * time.Second
	// MaxBodyBytes caps a request body: actions carry a few small fields.
	MaxBodyBytes = 4 << 10
	// maxTokenBytes caps the bearer token a request may carry.
	maxTokenBytes = 512
	// maxNameBytes caps a resource name in a path.
	maxNameBytes = 253
	// maxTimelineLimit caps ?limit= of a timeline.
	maxTimelineLimit = 1000
)

// ContentSecurityPolicy is sent with every response: scripts, styles and
// connections only from this origin, nothing inline, no framing, no
// plugins, no form posts elsewhere.
const ContentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Config configures a Handler.
type Config struct {
	// Conn reaches the appliance's own gRPC API over TLS. It must carry no
	// credentials of its own (no client certificate, no per-RPC
	// credentials): every call carries the HTTP caller's bearer token, so
	// the API's interceptor authenticates, authorizes and audits the
	// caller, not the gateway.
	Conn grpc.ClientConnInterface
	// MaxWatches caps the watch streams open at once across all callers
	// (default DefaultMaxWatches); one more is answered 503. Keep it below
	// the API's concurrent streams per connection, or unary calls would
	// queue behind the watches on the shared connection.
	MaxWatches int
	// CallTimeout bounds each unary call (default DefaultCallTimeout: a
	// power action waits for the BMC).
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

// Handler serves the page and its JSON API. It is safe for concurrent
// use; streams end when their request's context ends.
type Handler struct {
	cfg      Config
	log      *slog.Logger
	mux      *http.ServeMux
	watches  chan struct{}
	machines inventoryv1.MachineServiceClient
	nodes    poolv1.NodeServiceClient
	vms      provisioningv1.VirtualMachineServiceClient
	volumes  provisioningv1.BlockStorageServiceClient
	pools    inventoryv1.StandbyPoolServiceClient
}

// New checks cfg and returns the Handler. It does no I/O.
func New(cfg Config) (*Handler, error) {
	if cfg.Conn == nil {
		return nil, errors.New("web: Config.Conn is required")
	}
	if cfg.MaxWatches < 0 || cfg.CallTimeout < 0 {
		return nil, errors.New("web: MaxWatches and CallTimeout must not be negative")
	}
	if cfg.MaxWatches == 0 {
		cfg.MaxWatches = DefaultMaxWatches
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
	h := &Handler{
		cfg:      cfg,
		log:      cfg.Logger,
		mux:      http.NewServeMux(),
		watches:  make(chan struct{}, cfg.MaxWatches),
		machines: inventoryv1.NewMachineServiceClient(cfg.Conn),
		nodes:    poolv1.NewNodeServiceClient(cfg.Conn),
		vms:      provisioningv1.NewVirtualMachineServiceClient(cfg.Conn),
		volumes:  provisioningv1.NewBlockStorageServiceClient(cfg.Conn),
		pools:    inventoryv1.NewStandbyPoolServiceClient(cfg.Conn),
	}
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

func (h *Handler) routes() {
	m := h.mux
	m.HandleFunc("GET /api/whoami", h.whoami)
	// One page of machine summaries (page_size up to maxMachinePage,
	// page_token from the previous answer's next_page_token): the page
	// reads on until the token is empty.
	m.HandleFunc("GET /api/machines", h.unary(func(ctx context.Context, r *http.Request, o grpc.CallOption) (proto.Message, error) {
		size, err := queryUint(r, "page_size", maxMachinePage, maxMachinePage)
		if err != nil {
			return nil, err
		}
		res, err := h.machines.ListMachines(ctx, &inventoryv1.ListMachinesRequest{
			View: inventoryv1.MachineView_MACHINE_VIEW_SUMMARY, PageSize: int32(size), PageToken: r.URL.Query().Get("page_token"),
		}, o)
		if err != nil {
			return nil, err
		}
		for _, mc := range res.GetMachines() {
			slim(mc)
		}
		return res, nil
	}))
	m.HandleFunc("GET /api/machines/{name}", h.named(func(ctx context.Context, name string, r *http.Request, o grpc.CallOption) (proto.Message, error) {
		return h.machines.GetMachine(ctx, &inventoryv1.GetMachineRequest{Name: name}, o)
	}))
	m.HandleFunc("GET /api/machines/{name}/timeline", h.named(func(ctx context.Context, name string, r *http.Request, o grpc.CallOption) (proto.Message, error) {
		limit, err := queryUint(r, "limit", 200, maxTimelineLimit)
		if err != nil {
			return nil, err
		}
		return h.machines.Timeline(ctx, &inventoryv1.TimelineRequest{Name: name, Limit: uint32(limit)}, o)
	}))
	m.HandleFunc("POST /api/machines/{name}/accept", h.act(actions[0], func(ctx context.Context, name string, r *http.Request, o grpc.CallOption) (proto.Message, error) {
		var body struct {
			Disk string `json:"disk"`
			Wipe bool   `json:"wipe"`
		}
		if err := decodeBody(r, &body); err != nil {
			return nil, err
		}
		return h.machines.AcceptMachine(ctx, &inventoryv1.AcceptMachineRequest{Name: name, Disk: cmp.Or(body.Disk, "auto"), Wipe: body.Wipe}, o)
	}))
	m.HandleFunc("POST /api/machines/{name}/power", h.act(actions[1], func(ctx context.Context, name string, r *http.Request, o grpc.CallOption) (proto.Message, error) {
		var body struct {
			Action string `json:"action"`
		}
		if err := decodeBody(r, &body); err != nil {
			return nil, err
		}
		a, ok := powerActions[body.Action]
		if !ok {
			return nil, status.Errorf(codes.InvalidArgument, "power action %q: want one of on, off, soft-off, cycle, reset", body.Action)
		}
		return h.machines.SetPower(ctx, &inventoryv1.SetPowerRequest{Name: name, Action: a}, o)
	}))
	m.HandleFunc("POST /api/machines/{name}/maintenance", h.act(actions[2], func(ctx context.Context, name string, r *http.Request, o grpc.CallOption) (proto.Message, error) {
		var body struct {
			On     *bool  `json:"on"`
			Reason string `json:"reason"`
		}
		if err := decodeBody(r, &body); err != nil {
			return nil, err
		}
		if body.On == nil {
			return nil, status.Error(codes.InvalidArgument, `maintenance needs "on": true or false`)
		}
		return h.machines.SetMaintenance(ctx, &inventoryv1.SetMaintenanceRequest{Name: name, On: *body.On, Reason: body.Reason}, o)
	}))
	m.HandleFunc("GET /api/nodes", h.unary(func(ctx context.Context, r *http.Request, o grpc.CallOption) (proto.Message, error) {
		return h.nodes.ListNodes(ctx, &poolv1.ListNodesRequest{}, o)
	}))
	// One page of standby pools with their status (page_size up to
	// maxPoolPage, page_token as for machines). Pools have no watch: the
	// page polls this.
	m.HandleFunc("GET /api/standby-pools", h.unary(func(ctx context.Context, r *http.Request, o grpc.CallOption) (proto.Message, error) {
		size, err := queryUint(r, "page_size", maxPoolPage, maxPoolPage)
		if err != nil {
			return nil, err
		}
		return h.pools.ListStandbyPools(ctx, &inventoryv1.ListStandbyPoolsRequest{PageSize: int32(size), PageToken: r.URL.Query().Get("page_token")}, o)
	}))
	m.HandleFunc("GET /api/vms", h.unary(func(ctx context.Context, r *http.Request, o grpc.CallOption) (proto.Message, error) {
		return h.vms.ListVirtualMachines(ctx, &provisioningv1.ListVirtualMachinesRequest{}, o)
	}))
	m.HandleFunc("GET /api/volumes", h.unary(func(ctx context.Context, r *http.Request, o grpc.CallOption) (proto.Message, error) {
		return h.volumes.ListBlockStorages(ctx, &provisioningv1.ListBlockStoragesRequest{}, o)
	}))

	m.HandleFunc("GET /api/watch/machines", h.stream(func(ctx context.Context, r *http.Request, rev int64, o grpc.CallOption) (next, error) {
		s, err := h.machines.WatchMachines(ctx, &inventoryv1.WatchMachinesRequest{FromRevision: rev, View: inventoryv1.MachineView_MACHINE_VIEW_SUMMARY}, o)
		return recvSlim(s, err, func(e *inventoryv1.MachineEvent) { slim(e.GetMachine()) })
	}))
	m.HandleFunc("GET /api/watch/machines/{name}", h.stream(func(ctx context.Context, r *http.Request, rev int64, o grpc.CallOption) (next, error) {
		name, err := pathName(r)
		if err != nil {
			return nil, err
		}
		s, err := h.machines.WatchMachines(ctx, &inventoryv1.WatchMachinesRequest{Name: name, FromRevision: rev}, o)
		return recv(s, err)
	}))
	m.HandleFunc("GET /api/watch/machines/{name}/timeline", h.stream(func(ctx context.Context, r *http.Request, rev int64, o grpc.CallOption) (next, error) {
		name, err := pathName(r)
		if err != nil {
			return nil, err
		}
		limit, err := queryUint(r, "limit", 200, maxTimelineLimit)
		if err != nil {
			return nil, err
		}
		s, err := h.machines.WatchTimeline(ctx, &inventoryv1.WatchTimelineRequest{Name: name, FromRevision: rev, Limit: uint32(limit)}, o)
		return recv(s, err)
	}))
	m.HandleFunc("GET /api/watch/nodes", h.stream(func(ctx context.Context, r *http.Request, rev int64, o grpc.CallOption) (next, error) {
		s, err := h.nodes.WatchNodes(ctx, &poolv1.WatchNodesRequest{FromRevision: rev}, o)
		return recv(s, err)
	}))
	m.HandleFunc("GET /api/watch/vms", h.stream(func(ctx context.Context, r *http.Request, rev int64, o grpc.CallOption) (next, error) {
		s, err := h.vms.WatchVirtualMachines(ctx, &provisioningv1.WatchVirtualMachinesRequest{FromRevision: rev}, o)
		return recv(s, err)
	}))
	m.HandleFunc("GET /api/watch/volumes", h.stream(func(ctx context.Context, r *http.Request, rev int64, o grpc.CallOption) (next, error) {
		s, err := h.volumes.WatchBlockStorages(ctx, &provisioningv1.WatchBlockStoragesRequest{FromRevision: rev}, o)
		return recv(s, err)
	}))
	// A machine's console as a WebSocket (console.go).
	m.HandleFunc("GET /api/console/{name}", h.console(false))
	m.HandleFunc("GET /api/vms/{name}/console", h.console(true))
	m.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, status.Errorf(codes.NotFound, "no API path %s %s", r.Method, r.URL.Path))
	})
}

var powerActions = map[string]inventoryv1.PowerAction{
	"on":       inventoryv1.PowerAction_POWER_ACTION_ON,
	"off":      inventoryv1.PowerAction_POWER_ACTION_OFF,
	"soft-off": inventoryv1.PowerAction_POWER_ACTION_SOFT_OFF,
	"cycle":    inventoryv1.PowerAction_POWER_ACTION_CYCLE,
	"reset":    inventoryv1.PowerAction_POWER_ACTION_RESET,
}

// slim drops from a listed machine what the list page never shows and
// what makes a rack's list heavy: the fact history and the PCI devices
// (the machine's own page gets them with GetMachine).
func slim(m *inventoryv1.Machine) {
	if m == nil {
		return
	}
	m.FactHistory = nil
	if f := m.GetFacts(); f != nil {
		f.PciDevices = nil
	}
}

// maxMachinePage is the page size of GET /api/machines: as many machine
// summaries as the appliance serves in one answer.
const maxMachinePage = 1000

// maxPoolPage is the page size of GET /api/standby-pools: the most the
// appliance serves in one answer.
const maxPoolPage = 1000

// call is one unary gateway call: o carries the caller's token.
type call func(ctx context.Context, r *http.Request, o grpc.CallOption) (proto.Message, error)

// unary serves a call's result as JSON.
func (h *Handler) unary(fn call) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		o, err := callerCredentials(r)
		if err != nil {
			writeError(w, err)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), h.cfg.CallTimeout)
		defer cancel()
		res, err := fn(ctx, r, o)
		if err != nil {
			h.logFailure(r, err)
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, res)
	}
}

// named is unary with the {name} path value checked.
func (h *Handler) named(fn func(ctx context.Context, name string, r *http.Request, o grpc.CallOption) (proto.Message, error)) http.HandlerFunc {
	return h.unary(func(ctx context.Context, r *http.Request, o grpc.CallOption) (proto.Message, error) {
		name, err := pathName(r)
		if err != nil {
			return nil, err
		}
		return fn(ctx, name, r, o)
	})
}

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

// queryUint reads an optional unsigned query parameter in [1, hi].
func queryUint(r *http.Request, key string, def, hi uint64) (uint64, error) { //nolint:unparam // each list's own bound, equal today
	v := r.URL.Query().Get(key)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseUint(v, 10, 32)
	if err != nil || n == 0 || n > hi {
		return 0, status.Errorf(codes.InvalidArgument, "%s=%.32q: want a number from 1 to %d", key, v, hi)
	}
	return n, nil
}

// decodeBody reads a small JSON object into v: the body must be
// application/json, at most MaxBodyBytes, one object with known fields.
func decodeBody(r *http.Request, v any) error {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		return errUnsupportedMedia
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "request body: %v", err)
	}
	if len(b) > MaxBodyBytes {
		return errTooLarge
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return status.Errorf(codes.InvalidArgument, "request body: want one JSON object: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return status.Error(codes.InvalidArgument, "request body: want one JSON object, found more after it")
	}
	return nil
}

// errUnsupportedMedia is answered 415, errTooLarge 413.
var (
	errUnsupportedMedia = errors.New("request body must be Content-Type: application/json")
	errTooLarge         = fmt.Errorf("request body is larger than %d bytes", MaxBodyBytes)
)

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

var marshal = protojson.MarshalOptions{UseProtoNames: true}

func writeJSON(w http.ResponseWriter, code int, m proto.Message) {
	b, err := marshal.Marshal(m)
	if err != nil {
		writeError(w, status.Errorf(codes.Internal, "encode response: %v", err))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	// The status is sent: a failed write means the client has gone, and
	// nothing is left to tell it.
	_, _ = w.Write(append(b, '\n'))
}

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
	switch {
	case errors.Is(err, errUnsupportedMedia):
		return http.StatusUnsupportedMediaType, apiError{Code: "InvalidArgument", Message: err.Error()}
	case errors.Is(err, errTooLarge):
		return http.StatusRequestEntityTooLarge, apiError{Code: "InvalidArgument", Message: err.Error()}
	}
	st := status.Convert(err)
	return HTTPStatus(st.Code()), apiError{Code: st.Code().String(), Message: st.Message()}
}

// HTTPStatus is the HTTP status the gateway answers for a gRPC code.
func HTTPStatus(c codes.Code) int {
	switch c {
	case codes.OK:
		return http.StatusOK
	case codes.InvalidArgument, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.NotFound:
		return http.StatusNotFound
	case codes.AlreadyExists, codes.Aborted, codes.FailedPrecondition:
		return http.StatusConflict
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Canceled:
		return 499 // the client went away (nginx's convention)
	case codes.Unimplemented:
		return http.StatusNotImplemented
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	default:
		return http.StatusInternalServerError
	}
}
