package rest

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/corralhq/corral/internal/httpstream"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// watch serves GET /v1/watch/...: the request message is built from the
// path variables and the query (as a REST GET's would be), the Watch RPC
// is called in process through the transcoder's Connect streaming
// protocol with the caller's request (address, TLS, Authorization), and
// each event is written as a line {"result":<event>} (NDJSON), or as a
// server-sent event whose data is that object when the client accepts
// text/event-stream. A status that ends a started stream is the last
// frame, {"error":{"code":...,"message":...}}; one before the first event
// is the HTTP answer.
func (h *Handler) watch(w http.ResponseWriter, r *http.Request) {
	rt, vars, ok := h.match(http.MethodGet, r.URL.Path)
	if !ok || !rt.stream {
		writeStatus(w, http.StatusNotFound, codes.NotFound, "no watch at "+r.URL.Path)
		return
	}
	req := rt.input.New()
	if err := fillRequest(req, vars, r.URL.Query()); err != nil {
		writeError(w, err)
		return
	}
	body, err := jsonOptions.m.Marshal(req.Interface())
	if err != nil {
		writeError(w, status.Errorf(codes.Internal, "encode request: %v", err))
		return
	}
	select {
	case h.watches <- struct{}{}:
		defer func() { <-h.watches }()
	default:
		writeStatus(w, http.StatusServiceUnavailable, codes.Unavailable, fmt.Sprintf("%d watch streams are open, the most this appliance serves; poll the list instead", cap(h.watches)))
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()

	// The inner request keeps r's RemoteAddr and TLS state: the gRPC
	// server's peer (audit, per-address limits) is the caller.
	env := make([]byte, 5, 5+len(body))
	binary.BigEndian.PutUint32(env[1:], uint32(len(body)))
	env = append(env, body...)
	in := r.Clone(ctx)
	in.Method = http.MethodPost
	in.URL = &url.URL{Path: rt.method}
	in.RequestURI = rt.method
	in.Body = io.NopCloser(bytes.NewReader(env))
	in.ContentLength = int64(len(env))
	in.Header = http.Header{
		"Content-Type":             {"application/connect+json"},
		"Connect-Protocol-Version": {"1"},
	}
	if a := r.Header.Values("Authorization"); len(a) > 0 {
		in.Header["Authorization"] = a
	}
	pr, pw := io.Pipe()
	pipe := &pipeWriter{h: http.Header{}, w: pw}
	served := make(chan struct{})
	go func() {
		defer close(served)
		h.tc.ServeHTTP(pipe, in)
		pw.Close()
	}()
	stop := context.AfterFunc(ctx, func() { pr.CloseWithError(context.Canceled) })
	defer func() { cancel(); stop(); pr.CloseWithError(context.Canceled); <-served }()

	sse := acceptsSSE(r)
	f := httpstream.Format{
		ContentType: "application/x-ndjson",
		Keepalive:   []byte("\n"),
		Refuse:      writeError,
		Last: func(err error) []byte {
			b := errorJSON(err)
			if sse {
				return []byte("event: error\ndata: " + string(b) + "\n\n")
			}
			return append(b, '\n')
		},
		Failed: func(err error) {
			if c := status.Code(err); c != codes.Canceled {
				h.cfg.Logger.Info("rest watch failed", "path", r.URL.Path, "code", c.String(), "err", status.Convert(err).Message())
			}
		},
	}
	if sse {
		f.ContentType = "text/event-stream"
		f.Keepalive = []byte(": keepalive\n\n")
	}
	var hdr [5]byte
	httpstream.Serve(ctx, cancel, w, func() ([]byte, error) {
		if _, err := io.ReadFull(pr, hdr[:]); err != nil {
			if ctx.Err() != nil {
				return nil, status.FromContextError(ctx.Err()).Err()
			}
			return nil, status.Errorf(codes.Internal, "watch stream cut: %v", err)
		}
		n := binary.BigEndian.Uint32(hdr[1:])
		if n > maxFrameBytes {
			return nil, status.Errorf(codes.ResourceExhausted, "watch event of %d bytes is over %d", n, maxFrameBytes)
		}
		msg := make([]byte, n)
		if _, err := io.ReadFull(pr, msg); err != nil {
			return nil, status.Errorf(codes.Internal, "watch stream cut: %v", err)
		}
		if hdr[0]&0x02 != 0 {
			return nil, endStream(msg)
		}
		var b []byte
		if sse {
			b = append(b, "data: "...)
		}
		b = append(b, `{"result":`...)
		b = append(b, msg...)
		b = append(b, '}')
		if sse {
			b = append(b, "\n\n"...)
		} else {
			b = append(b, '\n')
		}
		return b, nil
	}, f)
}

// acceptsSSE reports whether the client asked for server-sent events.
func acceptsSSE(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for part := range strings.SplitSeq(v, ",") {
			mt, _, _ := strings.Cut(strings.TrimSpace(part), ";")
			if strings.EqualFold(strings.TrimSpace(mt), "text/event-stream") {
				return true
			}
		}
	}
	return false
}

// endStream turns a Connect end-of-stream message into io.EOF or the
// status it carries.
func endStream(b []byte) error {
	var end struct {
		Error *struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &end); err != nil {
		return status.Errorf(codes.Internal, "decode end of watch stream: %v", err)
	}
	if end.Error == nil {
		return io.EOF
	}
	return status.Error(connectCode(end.Error.Code), end.Error.Message)
}

// connectCode maps a Connect error code ("permission_denied") to gRPC's.
func connectCode(s string) codes.Code {
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		if snake(c.String()) == s {
			return c
		}
	}
	return codes.Unknown
}

func snake(s string) string {
	var b strings.Builder
	for i, r := range s {
		if r >= 'A' && r <= 'Z' {
			if i > 0 {
				b.WriteByte('_')
			}
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}

// fillRequest sets req's fields from path variables and query parameters
// (scalar, enum and repeated scalar fields, by JSON or proto name). An
// unknown parameter or a value that does not parse is InvalidArgument.
func fillRequest(req protoreflect.Message, vars map[string]string, q url.Values) error {
	set := func(k string, vals []string) error {
		fd := field(req.Descriptor(), k)
		if fd == nil || fd.IsMap() || fd.Message() != nil {
			return status.Errorf(codes.InvalidArgument, "unknown query parameter %.64q", k)
		}
		if !fd.IsList() && len(vals) > 1 {
			return status.Errorf(codes.InvalidArgument, "query parameter %q given %d times", k, len(vals))
		}
		for _, s := range vals {
			v, err := scalar(fd, s)
			if err != nil {
				return status.Errorf(codes.InvalidArgument, "%s=%.64q: %v", k, s, err)
			}
			if fd.IsList() {
				req.Mutable(fd).List().Append(v)
			} else {
				req.Set(fd, v)
			}
		}
		return nil
	}
	for k, v := range vars {
		if err := set(k, []string{v}); err != nil {
			return err
		}
	}
	for k, vals := range q {
		if err := set(k, vals); err != nil {
			return err
		}
	}
	return nil
}

// scalar parses s as fd's kind.
func scalar(fd protoreflect.FieldDescriptor, s string) (protoreflect.Value, error) {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(s), nil
	case protoreflect.BoolKind:
		b, err := strconv.ParseBool(s)
		return protoreflect.ValueOfBool(b), err
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		n, err := strconv.ParseInt(s, 10, 32)
		return protoreflect.ValueOfInt32(int32(n)), err
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		n, err := strconv.ParseInt(s, 10, 64)
		return protoreflect.ValueOfInt64(n), err
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		n, err := strconv.ParseUint(s, 10, 32)
		return protoreflect.ValueOfUint32(uint32(n)), err
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		n, err := strconv.ParseUint(s, 10, 64)
		return protoreflect.ValueOfUint64(n), err
	case protoreflect.EnumKind:
		if ev := fd.Enum().Values().ByName(protoreflect.Name(s)); ev != nil {
			return protoreflect.ValueOfEnum(ev.Number()), nil
		}
		n, err := strconv.ParseInt(s, 10, 32)
		if err != nil || fd.Enum().Values().ByNumber(protoreflect.EnumNumber(n)) == nil {
			return protoreflect.Value{}, fmt.Errorf("not a value of %s", fd.Enum().FullName())
		}
		return protoreflect.ValueOfEnum(protoreflect.EnumNumber(n)), nil
	default:
		return protoreflect.Value{}, fmt.Errorf("a %s field cannot be a query parameter", fd.Kind())
	}
}

// pipeWriter is the ResponseWriter the in-process Connect call writes to:
// its body goes into a pipe the watch reads (a write blocks until read).
type pipeWriter struct {
	h http.Header
	w *io.PipeWriter
}

func (p *pipeWriter) Header() http.Header         { return p.h }
func (p *pipeWriter) WriteHeader(int)             {}
func (p *pipeWriter) Write(b []byte) (int, error) { return p.w.Write(b) }
func (p *pipeWriter) Flush()                      {}

// errorJSON is err as google.rpc.Status JSON, {"code":5,"message":"..."}.
func errorJSON(err error) []byte {
	st := status.Convert(err)
	b, _ := json.Marshal(struct {
		Code    codes.Code `json:"code"`
		Message string     `json:"message"`
	}{st.Code(), st.Message()})
	return b
}

// writeError answers err with its HTTP status and google.rpc.Status JSON.
func writeError(w http.ResponseWriter, err error) {
	c := status.Code(err)
	writeStatus(w, httpstream.HTTPStatus(c), c, status.Convert(err).Message())
}

func writeStatus(w http.ResponseWriter, httpCode int, c codes.Code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(httpCode)
	_, _ = w.Write(append(errorJSON(status.Error(c, msg)), '\n'))
}
