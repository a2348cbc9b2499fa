package web

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Stream timing.
const (
	// firstEventWait is how long a stream waits for its first event before
	// answering 200 anyway: a watch from a revision with nothing newer
	// has nothing to send, and a status (Unimplemented, OutOfRange,
	// PermissionDenied) comes before any event.
	firstEventWait = 2 * time.Second
	// keepaliveEvery writes an empty line on an idle stream, so a dead
	// browser is noticed by a failing write and proxies keep the
	// connection.
	keepaliveEvery = 25 * time.Second
	// writeStall cuts a stream whose reader takes nothing for this long.
	writeStall = 30 * time.Second
	// streamAhead is how many events the pump may hold ready for the
	// writer, and flushAfter how many bytes the writer writes before it
	// flushes while more are ready: a burst (a watch's initial list of
	// thousands of machines) goes out in large writes, a lone event at
	// once.
	streamAhead = 32
	flushAfter  = 64 << 10
)

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

		type item struct {
			m   proto.Message
			err error
		}
		items := make(chan item, streamAhead) // the pump waits for the writer: streamAhead events in hand at most
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				m, err := nx()
				select {
				case items <- item{m, err}:
				case <-ctx.Done():
					return
				}
				if err != nil {
					return
				}
			}
		}()
		defer func() { cancel(); <-done }()

		rc := http.NewResponseController(w)
		started := false
		start := func() {
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.Header().Set("X-Accel-Buffering", "no")
			w.WriteHeader(http.StatusOK)
			started = true
		}
		unflushed := 0
		// write writes b and flushes unless more events are ready and
		// less than flushAfter bytes are waiting.
		write := func(b []byte) bool {
			_ = rc.SetWriteDeadline(time.Now().Add(writeStall))
			if _, err := w.Write(b); err != nil {
				return false
			}
			unflushed += len(b)
			if len(items) > 0 && unflushed < flushAfter {
				return true
			}
			unflushed = 0
			return rc.Flush() == nil
		}
		first := time.NewTimer(firstEventWait)
		defer first.Stop()
		keepalive := time.NewTicker(keepaliveEvery)
		defer keepalive.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-first.C:
				if !started {
					start()
					if !write([]byte("\n")) {
						return
					}
				}
			case <-keepalive.C:
				if started && !write([]byte("\n")) {
					return
				}
			case it := <-items:
				if errors.Is(it.err, io.EOF) {
					if !started {
						start()
					}
					return
				}
				if it.err != nil {
					if status.Code(it.err) != codes.Canceled {
						h.logFailure(r, it.err)
					}
					if !started {
						writeError(w, it.err)
						return
					}
					_, body := errorBody(it.err)
					b, _ := json.Marshal(struct {
						Error apiError `json:"error"`
					}{body})
					write(append(b, '\n'))
					return
				}
				if !started {
					start()
				}
				b, err := marshal.Marshal(it.m)
				if err != nil {
					h.log.Warn("web: encode watch event", "path", r.URL.Path, "err", err)
					return
				}
				if !write(append(b, '\n')) {
					return
				}
			}
		}
	}
}
