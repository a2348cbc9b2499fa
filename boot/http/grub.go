package http

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"text/template"

	"github.com/corralhq/corral/agent/cmdline"
	"github.com/corralhq/corral/internal/termsafe"
)

// GrubConfigName is the file Debian's signed network GRUB reads its
// configuration from: its embedded configuration sources $prefix/grub.cfg,
// and its prefix is /grub on the server it was loaded from.
const GrubConfigName = "grub/grub.cfg"

//go:embed grub.cfg.tmpl
var grubText string

// localDiskText defines "localdisk", the local-disk answer both GRUB
// configurations end with (the removable-media loader's name as its dot).
//
//go:embed localdisk.grub.tmpl
var localDiskText string

var grubTmpl = template.Must(template.Must(template.New("grub").Funcs(template.FuncMap{
	"q":     grubQuote,
	"words": grubWords,
}).Parse(grubText)).Parse(localDiskText))

// grubQuote joins parts and quotes them as one GRUB script word: single
// quotes, inside which GRUB takes every byte literally but the quote
// itself, written '\” (close, escaped quote, reopen). Control bytes are
// escaped first (internal/termsafe): a newline would end the command.
func grubQuote(parts ...string) string {
	v := termsafe.Escape(strings.Join(parts, ""))
	return "'" + strings.ReplaceAll(v, "'", `'\''`) + "'"
}

// grubWords quotes each space-separated word of a kernel command line;
// GRUB's linux command joins its arguments with single spaces again. The
// initrd= words iPXE needs are left out: GRUB's initrd command hands the
// kernel its initramfs, and the EFI stub would look for those names on
// the boot device.
func grubWords(line string) string {
	var out []string
	for _, w := range strings.Fields(line) {
		if strings.HasPrefix(w, "initrd=") {
			continue
		}
		out = append(out, grubQuote(w))
	}
	return strings.Join(out, " ")
}

// RenderGrub renders the GRUB configuration of the Secure Boot chain for
// d: the same intent, kernel, initramfs and kernel command line as the
// iPXE script (RenderScript), the files fetched over TFTP from the server
// GRUB was loaded from. It fails when the kernel command line would
// exceed the agent/cmdline budget.
func RenderGrub(d ScriptData) ([]byte, error) {
	if len(d.Cmdline) >= cmdline.MaxLen {
		return nil, fmt.Errorf("kernel command line is %d bytes, limit %d", len(d.Cmdline), cmdline.MaxLen)
	}
	var b bytes.Buffer
	if err := grubTmpl.Execute(&b, d); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

//go:embed script.grub.tmpl
var grubARM64Text string

// grubARM64Tmpl is arm64 machines' GRUB configuration (/boot.grub),
// quoted as grubTmpl is.
var grubARM64Tmpl = template.Must(template.Must(template.New("grub-arm64").Funcs(template.FuncMap{
	"q":     grubQuote,
	"words": grubWords,
}).Parse(grubARM64Text)).Parse(localDiskText))

// RenderGRUBARM64 renders an arm64 machine's GRUB configuration for d
// (d.Host set): the kernel and initramfs over GRUB's http module from
// the address the request came to. It fails as RenderScript does.
func RenderGRUBARM64(d ScriptData) ([]byte, error) {
	if len(d.Cmdline) >= cmdline.MaxLen {
		return nil, fmt.Errorf("kernel command line is %d bytes, limit %d", len(d.Cmdline), cmdline.MaxLen)
	}
	var b bytes.Buffer
	if err := grubARM64Tmpl.Execute(&b, d); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// ErrGrubRefused wraps the reason a GRUB configuration was not given
// (GrubConfig): an unknown MAC, a lease rule, a rate limit, the inventory.
var ErrGrubRefused = errors.New("boot/http: GRUB configuration refused")

// GrubConfig renders the GRUB configuration of mac for the client at
// client, which reached this appliance at host (boot/tftp passes the
// TFTP request's addresses): the script's rules apply unchanged — the
// source address's and the MAC's budgets, the lease rule, the inventory's
// intent, the per-boot token — and the rendering is on mac's timeline.
// corral.endpoint names host as the script names the host iPXE used. It
// is safe for concurrent use; errors wrap ErrGrubRefused with the reason.
func (s *Server) GrubConfig(ctx context.Context, mac string, client, host netip.Addr) ([]byte, error) {
	_, port, err := net.SplitHostPort(s.lis.Addr().String())
	if err != nil {
		return nil, fmt.Errorf("boot/http: listener address: %w", err)
	}
	hostPort := net.JoinHostPort(host.Unmap().String(), port)
	r, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+hostPort+"/boot.ipxe?mac="+mac, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrGrubRefused, err)
	}
	r.RemoteAddr = netip.AddrPortFrom(client.Unmap(), 0).String()
	w := &memWriter{h: http.Header{}}
	s.boot(w, r, RenderGrub, "GRUB config", "grub-config")
	if w.status != 0 && w.status != http.StatusOK {
		return nil, fmt.Errorf("%w: %s", ErrGrubRefused, strings.TrimSpace(strings.TrimPrefix(w.b.String(), "corral: ")))
	}
	return w.b.Bytes(), nil
}

// memWriter is the http.ResponseWriter GrubConfig renders into.
type memWriter struct {
	h      http.Header
	status int
	b      bytes.Buffer
}

func (m *memWriter) Header() http.Header { return m.h }

func (m *memWriter) WriteHeader(code int) {
	if m.status == 0 {
		m.status = code
	}
}

func (m *memWriter) Write(p []byte) (int, error) { return m.b.Write(p) }
