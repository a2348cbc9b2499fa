// Package httpstream writes a stream of events (a Watch RPC's) to an HTTP
// response: the first-event wait, the keepalive on an idle stream, the
// write stall that cuts a reader taking nothing, and batching of bursts.
// The web page's JSON watches and the REST API's watches (NDJSON or
// server-sent events) share it; the framing is the caller's. It imports
// nothing of ours.
package httpstream

import (
	"context"
	"errors"
	"io"
	"net/http"
	"time"
)

// Stream timing.
const (
	// FirstEventWait is how long a stream waits for its first event before
	// answering 200 anyway: a watch from a revision with nothing newer
	// has nothing to send, and a status (Unimplemented, OutOfRange,
	// PermissionDenied) comes before any event.
	FirstEventWait = 2 * time.Second
	// KeepaliveEvery writes Format.Keepalive on an idle stream, so a dead
	// reader is noticed by a failing write and proxies keep the connection.
	KeepaliveEvery = 25 * time.Second
	// WriteStall cuts a stream whose reader takes nothing for this long.
	WriteStall = 30 * time.Second
	// ahead is how many frames the pump may hold ready for the writer,
	// and flushAfter how many bytes the writer writes before it flushes
	// while more are ready: a burst (a watch's initial list of thousands
	// of machines) goes out in large writes, a lone event at once.
	ahead      = 32
	flushAfter = 64 << 10
)

// Next returns a stream's next frame, already encoded, or the error that
// ended it (io.EOF at a clean end). It is called from one goroutine.
type Next func() ([]byte, error)

// Format is how a stream is framed.
type Format struct {
	// ContentType of the 200 answer.
	ContentType string
	// Keepalive is written on an idle stream (and as the first bytes when
	// no event came within FirstEventWait).
	Keepalive []byte
	// Refuse answers err when it ends the stream before anything was
	// written (the HTTP status is then the error's).
	Refuse func(w http.ResponseWriter, err error)
	// Last is the final frame for err when it ends a started stream.
	Last func(err error) []byte
	// Failed, if set, is told of every error but a clean end.
	Failed func(err error)
}

// Serve pumps next to w until the stream ends, ctx is done, or a write
// fails or stalls. It blocks. next is called from a goroutine Serve waits
// for before it returns, after calling cancel (which must end ctx): next
// must return once ctx is done.
func Serve(ctx context.Context, cancel context.CancelFunc, w http.ResponseWriter, next Next, f Format) {
	type item struct {
		b   []byte
		err error
	}
	items := make(chan item, ahead) // the pump waits for the writer
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			b, err := next()
			select {
			case items <- item{b, err}:
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
		w.Header().Set("Content-Type", f.ContentType)
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("X-Accel-Buffering", "no")
		w.WriteHeader(http.StatusOK)
		started = true
	}
	unflushed := 0
	// write writes b and flushes unless more frames are ready and less
	// than flushAfter bytes are waiting.
	write := func(b []byte) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(WriteStall))
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
	first := time.NewTimer(FirstEventWait)
	defer first.Stop()
	keepalive := time.NewTicker(KeepaliveEvery)
	defer keepalive.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-first.C:
			if !started {
				start()
				if !write(f.Keepalive) {
					return
				}
			}
		case <-keepalive.C:
			if started && !write(f.Keepalive) {
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
				if f.Failed != nil {
					f.Failed(it.err)
				}
				if !started {
					f.Refuse(w, it.err)
					return
				}
				write(f.Last(it.err))
				return
			}
			if !started {
				start()
			}
			if !write(it.b) {
				return
			}
		}
	}
}
