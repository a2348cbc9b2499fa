package web

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	consolev1 "github.com/corralhq/corral/api/console/v1"
	"github.com/corralhq/corral/internal/httpstream"
	"golang.org/x/net/websocket"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Console socket limits.
const (
	// maxConsoleIn caps one message from the browser: the opening JSON
	// or a burst of keys (a paste is cut into messages this size by the
	// page).
	maxConsoleIn = 4 << 10
	// consoleOpenWait is how long the socket waits for the opening
	// message before it closes.
	consoleOpenWait = 10 * time.Second
	// DefaultConsoleKeepalive is how often an open console socket is
	// pinged (Config.ConsoleKeepalive).
	DefaultConsoleKeepalive = 30 * time.Second
)

// consoleDeadAfter is how long a console socket may stay silent (no
// keys, no answer to a ping) before it is taken for dead and closed: two
// pings missed and half an interval more.
func consoleDeadAfter(keepalive time.Duration) time.Duration { return keepalive*2 + keepalive/2 }

// consoleFrame reads one message from the browser with its kind: text
// is keys, binary an answer to a ping.
var consoleFrame = websocket.Codec{
	Unmarshal: func(data []byte, payloadType byte, v any) error {
		f := v.(*browserFrame)
		f.keys, f.pong = string(data), payloadType == websocket.BinaryFrame
		return nil
	},
}

type browserFrame struct {
	keys string
	pong bool
}

// consoleOpen is the browser's first message on a console socket: its
// bearer token (a WebSocket cannot carry an Authorization header from a
// page) and the mode. Read-only unless write is asked; take takes the
// write seat from its holder.
type consoleOpen struct {
	Token string `json:"token"`
	Write bool   `json:"write"`
	Take  bool   `json:"take"`
}

// consoleEvent is a text message to the browser: an event of the console
// (attached, live, write-taken, link-down, link-up), a ping the page
// answers with a binary message (the keepalive), or the status that ended
// the socket.
type consoleEvent struct {
	Event  string    `json:"event,omitempty"`
	Detail string    `json:"detail,omitempty"`
	Error  *apiError `json:"error,omitempty"`
}

// console serves GET /api/console/{name} (a machine's console) and GET
// /api/vms/{name}/console (a virtual machine's): a WebSocket bridged to
// ConsoleService.Attach as the caller. Binary messages to the browser are
// the machine's output, text messages JSON events; text messages from the
// browser after the opening one are keys for the machine, binary ones its
// answers to the keepalive's pings. The socket is refused unless its
// Origin is this page's own; the token travels in the opening message and
// every Attach carries it, so the API authenticates, authorizes (an
// operator's role) and audits the browser's caller.
func (h *Handler) console(vm bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		name, err := pathName(r)
		if err != nil {
			writeError(w, err)
			return
		}
		if !sameOrigin(r) {
			writeError(w, status.Error(codes.PermissionDenied, "a console socket must come from this page (Origin does not match the host)"))
			return
		}
		target := &consolev1.ConsoleOpen{Machine: name}
		if vm {
			target = &consolev1.ConsoleOpen{Vm: name}
		}
		srv := websocket.Server{
			// sameOrigin checked the Origin above; the library's own check
			// only parses it.
			Handshake: func(*websocket.Config, *http.Request) error { return nil },
			Handler:   func(ws *websocket.Conn) { h.bridge(r.Context(), ws, target) },
		}
		srv.ServeHTTP(w, r)
	}
}

// sameOrigin reports whether the request's Origin is https://Host (the
// page's own): a socket opened by another site's page is refused.
func sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" || len(r.Header.Values("Origin")) > 1 {
		return false
	}
	u, err := url.Parse(o)
	if err != nil || u.Path != "" || u.User != nil {
		return false
	}
	scheme := "https"
	if r.TLS == nil {
		scheme = "http"
	}
	return u.Scheme == scheme && strings.EqualFold(u.Host, r.Host)
}

// bridge runs one console socket until either side ends. Every
// keepalive interval it pings the page (a text event the page answers
// with an empty binary message); a socket silent for consoleDeadAfter is
// closed, so a browser that vanished without closing (a laptop shut, a
// network gone) does not hold its viewer seat, or the write side, for
// ever.
func (h *Handler) bridge(ctx context.Context, ws *websocket.Conn, target *consolev1.ConsoleOpen) {
	name := target.GetMachine() + target.GetVm()
	defer ws.Close()
	ws.MaxPayloadBytes = maxConsoleIn
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	fail := func(err error) {
		_, body := errorBody(err)
		_ = ws.SetWriteDeadline(time.Now().Add(writeStall))
		_ = websocket.JSON.Send(ws, consoleEvent{Error: &body}) // the socket closes next either way
	}

	_ = ws.SetReadDeadline(time.Now().Add(consoleOpenWait))
	var open consoleOpen
	if err := websocket.JSON.Receive(ws, &open); err != nil {
		fail(status.Errorf(codes.InvalidArgument, "the console socket's first message must be {\"token\":...}: %v", err))
		return
	}
	_ = ws.SetReadDeadline(time.Time{})
	o, err := tokenCredentials(open.Token)
	if err != nil {
		fail(err)
		return
	}
	mode := consolev1.ConsoleMode_CONSOLE_MODE_READ_ONLY
	if open.Write {
		mode = consolev1.ConsoleMode_CONSOLE_MODE_WRITE
	}
	stream, err := consolev1.NewConsoleServiceClient(h.cfg.Conn).Attach(ctx, o)
	if err == nil {
		err = stream.Send(&consolev1.ConsoleInput{Input: &consolev1.ConsoleInput_Open{Open: &consolev1.ConsoleOpen{
			Machine: target.GetMachine(), Vm: target.GetVm(), Mode: mode, Take: open.Take && open.Write}}})
	}
	if err != nil {
		h.log.Info("web console attach failed", "console", name, "err", err)
		fail(err)
		return
	}

	// Keys: the browser's text messages go to the machine; any message
	// shows the page alive. The stream's send side is this goroutine's
	// alone.
	keepalive := h.cfg.ConsoleKeepalive
	go func() {
		defer cancel()
		for {
			_ = ws.SetReadDeadline(time.Now().Add(consoleDeadAfter(keepalive)))
			var f browserFrame
			if err := consoleFrame.Receive(ws, &f); err != nil {
				if ctx.Err() == nil && !errors.Is(err, io.EOF) {
					h.log.Info("web console socket silent or broken: closed", "console", name, "err", err)
				}
				_ = stream.CloseSend()
				return
			}
			if f.pong || f.keys == "" {
				continue
			}
			if err := stream.Send(&consolev1.ConsoleInput{Input: &consolev1.ConsoleInput_Data{Data: []byte(f.keys)}}); err != nil {
				return
			}
		}
	}()
	// Pings: text events, sent under the socket's write lock as the
	// output below is.
	go func() {
		t := time.NewTicker(keepalive)
		defer t.Stop()
		ping, _ := json.Marshal(consoleEvent{Event: "ping"})
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			_ = ws.SetWriteDeadline(time.Now().Add(writeStall))
			if websocket.Message.Send(ws, string(ping)) != nil {
				cancel()
				return
			}
		}
	}()

	// Output and events: this goroutine alone writes the socket.
	for {
		out, err := stream.Recv()
		if err != nil {
			if !errors.Is(err, io.EOF) && ctx.Err() == nil {
				h.log.Info("web console ended", "console", name, "err", err)
				fail(err)
			}
			return
		}
		_ = ws.SetWriteDeadline(time.Now().Add(writeStall))
		if len(out.GetData()) > 0 {
			if err := websocket.Message.Send(ws, out.GetData()); err != nil {
				return
			}
		}
		if ev := out.GetEvent(); ev != consolev1.ConsoleEvent_CONSOLE_EVENT_UNSPECIFIED {
			word := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(ev.String(), "CONSOLE_EVENT_"), "_", "-"))
			b, _ := json.Marshal(consoleEvent{Event: word, Detail: out.GetDetail()})
			if err := websocket.Message.Send(ws, string(b)); err != nil {
				return
			}
		}
	}
}

// writeStall cuts a console socket whose reader takes nothing for this
// long (the REST watches use httpstream.WriteStall too).
const writeStall = httpstream.WriteStall
