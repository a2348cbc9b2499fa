package web

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/corralhq/corral/internal/httpstream"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// writeStall cuts a console socket whose reader takes nothing for this
// long (watch streams: httpstream.WriteStall).
const writeStall = httpstream.WriteStall

// next returns a stream's next event, or the error that ended it (io.EOF
// at a clean end).
type next func() (proto.Message, error)

// recv adapts a server-streaming client to next.
func recv[T any, PT interface {
	*T
	proto.Message
}](s grpc.ServerStreamingClient[T], err error) (next, error) {
	return recvSlim[T, PT](s, err, nil)
}

// recvSlim is recv with fn applied to each event before it is sent.
func recvSlim[T any, PT interface {
	*T
	proto.Message
}](s grpc.ServerStreamingClient[T], err error, fn func(PT)) (next, error) {
	if err != nil {
		return nil, err
	}
	return func() (proto.Message, error) {
		m, err := s.Recv()
		if err != nil {
			return nil, err
		}
		if fn != nil {
			fn(PT(m))
		}
		return PT(m), nil
	}, nil
}

// opener starts one Watch RPC from rev with the caller's credentials o.
type opener func(ctx context.Context, r *http.Request, rev int64, o grpc.CallOption) (next, error)

// stream serves a Watch RPC as newline-delimited JSON: one event per line
// (the RPC's event message in protojson), empty lines as keepalives, and,
// when a status ends the stream after it started, a last line
// {"error":{"code":...,"message":...}}. A status before the first event
// is the HTTP answer instead (501 for a Watch the appliance lacks).
func (h *Handler) stream(open opener) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		o, err := callerCredentials(r)
		if err != nil {
			writeError(w, err)
			return
		}
		var rev int64
		if v := r.URL.Query().Get("from_revision"); v != "" {
			rev, err = strconv.ParseInt(v, 10, 64)
			if err != nil || rev < 0 {
				writeError(w, status.Errorf(codes.InvalidArgument, "from_revision=%.32q: want a revision (0 or more)", v))
				return
			}
		}
		select {
		case h.watches <- struct{}{}:
			defer func() { <-h.watches }()
		default:
			writeError(w, status.Errorf(codes.Unavailable, "%d watch streams are open, the most this appliance serves; poll the list instead", cap(h.watches)))
			return
		}
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		nx, err := open(ctx, r, rev, o)
		if err != nil {
			h.logFailure(r, err)
			writeError(w, err)
			return
		}
		httpstream.Serve(ctx, cancel, w, func() ([]byte, error) {
			m, err := nx()
			if err != nil {
				return nil, err
			}
			b, err := marshal.Marshal(m)
			if err != nil {
				h.log.Warn("web: encode watch event", "path", r.URL.Path, "err", err)
				return nil, status.Errorf(codes.Internal, "encode watch event: %v", err)
			}
			return append(b, '\n'), nil
		}, httpstream.Format{
			ContentType: "application/x-ndjson",
			Keepalive:   []byte("\n"),
			Refuse:      writeError,
			Last: func(err error) []byte {
				_, body := errorBody(err)
				b, _ := json.Marshal(struct {
					Error apiError `json:"error"`
				}{body})
				return append(b, '\n')
			},
			Failed: func(err error) {
				if status.Code(err) != codes.Canceled {
					h.logFailure(r, err)
				}
			},
		})
	}
}
