// Package http serves the HTTP half of network boot: /boot.ipxe renders a
// machine's iPXE script from its boot intent (with a short-lived per-boot
// agent token, the appliance endpoints — this one first, then its peers in
// a fleet —, the CA fingerprint and the boot MAC on the kernel command
// line), /images/<name> streams catalog
// artifacts with Range support and sendfile, and /os-images/<sha256> the
// READY operating-system images (images/osimage) the same way. Every script and artifact is
// recorded on the machine's boot timeline; anything else is refused with a
// clear status and a log line.
//
// The boot LAN is hostile and the script is plain HTTP: whoever asks for
// a MAC's script reads its token. So:
//   - the token is bound to the MAC and its machine and good for nothing
//     else (auth.Tokens.IssueBoot; the agent edge enforces it), and
//     asking again returns the same token while it lives: re-requesting a
//     script never revokes a booting machine's token, and costs no store
//     write;
//   - the hypervisor script carries no token (the hypervisor boot never
//     uses one: the node authenticates with its certificate);
//   - scripts are rate-limited per source address and per MAC
//     (ScriptLimits; 429 with Retry-After);
//   - with corrald's DHCP in full mode (Config.Leases), a MAC's script goes
//     only to the address leased to that MAC (403 otherwise); relayed
//     clients are leased their real source address, so they pass. In proxy
//     and off modes there is no lease to check: any address may fetch any
//     known MAC's script, within the rate limits.
//
// It must not be imported from anything reachable by cmd/corral-node.
package http

import (
	"bytes"
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/corralhq/corral/agent/cmdline"
	inventoryv1 "github.com/corralhq/corral/api/inventory/v1"
	"github.com/corralhq/corral/images"
	"github.com/corralhq/corral/internal/apierr"
	"github.com/corralhq/corral/internal/lograte"
	"github.com/corralhq/corral/internal/termsafe"
)

// Inventory is what the server needs to know about machines.
type Inventory interface {
	// BootIntent says what mac boots; name is "" for an unknown MAC.
	BootIntent(ctx context.Context, mac string) (name string, intent inventoryv1.BootIntent, err error)
	// EnsureMachineForMAC creates a DISCOVERED machine for an unknown MAC.
	EnsureMachineForMAC(ctx context.Context, mac string) (*inventoryv1.Machine, bool, error)
}

// Commissioning is what an Inventory may also say: whether mac's machine
// has commissioning pending (inventory.Inventory does). Its discovery boot
// then gets the commissioning overlay as a second initrd, which the kernel
// unpacks over the discovery image's.
type Commissioning interface {
	CommissionPending(ctx context.Context, mac string) bool
}

// TokenIssuer issues per-boot agent tokens (auth.Tokens.IssueBoot): the
// live token of mac bound to machine, the same one again while it lives
// (minted says a new one was made).
type TokenIssuer interface {
	IssueBoot(ctx context.Context, mac, machine string, ttl time.Duration) (token string, minted bool, err error)
}

// Leases says which MAC holds an address: corrald's DHCP leases in full
// mode (appliance reads them from the store).
//
// LeaseHolder fails with ErrNoLeaseRule when corrald hands out no leases
// of addr's family (IPv4 in proxy mode with DHCPv6 on): the script is then
// not held to a lease.
type Leases interface {
	// LeaseHolder returns the MAC (lower-case colon form) holding a live
	// lease on addr; ok is false when no client does.
	LeaseHolder(ctx context.Context, addr netip.Addr) (mac string, ok bool, err error)
}

// ErrNoLeaseRule is LeaseHolder's answer for an address whose family
// corrald hands out no leases of.
var ErrNoLeaseRule = errors.New("boot/http: no DHCP leases of this address family")

// NoToken is the corral.token value of scripts whose boot needs no token
// (the hypervisor image): agent/cmdline requires the parameter, and the
// hypervisor boot ignores it.
const NoToken = "none"

// Recorder appends to a MAC's boot timeline (inventory.Event).
type Recorder interface {
	Event(mac, source, event, detail string, attrs map[string]string)
}

// Catalog is what the server needs of images.Catalog.
type Catalog interface {
	Has(name string) bool
	Lookup(name string) (images.Artifact, bool)
	Open(name string) (*os.File, images.Artifact, error)
}

// Config configures a Server.
type Config struct {
	// Listen is the TCP address (default ":8080"). Listener, when set, is
	// used instead.
	Listen   string
	Listener net.Listener
	Catalog  Catalog
	// Inventory, Tokens and Timeline are required.
	Inventory Inventory
	Tokens    TokenIssuer
	Timeline  Recorder
	// CreateUnknown makes /boot.ipxe create a DISCOVERED machine for a MAC
	// it has never seen (used when corrald's DHCP is off and another DHCP
	// server points iPXE here). Otherwise unknown MACs are refused: they
	// must have been seen by boot/dhcp first.
	CreateUnknown bool
	// APIEndpoint is the gRPC endpoint put on the kernel command line,
	// host:port. An empty host means the host iPXE used to reach us.
	APIEndpoint string
	// PeerEndpoints, when set, returns the API endpoints (host:port) of
	// the other live appliances of the fleet; corral.endpoint lists them
	// after APIEndpoint, so the agent can fail over. It is called for every
	// script and must not block long (the request's context bounds it).
	// Repeats, APIEndpoint itself and invalid entries are left out, and the
	// list is cut to agent/cmdline's MaxEndpoints and to what fits the
	// kernel command-line budget (the script's timeline entry counts what
	// was left out). Nil: no peers.
	PeerEndpoints func(ctx context.Context) []string
	// CAFingerprint is the SHA-256 of the appliance CA (pki.Fingerprint).
	CAFingerprint string
	// TokenTTL is the per-boot token lifetime (default 1h, at least 1s).
	TokenTTL time.Duration
	// Leases, when set (full DHCP mode), restricts a MAC's script to the
	// address leased to that MAC.
	Leases Leases
	// Scripts rate-limit /boot.ipxe per MAC and per source address.
	Scripts ScriptLimits
	// Now is the clock of the rate limits (default time.Now).
	Now func() time.Time
	// KernelArgs are extra kernel arguments (default
	// DefaultKernelArgs). arm64 machines get them followed by
	// ARM64KernelArgs, or ARM64KernelArgs alone when KernelArgs is unset.
	KernelArgs string
	Logger     *slog.Logger
	// Limits bound clients' connections and timeouts (limits.go).
	Limits Limits
	// Observer, when set, is told every request's outcome (corrald's
	// metrics).
	Observer Observer
	// OSImages, when set, serves READY operating-system images at
	// /os-images/<sha256> (images/osimage); nil: that path is 404.
	OSImages OSImages
	// PhoneHome, when set, serves /phone-home/ (the deployed OS's
	// phone-home: lifecycle's handler); nil: that path is 404.
	PhoneHome http.Handler
}

// OSImages is what the server needs of the OS image store (images/osimage):
// the stored content of a READY image by its SHA-256 (Open), and its raw
// view (OpenRaw: the disk's bytes, qcow2 converted as they are read) and
// that view's size. Both return an error of class apierr.ErrNotFound for
// content they do not serve and apierr.ErrInvalid for a malformed sum;
// the caller closes what they open. The server may call them from many
// goroutines at once.
type OSImages interface {
	Open(sum string) (*os.File, images.Artifact, error)
	OpenRaw(sum string) (io.ReadSeekCloser, int64, error)
}

// Observer is told every request's route class (RouteScript, RouteImage,
// RouteOther), status code and body bytes once it is answered (corrald
// counts them for /metrics): never a MAC, an address or a raw path.
// Request must be quick and safe for concurrent use.
type Observer interface {
	Request(route string, code int, bytes int64, took time.Duration)
}

// Route classes given to Observer.
const (
	RouteScript  = "script"   // /boot.ipxe, /boot.grub
	RouteImage   = "image"    // /images/<name>
	RouteOSImage = "os-image" // /os-images/<sha256> and /os-images/<sha256>/raw
	RouteOther   = "other"    // anything else (404)
)

// Server is the boot HTTP server.
type Server struct {
	cfg Config
	log *slog.Logger
	lis net.Listener
	// arm64Args are what arm64 command lines end in (ARM64KernelArgs,
	// after Config.KernelArgs when the operator set them).
	arm64Args string
	srv       *http.Server

	macs, addrs *budgets      // script budgets
	refusals    *lograte.Gate // refusal log lines
}

// New validates cfg and binds the listener.
func New(cfg Config) (*Server, error) {
	if cfg.Catalog == nil || cfg.Inventory == nil || cfg.Tokens == nil || cfg.Timeline == nil {
		return nil, errors.New("boot/http: Catalog, Inventory, Tokens and Timeline are required")
	}
	if cfg.Listen == "" {
		cfg.Listen = ":8080"
	}
	if cfg.TokenTTL == 0 {
		cfg.TokenTTL = time.Hour
	}
	if cfg.TokenTTL < time.Second {
		return nil, fmt.Errorf("boot/http: token TTL %s: must be at least 1s", cfg.TokenTTL)
	}
	if err := cfg.Scripts.Validate(); err != nil {
		return nil, err
	}
	cfg.Scripts = cfg.Scripts.WithDefaults()
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	arm64Args := strings.TrimSpace(cfg.KernelArgs + " " + ARM64KernelArgs)
	if cfg.KernelArgs == "" {
		cfg.KernelArgs = DefaultKernelArgs
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, arm64Args: arm64Args,
		macs:     newBudgets(cfg.Scripts.MACBurst, cfg.Scripts.MACInterval, cfg.Scripts.MaxTracked),
		addrs:    newBudgets(cfg.Scripts.AddrBurst, cfg.Scripts.AddrInterval, cfg.Scripts.MaxTracked),
		refusals: lograte.NewGate(time.Second, 10)}
	s.lis = cfg.Listener
	if s.lis == nil {
		l, err := net.Listen("tcp", cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("boot/http: listen %s: %w", cfg.Listen, err)
		}
		s.lis = l
	}
	s.lis = cfg.Limits.listener(s.lis, cfg.Logger)
	s.srv = cfg.Limits.server(s, cfg.Logger)
	return s, nil
}

// Addr is the bound address.
func (s *Server) Addr() net.Addr { return s.lis.Addr() }

// Run serves until ctx ends, then shuts down gracefully (5 s at most for
// transfers in flight) and returns nil.
func (s *Server) Run(ctx context.Context) error {
	s.log.Info("serving boot HTTP", "addr", s.lis.Addr().String())
	return serveUntil(ctx, s.srv, s.lis, s.log, "boot/http")
}

// serveUntil serves srv on lis until ctx ends, then shuts it down
// gracefully (5 s at most for transfers in flight) and returns nil; an
// error that ends serving first is returned, prefixed with what.
func serveUntil(ctx context.Context, srv *http.Server, lis net.Listener, log *slog.Logger, what string) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	select {
	case err := <-errc:
		return fmt.Errorf("%s: %w", what, err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Warn("boot HTTP server ended badly during shutdown", "listener", what, "err", err)
	}
	return nil
}

// GRUBPath is the per-machine GRUB config of arm64 machines (the URL
// boot/dhcp sends them in option 17).
const GRUBPath = "/boot.grub"

// localHostPort is the address r arrived on, as host:port: GRUB's http
// module fetches the kernel from there (its Host header may lack the
// port).
func localHostPort(r *http.Request) string {
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		if ap, err := netip.ParseAddrPort(a.String()); err == nil {
			return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()).String()
		}
	}
	return r.Host
}

// ServeHTTP routes /boot.ipxe, /boot.grub and /images/<name>; everything
// else is 404.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	route := RouteOther
	if s.cfg.Observer != nil {
		start := time.Now()
		cw := &countingWriter{ResponseWriter: w}
		w = cw
		defer func() {
			code := cmp.Or(cw.status, http.StatusOK)
			s.cfg.Observer.Request(route, code, cw.n, time.Since(start))
		}()
	}
	switch {
	case r.URL.Path == "/boot.ipxe":
		route = RouteScript
		s.script(w, r)
	case r.URL.Path == GRUBPath:
		route = RouteScript
		s.boot(w, r, RenderGRUBARM64, "GRUB config (arm64)", "script")
	case strings.HasPrefix(r.URL.Path, "/images/"):
		route = RouteImage
		s.artifact(w, r, strings.TrimPrefix(r.URL.Path, "/images/"))
	case strings.HasPrefix(r.URL.Path, "/phone-home/") && s.cfg.PhoneHome != nil:
		s.cfg.PhoneHome.ServeHTTP(w, r)
	case strings.HasPrefix(r.URL.Path, "/os-images/") && s.cfg.OSImages != nil:
		route = RouteOSImage
		s.osImage(w, r, strings.TrimPrefix(r.URL.Path, "/os-images/"))
	default:
		s.refuse(w, r, "", http.StatusNotFound, "no such path: this server serves /boot.ipxe?mac=..., /images/<name>, /os-images/<sha256> and /os-images/<sha256>/raw")
	}
}

// refuse answers with status and a one-line reason, logs it (at most ten
// lines a second; the suppressed ones are counted in the next) and, when
// the MAC is known, records it on the timeline.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, mac string, status int, reason string) {
	s.refuseNote(w, r, mac, status, reason, mac != "")
}

// refuseNote is refuse; note says whether to put it on the timeline.
func (s *Server) refuseNote(w http.ResponseWriter, r *http.Request, mac string, status int, reason string, note bool) {
	// The path is the client's to choose (decoded: %1b is ESC): its
	// control characters are escaped before the log and the timeline.
	path := termsafe.Escape(r.URL.Path)
	if n, ok := s.refusals.Allow(); ok {
		s.log.Warn("boot http request refused", "peer", r.RemoteAddr, "method", r.Method, "path", path, "mac", mac, "status", status, "reason", reason, "suppressed", n)
	}
	if note && mac != "" {
		s.cfg.Timeline.Event(mac, "http", "http-refused", reason, map[string]string{"path": path, "status": strconv.Itoa(status), "peer": peerIP(r)})
	}
	http.Error(w, "corral: "+reason, status)
}

func peerIP(r *http.Request) string {
	h, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return h
}

// normalizeMAC parses a 6-byte MAC (any common notation) to lower-case
// colon form.
func normalizeMAC(s string) (string, error) {
	hw, err := net.ParseMAC(strings.TrimSpace(s))
	if err != nil || len(hw) != 6 {
		return "", fmt.Errorf("%q is not a 6-byte MAC address", s)
	}
	return hw.String(), nil
}

//go:embed script.ipxe.tmpl
var scriptText string

var scriptTmpl = template.Must(template.New("script").Parse(scriptText))

// DefaultKernelArgs are amd64 machines' extra kernel arguments when
// Config.KernelArgs is unset: the screen and the first 16550 UART.
const DefaultKernelArgs = "console=tty0 console=ttyS0,115200n8"

// ARM64KernelArgs end an arm64 machine's command line: arm64's first
// serial port (PL011, SBSA) is ttyAMA0, and the last console= is
// /dev/console. DefaultKernelArgs are not used there: u-root's init copies
// the agent's output to every console= tty, and on arm64 (QEMU's virt
// machine) ttyS0 is a placeholder 8250 port with no UART behind it whose
// writes never drain, so the agent stalled after its first line
// (docs/architecture.md, "arm64").
const ARM64KernelArgs = "console=ttyAMA0,115200"

// ScriptData is what the script template sees.
type ScriptData struct {
	Intent  string // discover, local, hypervisor
	Machine string
	MAC     string
	Base    string // http://host:port
	Kernel  string // catalog name
	Initrd  string // catalog name (and the initrd= name)
	Overlay string // a second initrd's catalog name (commissioning), or ""
	Cmdline string // everything after the kernel URL
	Problem string // set when the intent cannot be served: echoed, then exit
	// Arch is "arm64" for GRUB's arm64 config (/boot.grub), else "".
	Arch string
	// Host is the host:port GRUB's http module fetches from (arm64).
	Host string
}

// RenderScript renders the iPXE script for d. It fails when the kernel
// command line would exceed the agent/cmdline budget (cmdline.MaxLen).
func RenderScript(d ScriptData) ([]byte, error) {
	if len(d.Cmdline) >= cmdline.MaxLen {
		return nil, fmt.Errorf("kernel command line is %d bytes, limit %d", len(d.Cmdline), cmdline.MaxLen)
	}
	var b bytes.Buffer
	if err := scriptTmpl.Execute(&b, d); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func intentName(i inventoryv1.BootIntent) string {
	switch i {
	case inventoryv1.BootIntent_BOOT_INTENT_LOCAL:
		return "local"
	case inventoryv1.BootIntent_BOOT_INTENT_HYPERVISOR:
		return "hypervisor"
	default:
		return "discover"
	}
}

func (s *Server) script(w http.ResponseWriter, r *http.Request) {
	s.boot(w, r, RenderScript, "script", "script")
}

// boot serves a MAC's boot instructions: the iPXE script (render
// RenderScript, what "script") or the Secure Boot chain's GRUB
// configuration (RenderGrub, "GRUB config"), under the same rules; event
// names the timeline entry.
func (s *Server) boot(w http.ResponseWriter, r *http.Request, render func(ScriptData) ([]byte, error), what, event string) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		s.refuse(w, r, "", http.StatusMethodNotAllowed, "method "+r.Method+" not allowed")
		return
	}
	raw := r.URL.Query().Get("mac")
	if raw == "" {
		s.refuse(w, r, "", http.StatusBadRequest, "mac query parameter is required: /boot.ipxe?mac=${net0/mac}")
		return
	}
	mac, err := normalizeMAC(raw)
	if err != nil {
		s.refuse(w, r, "", http.StatusBadRequest, err.Error())
		return
	}
	ctx := r.Context()
	if !s.admit(w, r, mac) {
		return
	}
	name, intent, err := s.cfg.Inventory.BootIntent(ctx, mac)
	if err != nil {
		s.log.Error("boot intent lookup failed", "mac", mac, "err", err)
		s.refuse(w, r, mac, http.StatusServiceUnavailable, "inventory unavailable")
		return
	}
	if name == "" {
		if !s.cfg.CreateUnknown {
			s.refuse(w, r, mac, http.StatusNotFound, "unknown MAC "+mac+": it has not been seen by corrald's DHCP")
			return
		}
		m, _, err := s.cfg.Inventory.EnsureMachineForMAC(ctx, mac)
		if errors.Is(err, apierr.ErrExhausted) {
			// No record, so no timeline either: a flood of spoofed MACs
			// must not grow one per MAC.
			s.refuseNote(w, r, mac, http.StatusServiceUnavailable,
				"too many discovered machines: the appliance's cap (--max-discovered) is reached; accept or delete discovered machines", false)
			return
		}
		if err != nil {
			s.log.Error("ensure machine failed", "mac", mac, "err", err)
			s.refuse(w, r, mac, http.StatusServiceUnavailable, "inventory unavailable")
			return
		}
		name, intent = m.GetName(), m.GetBootIntent()
	}
	d := ScriptData{Intent: intentName(intent), Machine: name, MAC: mac, Base: "http://" + r.Host}
	if r.URL.Path == GRUBPath {
		d.Arch, d.Host = "arm64", localHostPort(r)
	}
	mode := ""
	switch {
	case intent == inventoryv1.BootIntent_BOOT_INTENT_LOCAL:
	case d.Arch == "arm64" && intent == inventoryv1.BootIntent_BOOT_INTENT_HYPERVISOR:
		d.Kernel, d.Initrd, mode = images.ARM64Kernel, images.ARM64HypervisorInitrd, cmdline.ModeHypervisor
		if !s.cfg.Catalog.Has(d.Kernel) || !s.cfg.Catalog.Has(d.Initrd) {
			d.Kernel, d.Initrd = "", ""
			d.Problem = "the catalog has no arm64 hypervisor image (run corrald images build --arch arm64); booting the local disk"
		}
	case d.Arch == "arm64":
		d.Kernel, d.Initrd = images.ARM64Kernel, images.ARM64Initrd
		if !s.cfg.Catalog.Has(d.Kernel) || !s.cfg.Catalog.Has(d.Initrd) {
			d.Kernel, d.Initrd = "", ""
			d.Problem = "the catalog has no arm64 discovery image (run corrald images build --arch arm64)"
		}
	case intent == inventoryv1.BootIntent_BOOT_INTENT_HYPERVISOR:
		d.Kernel, d.Initrd, mode = images.DiscoverKernel, images.HypervisorInitrd, cmdline.ModeHypervisor
		if !s.cfg.Catalog.Has(d.Kernel) || !s.cfg.Catalog.Has(d.Initrd) {
			d.Kernel, d.Initrd = "", ""
			d.Problem = "the catalog has no hypervisor image (run corrald images build); booting the local disk"
		}
	default:
		d.Kernel, d.Initrd = images.DiscoverKernel, images.DiscoverInitrd
		if !s.cfg.Catalog.Has(d.Kernel) {
			d.Kernel, d.Initrd = "", ""
			d.Problem = "the catalog has no discovery kernel"
		} else if c, ok := s.cfg.Inventory.(Commissioning); ok && s.cfg.Catalog.Has(images.CommissionOverlay) && c.CommissionPending(ctx, mac) {
			d.Overlay = images.CommissionOverlay
		}
	}
	tokenNote := ""
	var listed []string // corral.endpoint
	leftOut := 0        // peer endpoints left out of it
	if d.Kernel != "" {
		tok := NoToken
		if mode != cmdline.ModeHypervisor {
			var minted bool
			tok, minted, err = s.cfg.Tokens.IssueBoot(ctx, mac, name, s.cfg.TokenTTL)
			if err != nil {
				s.log.Error("per-boot token", "mac", mac, "err", err)
				s.refuse(w, r, mac, http.StatusServiceUnavailable, "cannot issue a boot token")
				return
			}
			tokenNote = "reused"
			if minted {
				tokenNote = "minted"
			}
			tokenNote += " " + tokenID(tok)
		}
		if d.Cmdline, listed, leftOut, err = s.cmdline(r, d, tok, mode); err != nil {
			s.log.Error("kernel command line", "mac", mac, "err", err)
			s.refuse(w, r, mac, http.StatusInternalServerError, "kernel command line: "+err.Error())
			return
		}
	}
	body, err := render(d)
	if err != nil {
		s.refuse(w, r, mac, http.StatusInternalServerError, "render "+what+": "+err.Error())
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	if _, err := w.Write(body); err != nil {
		s.log.Debug("boot script not delivered", "mac", mac, "peer", peerIP(r), "err", err)
	}
	attrs := map[string]string{"intent": d.Intent, "machine": name, "bytes": strconv.Itoa(len(body)), "peer": peerIP(r)}
	if d.Kernel != "" {
		attrs["kernel"], attrs["initrd"], attrs["cmdline_bytes"] = d.Kernel, d.Initrd, strconv.Itoa(len(d.Cmdline))
	}
	if tokenNote != "" {
		attrs["token"] = tokenNote
	}
	if len(listed) > 1 || leftOut > 0 {
		// A fleet: how many appliances the agent may fail over to.
		attrs["endpoints"] = strconv.Itoa(len(listed))
	}
	if leftOut > 0 {
		attrs["endpoints_left_out"] = strconv.Itoa(leftOut)
	}
	detail := "rendered " + d.Intent + " " + what
	if d.Arch != "" {
		attrs["arch"] = d.Arch
	}
	if d.Problem != "" {
		detail += ": " + d.Problem
		attrs["problem"] = d.Problem
	}
	s.log.Info("boot "+what+" rendered", "mac", mac, "machine", name, "intent", d.Intent, "problem", d.Problem, "token", tokenNote,
		"endpoints", len(listed), "endpoints_left_out", leftOut)
	s.cfg.Timeline.Event(mac, "http", event, detail, attrs)
}

// cmdline is the kernel command line: initrd= name first (old UEFI iPXE
// needs it to match the initrd image name), then Corral's parameters in
// the agent/cmdline contract the agent parses (mode "" is the agent's
// default, discover), then the configured extras. corral.endpoint lists
// this appliance first, then its peers (endpoints); peers that do not fit
// cmdline.MaxLen are left out from the end. It returns the endpoints
// listed and how many peers were left out.
func (s *Server) cmdline(r *http.Request, d ScriptData, token, mode string) (line string, eps []string, left int, err error) {
	eps, left = s.endpoints(r)
	for {
		corral, err := cmdline.Params{Endpoints: eps, Token: token, CAFingerprint: s.cfg.CAFingerprint, MAC: d.MAC, Mode: mode}.Format()
		if err == nil {
			initrds := "initrd=" + d.Initrd
			if d.Overlay != "" {
				initrds += " initrd=" + d.Overlay
			}
			parts := []string{initrds, corral, s.cfg.KernelArgs}
			if d.Arch == "arm64" {
				// GRUB hands the initrd over itself; an initrd= would
				// make the arm64 EFI stub look for a file of that name.
				parts = []string{corral, s.arm64Args}
			}
			line = strings.Join(parts, " ")
			if len(line) < cmdline.MaxLen {
				return line, eps, left, nil
			}
			err = fmt.Errorf("kernel command line would be %d bytes, limit %d", len(line), cmdline.MaxLen)
		}
		if len(eps) == 1 {
			return "", eps, left, err
		}
		eps, left = eps[:len(eps)-1], left+1
	}
}

// endpoints is corral.endpoint's list: this appliance's API endpoint (an
// empty or unspecified host is the host iPXE used to reach us), then the
// peers' (Config.PeerEndpoints) that are valid and new, at most
// cmdline.MaxEndpoints in all. dropped counts the peers left out.
func (s *Server) endpoints(r *http.Request) (eps []string, dropped int) {
	ep := s.cfg.APIEndpoint
	if h, p, err := net.SplitHostPort(ep); err == nil && (h == "" || h == "0.0.0.0" || h == "::") {
		host := r.Host
		if hh, _, err := net.SplitHostPort(r.Host); err == nil {
			host = hh
		}
		ep = net.JoinHostPort(host, p)
	}
	eps = []string{ep}
	if s.cfg.PeerEndpoints == nil {
		return eps, 0
	}
	for _, p := range s.cfg.PeerEndpoints(r.Context()) {
		switch {
		case slices.Contains(eps, p):
		case len(eps) == cmdline.MaxEndpoints:
			dropped++
		default:
			if err := cmdline.CheckEndpoint(p); err != nil {
				if n, ok := s.refusals.Allow(); ok {
					s.log.Warn("peer endpoint left out of the kernel command line", "endpoint", p, "err", err, "suppressed", n)
				}
				dropped++
				continue
			}
			eps = append(eps, p)
		}
	}
	return eps, dropped
}

// Close releases a Server that will not Run.
func (s *Server) Close() error { return s.lis.Close() }

// admit applies the script rules that come before any lookup: the source
// address's budget, in full mode the lease (the script of mac goes only
// to the address leased to mac), then mac's budget — in that order, so
// that a client refused by its address or lease spends no budget of the
// MAC it asked for. It answers the refusal itself and returns false.
func (s *Server) admit(w http.ResponseWriter, r *http.Request, mac string) bool {
	now := s.cfg.Now()
	src := sourceAddr(r)
	if ok, retry, note := s.addrs.take(src.String(), now); !ok {
		s.tooMany(w, r, mac, "source address "+src.String(), retry, note)
		return false
	}
	if s.cfg.Leases != nil {
		holder, ok, err := s.cfg.Leases.LeaseHolder(r.Context(), src)
		switch {
		case errors.Is(err, ErrNoLeaseRule):
			// src's address family gets no leases from corrald (DHCPv4
			// in proxy mode beside DHCPv6): no lease to check.
		case err != nil:
			s.log.Error("lease lookup failed", "mac", mac, "peer", src.String(), "err", err)
			s.refuse(w, r, mac, http.StatusServiceUnavailable, "lease store unavailable")
			return false
		case !ok:
			s.refuse(w, r, mac, http.StatusForbidden, fmt.Sprintf("%s holds no DHCP lease: the script of %s is issued only to the address leased to it", src, mac))
			return false
		case holder != mac:
			s.refuse(w, r, mac, http.StatusForbidden, fmt.Sprintf("%s is leased to %s, not %s: a MAC's script is issued only to the address leased to it", src, holder, mac))
			return false
		}
	}
	if ok, retry, note := s.macs.take(mac, now); !ok {
		s.tooMany(w, r, mac, "MAC "+mac, retry, note)
		return false
	}
	if n := s.macs.takeEvicted() + s.addrs.takeEvicted(); n > 0 {
		s.log.Warn("boot script rate-limit tables full: least recently used budgets forgotten (raise --boot-script-max-tracked if this is not an attack)",
			"forgotten", n, "max", s.cfg.Scripts.MaxTracked)
	}
	return true
}

// tooMany answers 429 with Retry-After; note puts it on mac's timeline.
func (s *Server) tooMany(w http.ResponseWriter, r *http.Request, mac, who string, retry time.Duration, note bool) {
	w.Header().Set("Retry-After", retryAfter(retry))
	s.refuseNote(w, r, mac, http.StatusTooManyRequests,
		fmt.Sprintf("too many boot script requests for %s: retry in %s", who, retryAfter(retry)+"s"), note)
}

// sourceAddr is the request's peer address (IPv4-mapped addresses
// unmapped); the zero Addr when RemoteAddr does not parse.
func sourceAddr(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		a, _ := netip.ParseAddr(r.RemoteAddr)
		return a.Unmap()
	}
	return ap.Addr().Unmap()
}

// tokenID is the (public) id part of a token, for the timeline.
func tokenID(tok string) string {
	if len(tok) >= 20 && strings.HasPrefix(tok, "crl_") {
		return tok[4:20]
	}
	return ""
}
