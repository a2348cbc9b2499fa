// Package web is the rack's web page: plain HTML, CSS and JavaScript
// embedded with go:embed (no build toolchain, no CDN: it works on an
// isolated provisioning network) and a small JSON gateway under /api/ that
// calls the appliance's own gRPC API as the caller, forwarding the
// caller's bearer token per call. The same authentication, roles, limits
// and audit therefore apply to the page as to the CLI: a viewer's accept
// is refused by the same interceptor with the same PermissionDenied.
//
// The page keeps the token in sessionStorage and sends it as
// "Authorization: Bearer"; the gateway sets no cookies, so there is no
// ambient credential for another site to ride (no CSRF surface). Every
// response carries a strict Content-Security-Policy (scripts and styles
// only from this origin, nothing inline), X-Frame-Options DENY and, for
// /api/, Cache-Control no-store.
//
// /api/whoami tells the page the caller's role (through Config.Role, a
// hook the appliance wires to its token store) and, for each action the
// page offers, whether that role may do it according to the RPC's access
// option; the page hides what the role cannot do. It grants nothing: the
// API still decides every call, and a PermissionDenied from an action is
// answered in words ("Your token's role (viewer) cannot accept machines;
// an operator token can.") instead of the RPC's name.
//
// Streams (/api/watch/...) are newline-delimited JSON read with fetch and a
// ReadableStream (EventSource cannot send a header). A Watch RPC the
// appliance does not implement answers 501 before any line, and the page
// falls back to polling the List call.
//
// A machine's console is a WebSocket, /api/console/{name}, bridged to
// ConsoleService.Attach: its first message carries the token (a page
// cannot set a header on a WebSocket), its Origin must be the page's own,
// and the page shows it in xterm.js, vendored under assets/xterm
// (docs/architecture.md, "The console on the web page").
//
// It imports only the generated API (and gRPC, protobuf,
// golang.org/x/net/websocket, the standard library); package appliance serves it over TLS with the appliance's
// certificate and bounds the HTTP server.
package web
