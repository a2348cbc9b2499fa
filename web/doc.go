// Package web is the rack's web page: plain HTML, CSS and JavaScript
// embedded with go:embed (no build toolchain, no CDN: it works on an
// isolated provisioning network). The page reads and acts through the
// appliance's REST API (package rest, under /v1/ on the same listener),
// sending the caller's bearer token on every call, so the same
// authentication, roles, limits and audit apply to the page as to the CLI:
// a viewer's accept is refused by the same interceptor with the same
// PermissionDenied (403). Answers are protojson (lowerCamel fields, enums
// by name), errors {"code":N,"message":...}; every string reaches the DOM
// as text, never markup (serials and facts come from the boot LAN).
//
// The page keeps the token in sessionStorage and sends it as
// "Authorization: Bearer"; nothing sets cookies, so there is no ambient
// credential for another site to ride (no CSRF surface). Every response
// of this package carries a strict Content-Security-Policy (scripts and
// styles only from this origin, nothing inline), X-Frame-Options DENY
// and, for /api/, Cache-Control no-store.
//
// This package serves only what REST cannot. /api/whoami tells the page
// the caller's role (through Config.Role, a hook the appliance wires to
// its token store; no RPC tells a token its role) and, for each action
// the page offers, whether that role may do it according to the RPC's
// access option, with the refusal in words ("Your token's role (viewer)
// cannot accept machines; an operator token can."); the page hides what
// the role cannot do and says a 403 in those words. It grants nothing:
// the API still decides every call.
//
// Streams (/v1/watch/...) are newline-delimited JSON, a line
// {"result":<event>} each, read with fetch and a ReadableStream
// (EventSource cannot send a header). A Watch RPC the appliance does not
// implement answers 501 before any line (a missing route 404), and the
// page falls back to polling the List call.
//
// A machine's console is a WebSocket, /api/console/{name}, bridged to
// ConsoleService.Attach (a bidirectional stream REST cannot carry) over
// Config.Conn: its first message carries the token (a page cannot set a
// header on a WebSocket), its Origin must be the page's own, and the page
// shows it in xterm.js, vendored under assets/xterm (docs/architecture.md,
// "The console on the web page").
//
// It imports only the generated API (and gRPC, protobuf,
// golang.org/x/net/websocket, the standard library); package appliance
// serves it and package rest over TLS with the appliance's certificate
// and bounds the HTTP server.
package web
